"""CPU numerics pinned like threads (agentrl.core.numerics, docs/numerics.md).

The teeth: under `native` the bytes of a short base cloning change when the dispatched ISA is changed from
outside (ATEN_CPU_CAPABILITY=default against avx2, both of which every supported machine runs); under `portable`
they are the same whatever the outside environment says about PyTorch's, MKL's and oneDNN's kernels. And MKL and
oneDNN, whose code paths depend on the CPU's vendor, are out of TinyAgent's bits altogether: with PyTorch's own
kernels held at AVX2, no MKL branch or oneDNN ISA changes a bit, and the bytes equal a committed digest that every
machine class must reproduce."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.core import numerics
from agentrl.core.lab_config import stage_mode
from agentrl.tracking.provenance import fingerprint

REPO = Path(__file__).resolve().parents[1]

CLONE = """
import hashlib, sys
from agentrl.core.numerics import enter
machine = enter(2, sys.argv[1])
from agentrl.core.config import BaseConfig
from agentrl.env.tasks import make_tasks
from agentrl.env.gym.tokenizer import build_tokenizer
from agentrl.starting.tinyagent import make_rl_base
tok = build_tokenizer(make_tasks("all"))
model, _ = make_rl_base(tok, make_tasks("train"), BaseConfig(steps=12, teach_steps=6, demos_per_task=4), seed=0)
print(machine["isa"], hashlib.sha256(b"".join(p.detach().numpy().tobytes() for p in model.parameters())).hexdigest())
"""
OUTSIDE = ("ATEN_CPU_CAPABILITY", "MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ONEDNN_MAX_CPU_ISA", "DNNL_MAX_CPU_ISA",
           "AGENTRL_NUMERICS", "AGENTRL_KERNELS_ISA", numerics.OUTSIDE_ENV)   # the child's outside: what a test gives


def clone(mode: str, **outside) -> tuple[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in OUTSIDE}
    env.update(outside)
    out = subprocess.run([sys.executable, "-c", CLONE, mode], capture_output=True, text=True, cwd=REPO, env=env,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    isa, digest = out.stdout.split()
    return isa, digest


FIXED = json.loads((REPO / "tests" / "fixtures" / "fixed_kernels.json").read_text())


@pytest.mark.slow   # 20 s: a base cloning in a child process per outside setting
def test_mkl_and_onednn_do_not_decide_the_bits_and_this_machine_gives_the_committed_digest():
    """MKL's least and most capable branches, oneDNN's ISA and the fixed kernels' vector path, under native numerics
    with PyTorch's own kernels at AVX2: one digest, portable's, the committed one."""
    compatible = clone("native", ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="COMPATIBLE", ONEDNN_MAX_CPU_ISA="SSE41",
                       AGENTRL_KERNELS_ISA="scalar")
    best = clone("native", ATEN_CPU_CAPABILITY="avx2", MKL_CBWR="AUTO", ONEDNN_MAX_CPU_ISA="ALL")
    assert compatible == best == ("AVX2", FIXED["clone_sha256"])


@pytest.mark.slow
def test_no_mkl_branch_onednn_isa_or_kernel_path_moves_a_bit():
    digests = {clone("native", ATEN_CPU_CAPABILITY="avx2", MKL_CBWR=mkl, ONEDNN_MAX_CPU_ISA=dnn,
                     AGENTRL_KERNELS_ISA=kernels)[1]
               for mkl, dnn, kernels in [("COMPATIBLE", "AVX2", "avx512"), ("AVX2", "AVX2", "avx2"),
                                         ("AVX512", "AVX512_CORE", "avx512"), ("SSE4_2", "SSE41", "scalar")]}
    assert digests == {FIXED["clone_sha256"]}


@pytest.mark.slow
def test_native_bytes_follow_the_dispatched_isa_and_portable_bytes_do_not():
    native_default = clone("native", ATEN_CPU_CAPABILITY="default")
    native_avx2 = clone("native", ATEN_CPU_CAPABILITY="avx2")
    assert native_default[0] == "DEFAULT" and native_avx2[0] == "AVX2"
    assert native_default[1] != native_avx2[1]     # the kernels decide the bits
    portable = {clone("portable"),
                clone("portable", ATEN_CPU_CAPABILITY="default", MKL_CBWR="AUTO", ONEDNN_MAX_CPU_ISA="ALL"),
                clone("portable", ATEN_CPU_CAPABILITY="avx512", MKL_ENABLE_INSTRUCTIONS="AVX512")}
    assert len(portable) == 1 and next(iter(portable))[0] == "AVX2"   # whatever the outside says


def test_pin_overrides_the_outside_environment(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "default")
    monkeypatch.setenv("MKL_CBWR", "AUTO")
    for key in numerics.PORTABLE_ENV:
        monkeypatch.setenv(key, os.environ.get(key, ""))
    monkeypatch.setattr(numerics, "cpu_info", lambda: {"avx2": True, "flags": {"avx2", "fma"}, "model": "x"})
    monkeypatch.delitem(sys.modules, "torch", raising=False)   # as at an entry point, before torch loads
    numerics.pin("portable")
    assert {k: os.environ[k] for k in numerics.PORTABLE_ENV} == numerics.PORTABLE_ENV


def test_pin_refuses_after_torch_loaded_with_other_kernels_and_a_machine_without_avx2(monkeypatch):
    import torch  # noqa: F401 - loaded, as in this test process
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    with pytest.raises(numerics.NumericsError, match="before torch is imported"):
        numerics.pin("portable")
    monkeypatch.setattr(numerics, "cpu_info", lambda: {"avx2": False, "flags": {"sse2"}, "model": "Old CPU"})
    with pytest.raises(numerics.NumericsError, match="portable needs a CPU with avx2"):
        numerics.pin("portable")
    with pytest.raises(numerics.NumericsError, match="run.numerics: expected one of portable, native"):
        numerics.pin("fast")


def test_this_test_process_runs_portable_numerics():
    import torch
    assert torch.backends.cpu.get_cpu_capability() == "AVX2"
    machine = numerics.machine_class()
    assert machine["mode"] == "portable" and machine["mkl"] != "none" and machine["onednn"] != "none"


def machine(**kw):
    base = {"mode": "portable", "cpu_vendor": "AuthenticAMD", "cpu_model": "AMD EPYC", "isa": "AVX2",
            "torch": "2.13.0+cpu", "mkl": "2024.2", "onednn": "3.12.0", "threads": 2, "env": {}}
    return {**base, **kw}


def test_verdict_portable_is_bit_for_bit_across_cpus_native_only_on_the_same_class():
    intel = dict(cpu_vendor="GenuineIntel", cpu_model="Xeon", isa="AVX512")
    assert numerics.reproduction_verdict(machine(), machine(**{**intel, "isa": "AVX2"}))[0] == "bit-for-bit"
    assert numerics.reproduction_verdict(machine(), machine(mkl="2025.0"))[0] == "statistical"
    assert numerics.reproduction_verdict(machine(), machine(threads=1))[0] == "statistical"
    native = machine(mode="native", isa="AVX512")
    assert numerics.reproduction_verdict(native, machine(mode="native", isa="AVX512"))[0] == "bit-for-bit"
    verdict, why = numerics.reproduction_verdict(native, machine(mode="native", **intel))
    assert verdict == "statistical" and "cpu_vendor" in why
    assert numerics.reproduction_verdict(None, machine())[0] == "unknown"


def test_the_fingerprint_covers_what_decides_bits_only():
    record = {"stage": "base", "params": {}, "threads": 2, "versions": {}, "code_hash": "x", "inputs": {}}
    amd, intel = machine(), machine(cpu_vendor="GenuineIntel", cpu_model="Xeon")
    same = [fingerprint({**record, "numerics": numerics.bits_identity(m)}) for m in (amd, intel)]
    assert same[0] == same[1]
    native = [fingerprint({**record, "numerics": numerics.bits_identity({**m, "mode": "native"})})
              for m in (amd, intel)]
    assert native[0] != native[1] and native[0] != same[0]


def test_a_native_child_of_a_portable_parent_runs_the_cpus_own_kernels(tmp_path):
    """pin("native") undoes what a portable parent pinned: the child dispatches the CPU's best ISA, its record says
    native, and the outside values the parent replaced come back (unset where there were none)."""
    import json
    repo = repr(str(Path(__file__).parents[1]))
    child = (f"import sys; sys.path.insert(0, {repo})\n"
             "from agentrl.core import numerics\n"
             "numerics.pin('native')\n"
             "import json, os, torch\n"
             "print(json.dumps({'isa': torch.backends.cpu.get_cpu_capability(),\n"
             "                  'mode': os.environ['AGENTRL_NUMERICS'],\n"
             "                  'env': {k: os.environ.get(k) for k in numerics.PORTABLE_ENV}}))\n")
    env = {k: v for k, v in os.environ.items() if k not in numerics.PORTABLE_ENV and k != numerics.OUTSIDE_ENV}
    env["OMP_DYNAMIC"] = "TRUE"   # an outside value the portable pin replaces and native must give back
    parent = (f"import os, subprocess, sys\nsys.path.insert(0, {repo})\nfrom agentrl.core import numerics\n"
              "numerics.pin('portable')\nassert os.environ['MKL_CBWR'] == 'COMPATIBLE'\n"
              f"sys.stdout.write(subprocess.run([sys.executable, '-c', {child!r}], capture_output=True, text=True,"
              " check=True).stdout)\n")
    out = json.loads(subprocess.run([sys.executable, "-c", parent], env=env, capture_output=True, text=True,
                                    check=True).stdout)
    best = "AVX512" if numerics.cpu_info()["avx512"] else "AVX2"
    assert out["isa"] == best and out["mode"] == "native"
    assert out["env"] == {k: ("TRUE" if k == "OMP_DYNAMIC" else None) for k in numerics.PORTABLE_ENV}


def test_a_lab_runs_under_its_own_numerics_and_every_other_stage_under_run_numerics(monkeypatch, tmp_path):
    params = {"run": {"numerics": "portable"},
              "lab": {"configs": {"smol": {"numerics": "native"}, "menu": {}, "derived": {"base": "smol"}}}}
    assert stage_mode(params, "lab", "smol") == "native"
    assert stage_mode(params, "lab", "derived-2") == "native"   # through its base, as DVC names it
    assert stage_mode(params, "lab", "menu") == "portable"
    assert stage_mode(params, "train", None) == "portable"
    (tmp_path / "config.yaml").write_text("base: smol\n")   # an explored recipe's file: its base's numerics
    assert stage_mode(params, "lab", f"file:{tmp_path / 'config.yaml'}") == "native"
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "stages.lab", "--lab", "smol", "--seed", "3"])
    assert numerics.running_stage() == ("lab", "smol")
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "stages.lab", "--config", "x/config.yaml"])
    assert numerics.running_stage() == ("lab", "file:x/config.yaml")
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "stages.lab"])
    monkeypatch.setenv("DVC_STAGE", "lab@menu-0")
    assert numerics.running_stage() == ("lab", "menu-0")
    monkeypatch.setattr(sys, "orig_argv", ["python", "-m", "pytest"])
    assert numerics.running_stage() == (None, None)
