"""`bench --backend hf --isa-caps`: a GEMM of the model's shapes in fp32 and in bf16 under each cap on the CPU
libraries' instruction sets, one child process per cap (each library reads its cap once, when it loads). On one
machine it shows what a lab's dtype costs on the kernels of another CPU class: why bf16 is refused where oneDNN is
capped below its bf16 kernels (agentrl.labs.precision; `portable` numerics cap it at AVX2), and how fast fp32 runs
on the kernels of a CPU without AVX-512 or bf16. The instruction set is capped, not the machine: clocks, caches and
memory stay this CPU's."""
from __future__ import annotations

import json
import os
import subprocess
import sys

from agentrl.core.numerics import NATIVE_KNOBS, OUTSIDE_ENV, PORTABLE_ENV

AVX2_CAPS = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}
CAPS = {   # name -> (the variables set in its child, whose kernels those are)
    "uncapped": ({}, "this CPU's best"),
    "onednn-avx512-bf16": ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE_BF16"}, "AVX512-BF16 without AMX (Cooper Lake, Zen 4)"),
    "onednn-avx512": ({"ONEDNN_MAX_CPU_ISA": "AVX512_CORE"}, "AVX-512 without bf16 (Skylake-SP to Ice Lake)"),
    "avx2": (AVX2_CAPS, "AVX2, no AVX-512 or bf16 (Zen 3, Intel client before Ice Lake)"),
    "portable": (PORTABLE_ENV, "run.numerics: portable (MKL's COMPATIBLE branch, AVX2)"),
}
ROWS = 2048   # tokens of an update's GEMM (a few rows of a lab's conversations)


def child_env(caps: dict) -> dict:
    """This process's environment without any numerics variable (a pin's or the user's), plus `caps`."""
    env = {k: v for k, v in os.environ.items() if k not in set(NATIVE_KNOBS) | {OUTSIDE_ENV, "AGENTRL_NUMERICS"}}
    return {**env, **caps}


def model_shapes(model_dir: str | None) -> tuple[int, int]:
    """(hidden, intermediate) of --model's config.json, else the small random-init Qwen3's."""
    if not model_dir:
        return 64, 192
    with open(os.path.join(model_dir, "config.json")) as f:
        config = json.load(f)
    return config["hidden_size"], config["intermediate_size"]


def run_caps_bench(args) -> int:
    from agentrl.core.config import UserError
    from agentrl.core.numerics import cpu_info
    from agentrl.labs.precision import BF16_FLAGS
    hidden, intermediate = model_shapes(args.model)
    threads, cpu = max(args.threads), cpu_info()
    rows = {}
    for name, (caps, _) in CAPS.items():
        out = subprocess.run([sys.executable, "-m", "agentrl.bench.caps", str(ROWS), str(hidden), str(intermediate),
                              str(threads)], capture_output=True, text=True, env=child_env(caps))
        if out.returncode != 0:
            raise UserError(f"bench --isa-caps: the {name} child failed: {out.stderr.strip().splitlines()[-1:]}")
        rows[name] = json.loads(out.stdout.strip().splitlines()[-1])
    print(f"bench hf --isa-caps: GEMM [{ROWS}, {hidden}] x [{hidden}, {intermediate}], {threads} thread(s), "
          f"{cpu['vendor']} {cpu['model']}, bf16 flags: {', '.join(sorted(BF16_FLAGS & cpu['flags'])) or 'none'}; "
          "one child process per cap, in turn (median of 5)")
    print(f"  {'cap':20} {'torch ISA':10} {'fp32 GFLOP/s':>13} {'bf16 GFLOP/s':>13} {'bf16/fp32':>10}  kernels of")
    for name, r in rows.items():
        print(f"  {name:20} {r['isa']:10} {r['fp32']:13.1f} {r['bf16']:13.1f} {r['bf16'] / r['fp32']:10.2f}  "
              f"{CAPS[name][1]}")
    if args.json:
        print(json.dumps({"threads": threads, "shape": [ROWS, hidden, intermediate], "cpu": cpu["model"],
                          "caps": {n: {**r, "env": CAPS[n][0]} for n, r in rows.items()}}))
    return 0


if __name__ == "__main__":   # the child: rows hidden intermediate threads
    import torch

    from agentrl.model.floors import gemm_gflops
    m, k, n, threads = map(int, sys.argv[1:5])
    torch.set_num_threads(threads)
    print(json.dumps({"isa": torch.backends.cpu.get_cpu_capability(),
                      "fp32": gemm_gflops(m, k, n, dtype=torch.float32),
                      "bf16": gemm_gflops(m, k, n, dtype=torch.bfloat16)}))
