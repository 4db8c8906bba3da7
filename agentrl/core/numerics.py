"""CPU numerics, pinned like threads: which kernels the CPU dispatches decides the bits of every number.

Three libraries inside torch choose their kernels from the CPU they find, and each choice changes float results
in the last digits (measured in docs/numerics.md; GRPO amplifies a 7th-digit difference into another checkpoint):

    PyTorch's own kernels   softmax, layer norm, reductions, sampling: the vectorised build picked by
                            ATEN_CPU_CAPABILITY (default: the best the CPU has, e.g. AVX512)
    MKL                     every GEMM (linear layers, attention): its code path per CPU, unless its conditional
                            numerical reproducibility branch is forced (MKL_CBWR). Only COMPATIBLE is honoured on
                            every x86-64 vendor: MKL reports CNR:AUTO for MKL_CBWR=AVX2 on an AMD CPU
    oneDNN                  the GELU eltwise kernel: JIT code for the best ISA (ONEDNN_MAX_CPU_ISA caps it)

`run.numerics: portable` (the default) pins all three to what every x86-64 machine with AVX2 and FMA runs;
`native` leaves them to the CPU (faster where MKL's own paths are, bits tied to the machine class). The mode is a
param like run.threads, hashed with them. `pin(mode)` sets the environment and must run before torch is imported
(the libraries read it once, at load or first call); `enter(threads, mode)` pins, imports torch, sets the thread
count and checks that torch dispatched what was asked. Nothing here imports torch at module level.
"""
from __future__ import annotations

import json
import os
import platform
import re
import sys

from agentrl.core.knobs import UserError

NUMERICS_MODES = ("portable", "native")
PORTABLE_ISA = "AVX2"
# what `portable` forces, whatever the outside environment says (an outside value would otherwise decide bits)
PORTABLE_ENV = {
    "ATEN_CPU_CAPABILITY": "avx2",     # PyTorch's vectorised kernels at the AVX2 level
    "MKL_CBWR": "COMPATIBLE",          # MKL's reproducible branch, the same on Intel and AMD
    "MKL_ENABLE_INSTRUCTIONS": "AVX2",  # moot under COMPATIBLE; set so no outside value can matter
    "ONEDNN_MAX_CPU_ISA": "AVX2",      # oneDNN's JIT kernels at the AVX2 level
    "DNNL_MAX_CPU_ISA": "AVX2",        # the same, under oneDNN's older name
    "MKL_DYNAMIC": "FALSE",            # MKL uses the thread count torch sets, never fewer of its own choice
    "OMP_DYNAMIC": "FALSE",
}
# the outside variables that decide bits under `native` (recorded, never changed)
NATIVE_KNOBS = tuple(PORTABLE_ENV) + ("MKL_CBWR",)
REQUIRED_FLAGS = ("avx2", "fma")
# ATEN_CPU_CAPABILITY's values on x86-64 and the CPU flags each needs (torch's own test before it dispatches; an
# unknown value is silently the best ISA, a value the CPU cannot run dies of SIGILL at the first vector kernel)
ISA_FLAGS = {"default": (), "avx2": ("avx2", "fma"), "avx512": ("avx512f", "avx512bw", "avx512vl", "avx512dq")}


class NumericsError(UserError):
    """This machine or process cannot run the numerics asked for (one line, before any compute)."""


def cpu_info() -> dict:
    """CPU vendor, model and ISA flags from /proc/cpuinfo (no torch): what decides the bits under `native`."""
    vendor, model, flags = platform.processor() or "unknown", platform.machine(), set()
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                key, _, value = line.partition(":")
                key, value = key.strip(), value.strip()
                if key == "vendor_id":
                    vendor = value
                elif key == "model name":
                    model = value
                elif key == "flags":
                    flags = set(value.split())
                    break
    except OSError:
        pass
    return {"vendor": vendor, "model": model, "avx2": {"avx2", "fma"} <= flags, "avx512": "avx512f" in flags,
            "flags": flags}


def check_outside_isa(flags: set | None = None) -> None:
    """Refuse, in one line, an outside ATEN_CPU_CAPABILITY that torch would not honour (a typo, `AVX2` in capitals:
    torch then silently takes the best ISA) or that this CPU cannot run (the process would die of SIGILL with no
    line and its MLflow run left RUNNING)."""
    value = os.environ.get("ATEN_CPU_CAPABILITY")
    if value is None:
        return
    if value not in ISA_FLAGS:
        raise NumericsError(f"ATEN_CPU_CAPABILITY={value!r}: expected one of {', '.join(ISA_FLAGS)} (lower case) or "
                            "unset (the CPU's best)")
    flags = cpu_info()["flags"] if flags is None else flags
    missing = [f for f in ISA_FLAGS[value] if f not in flags]
    if flags and missing:
        raise NumericsError(f"ATEN_CPU_CAPABILITY={value}: this CPU ({cpu_info()['model']}) lacks {', '.join(missing)}"
                            f"; unset it or set one of "
                            f"{', '.join(k for k, need in ISA_FLAGS.items() if set(need) <= flags)}")


def check_mode(mode) -> str:
    if mode not in NUMERICS_MODES:
        raise NumericsError(f"run.numerics: expected one of {', '.join(NUMERICS_MODES)}, got {mode!r}")
    return mode


OUTSIDE_ENV = "AGENTRL_NUMERICS_OUTSIDE"   # what the first portable pin found: JSON {variable: value or null}


def _restore_outside() -> None:
    """Undo a portable pin inherited from a parent process: each variable it set back to what the parent's outside
    environment held (unset where it held nothing), so that `native` is the machine's own dispatch."""
    saved = os.environ.pop(OUTSIDE_ENV, None)
    if saved is None:
        return
    for key, value in json.loads(saved).items():
        if value is None:
            os.environ.pop(key, None)
        else:
            os.environ[key] = value


def pin(mode: str = "portable") -> str:
    """Set exactly the environment of `mode` before torch is imported (idempotent), whatever a parent pinned:
    `portable` forces PORTABLE_ENV (remembering the outside values), `native` restores the outside values a
    portable parent replaced. Under `portable`, refuse a machine without AVX2/FMA in one line, and refuse a process
    that imported torch already (its kernels are chosen)."""
    check_mode(mode)
    if mode == "native":
        if "torch" in sys.modules and os.environ.get(OUTSIDE_ENV) is not None:
            raise NumericsError("run.numerics: native must be pinned before torch is imported (this process "
                                "imported it under a portable pin); call agentrl.core.numerics.pin at the entry "
                                "point")
        _restore_outside()
        check_outside_isa()
        os.environ["AGENTRL_NUMERICS"] = mode
        return mode
    cpu = cpu_info()
    if cpu["flags"] and not cpu["avx2"]:
        raise NumericsError(f"run.numerics: portable needs a CPU with {'+'.join(REQUIRED_FLAGS)} ({cpu['model']} "
                            f"has not); set run.numerics: native to run here (numbers then only statistically "
                            f"comparable)")
    if "torch" in sys.modules and any(os.environ.get(k) != v for k, v in PORTABLE_ENV.items()):
        raise NumericsError("run.numerics: portable must be pinned before torch is imported (this process imported "
                            "it first); call agentrl.core.numerics.pin at the entry point")
    if OUTSIDE_ENV not in os.environ:
        os.environ[OUTSIDE_ENV] = json.dumps({k: os.environ.get(k) for k in PORTABLE_ENV}, sort_keys=True)
    os.environ.update(PORTABLE_ENV)
    os.environ["AGENTRL_NUMERICS"] = mode
    return mode


def running_stage() -> tuple[str | None, str | None]:
    """(stage, instance) of the stage this process runs, `python -m stages.<name> [--<key> <instance>]` or DVC's
    `$DVC_STAGE` (name@instance), read from the command line, which is known before stages/__init__.py has finished
    importing."""
    argv = list(getattr(sys, "orig_argv", []))
    stage = next((argv[i + 1].split(".", 1)[1] for i, a in enumerate(argv[:-1])
                  if a == "-m" and argv[i + 1].startswith("stages.")), None)
    if stage is None:
        return None, None
    named, _, instance = os.environ.get("DVC_STAGE", "").partition("@")
    instance = instance if named == stage and instance else None
    for i, arg in enumerate(argv):   # the stage's own flag naming its instance (--lab menu, --lab=menu)
        if arg == f"--{stage}" and i + 1 < len(argv):
            instance = argv[i + 1]
        elif arg.startswith(f"--{stage}="):
            instance = arg.split("=", 1)[1]
        elif stage == "lab" and arg == "--config" and i + 1 < len(argv):   # an explored recipe's config file
            instance = "file:" + argv[i + 1]
        elif stage == "lab" and arg.startswith("--config="):
            instance = "file:" + arg.split("=", 1)[1]
    return stage, instance


def _config_version(pattern: str) -> str:
    import torch
    match = re.search(pattern, torch.__config__.show())
    return match.group(1) if match else "none"


def library_versions() -> dict:
    """torch and the kernel libraries compiled into it (MKL, oneDNN), from torch's build configuration."""
    import torch
    return {"torch": torch.__version__,
            "mkl": _config_version(r"Math Kernel Library Version ([\w.\-]+)"),
            "onednn": _config_version(r"MKL-DNN v([\w.]+)")}


def machine_class(mode: str | None = None, threads: int | None = None) -> dict:
    """What decides the bits in this process: the mode, the CPU, the ISA torch dispatched, the kernel libraries'
    versions, the pinned variables, the thread count. Imports torch (call after `pin`)."""
    import torch
    mode = mode or os.environ.get("AGENTRL_NUMERICS", "native")
    cpu = cpu_info()
    env = {k: os.environ[k] for k in sorted(set(NATIVE_KNOBS)) if k in os.environ}
    return {"mode": mode, "cpu_vendor": cpu["vendor"], "cpu_model": cpu["model"],
            "cpu_avx512": cpu["avx512"], "isa": torch.backends.cpu.get_cpu_capability(),
            **library_versions(),
            "env": env, "threads": threads if threads is not None else torch.get_num_threads()}


def bits_identity(machine: dict) -> dict:
    """The part of a machine class that decides bits: under `portable` the mode, the pinned ISA and the kernel
    libraries' versions (any AVX2 machine gives the same bytes); under `native` also the CPU and its ISA."""
    keys = ("mode", "isa", "torch", "mkl", "onednn")
    if machine.get("mode") == "native":
        keys += ("cpu_vendor", "cpu_model", "env")
    return {k: machine.get(k) for k in keys}


def enter(threads: int, mode: str = "portable") -> dict:
    """An entry point's one numerics call: pin, import torch, set threads, check the dispatch. Returns the
    machine class."""
    pin(mode)
    import torch
    torch.set_num_threads(threads)
    torch.set_flush_denormal(False)   # IEEE denormals, as every machine computes them by default
    if mode == "portable" and torch.backends.cpu.get_cpu_capability() != PORTABLE_ISA:
        raise NumericsError(f"run.numerics: portable asked for {PORTABLE_ISA} kernels but torch dispatched "
                            f"{torch.backends.cpu.get_cpu_capability()} (was torch imported before the pin?)")
    return machine_class(mode, threads)


def here_for(mode: str | None, threads: int | None) -> dict:
    """This machine's class as a stage run under `mode` would see it, whatever this process pinned: under
    portable the pinned ISA, under native the best ISA the CPU offers torch."""
    cpu = cpu_info()
    isa = PORTABLE_ISA if mode == "portable" else ("AVX512" if cpu["avx512"] else
                                                    PORTABLE_ISA if cpu["avx2"] else "DEFAULT")
    return {"mode": mode, "cpu_vendor": cpu["vendor"], "cpu_model": cpu["model"], "isa": isa,
            **library_versions(), "threads": threads}


def reproduction_verdict(recorded: dict | None, here: dict) -> tuple[str, str]:
    """('bit-for-bit' | 'statistical' | 'unknown', why) for rebuilding, on this machine, a number whose stage ran
    with the `recorded` machine class."""
    if not recorded:
        return "unknown", "the provenance record names no machine class (made before numerics were recorded)"
    diffs = []
    for key in ("mode", "torch", "mkl", "onednn", "threads"):
        if recorded.get(key) != here.get(key):
            diffs.append(f"{key} {recorded.get(key)} here {here.get(key)}")
    if recorded.get("mode") == "native":
        for key in ("cpu_vendor", "cpu_model", "isa"):
            if recorded.get(key) != here.get(key):
                diffs.append(f"{key} {recorded.get(key)!r} here {here.get(key)!r}")
    if diffs:
        return "statistical", "differs: " + "; ".join(diffs)
    if recorded.get("mode") == "portable":
        return "bit-for-bit", (f"portable numerics ({recorded.get('isa')} kernels, MKL {recorded.get('mkl')}, "
                               f"oneDNN {recorded.get('onednn')}) are the same on this machine")
    return "bit-for-bit", "native numerics on the same machine class (CPU model, ISA and libraries match)"
