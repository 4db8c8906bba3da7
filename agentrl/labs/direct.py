"""`python -m agentrl.labs.direct --lab NAME|--config FILE [--seed N] [--device cuda] [--dtype bf16] [--out DIR]`: a
lab outside DVC and MLflow, for a machine that has torch and transformers but not the tracking stack (a rented GPU
box).

The body of stage lab (stages/lab.py) without its wrapper: params.yaml read and validated by the project's loader,
the lab's numerics pinned before torch is imported and the threads set (agentrl.core.numerics.enter), `lab.device`
and the lab's `dtype` replaced in memory (params.yaml is not edited), then the same run_lab and lab_report. Writes
OUT/<lab>-seed<N>-<device>-<dtype>.{json,md}; the JSON's `direct_run` names the device, versions, numerics and the git
commit when there is one. No MLflow run and no provenance record: `audit` cannot trace these numbers to a stage,
so they are committed, if at all, beside a note of how they were made (docs/labs.md, "GPU").
"""
from __future__ import annotations

import argparse
import platform
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

from agentrl.core.lab_config import DEVICES, DTYPES


def git_commit() -> dict | None:
    """{commit, dirty} of the checkout, or None where there is no git or no repository (a copied tree)."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10)
        status = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                                text=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        return None
    if head.returncode != 0:
        return None
    return {"commit": head.stdout.strip(), "dirty": bool(status.stdout.strip())}


def run(name: str | None, config: str | None, seed: int | None, device: str, dtype: str | None, out_dir: Path,
        past_gates: bool, threads: int | None, params_path: str = "params.yaml") -> int:
    from agentrl.core.config import lab_run, load_params, read_params_file
    from agentrl.core.lab_config import stage_mode
    from agentrl.core.numerics import enter, pin
    from agentrl.labs.instance import named
    instance = name or (config and f"file:{config}")
    mode = pin(stage_mode(read_params_file(params_path), "lab", instance))   # before anything imports torch
    import agentrl.rl.variants  # noqa: F401  (registers what the rl section names)
    params = load_params(["run", "rl", "lab"], params_path)
    inst = named(params["lab"], name, config, seed)
    threads = threads or params["run"].threads
    machine = enter(threads, mode)
    import torch
    import transformers

    from agentrl.core.artifacts import DATA, write_json, write_text
    from agentrl.labs.allocator import keep_freed_memory
    from agentrl.labs.recipe import run_lab
    from agentrl.labs.report import lab_report
    from agentrl.labs.timing import SandboxShare
    run_ = lab_run(inst.name, {**inst.spec, **({"dtype": dtype} if dtype else {})})
    params = {**params, "lab": replace(params["lab"], device=device)}
    tag, start = f"{inst.name}-seed{inst.seed}-{device}-{run_.dtype}", time.time()
    keep_freed_memory()
    share = SandboxShare()
    record = run_lab(inst.name, run_, inst.seed, params, DATA / "labs" / "direct" / tag,
                     DATA / "models" / f"lab-direct-{tag}", hooks=[share], clock=share.clock, past_gates=past_gates)
    record["threads"] = threads
    if record["config"]["environment"] == "coding":
        record["sandbox"] = share.summary()
    numbers, markdown = lab_report(record)
    cuda = device == "cuda"
    numbers["direct_run"] = {
        "device_name": torch.cuda.get_device_name(0) if cuda else platform.processor() or "cpu",
        "torch": torch.__version__, "cuda": torch.version.cuda, "transformers": transformers.__version__,
        "python": platform.python_version(), "numerics": mode, "machine": machine, "threads": threads,
        "past_gates": past_gates, "git": git_commit(), "wall_s_total": round(time.time() - start, 1),
        "max_memory_allocated_mib": round(torch.cuda.max_memory_allocated() / 2**20, 1) if cuda else None}
    write_json(out_dir / f"{tag}.json", numbers)
    write_text(out_dir / f"{tag}.md", markdown)
    held = numbers["held_out"]
    gain = f" -> {held['after']['mean']:.3f} (gain {held['gain']['mean']:+.3f})" if "gain" in held else ""
    print(f"lab {tag}: held-out pass {held['before']['mean']:.3f}{gain} in {record['wall_s']:.0f} s; wrote "
          f"{out_dir / tag}.json and .md")
    if record["stopped"] and not record["stopped"]["went_on"]:
        print(f"lab {tag}: stopped before GRPO: {'; '.join(record['stopped']['reasons'])} (--past-gates goes on)",
              file=sys.stderr)
        return 3
    return 0


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentrl.labs.direct", description=__doc__.split("\n\n")[0])
    p.add_argument("--lab", help="an entry of lab.configs")
    p.add_argument("--config", help="an explored recipe's reports/labs/explored/<recipe>/config.yaml")
    p.add_argument("--seed", type=int, help="the lab's seed (default 0)")
    p.add_argument("--device", choices=DEVICES, default="cuda")
    p.add_argument("--dtype", choices=DTYPES, help="default: the lab's own")
    p.add_argument("--out", type=Path, default=Path("reports/labs/direct"))
    p.add_argument("--threads", type=int, help="default: run.threads")
    p.add_argument("--params", default="params.yaml", help="the params file (default: params.yaml)")
    p.add_argument("--past-gates", action="store_true", help="go on to GRPO when the preflight or the signal "
                   "check fails (the report says so in its first lines)")
    args = p.parse_args(argv)
    from agentrl.core.boundary import guard
    return guard("labs.direct", run, args.lab, args.config, args.seed, args.device, args.dtype, args.out,
                 args.past_gates, args.threads, args.params)


if __name__ == "__main__":
    sys.exit(main())
