"""Compile fixed.cpp once per machine (a torch C++ extension) and load it.

The build is keyed by the source, the compiler flags and torch's version: `<cache>/agentrl-kernels/<key>/` (cache:
AGENTRL_KERNELS_CACHE, else $XDG_CACHE_HOME or ~/.cache), shared by every checkout and queued experiment with the
same source, and built by whichever process gets there first (torch's lock file keeps a second one waiting). A
loaded build is imported directly; torch's build machinery is imported only to build. `make install` builds it.

On x86-64 the file is compiled for AVX2 and FMA (every machine `run.numerics: portable` accepts has them), on
other CPUs without ISA flags; the kernels then take their scalar path. Both give the same bits (fixed.cpp says why).
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import os
import platform
from pathlib import Path

from agentrl.core.knobs import UserError

# the sources it compiles at run time: code of every stage that loads it (agentrl.tracking.closure)
COMPILES = ["fixed.cpp", "fixed_lanes.h", "fixed_math.h", "fixed_gemm.h", "fixed_attention.h"]
SOURCE = Path(__file__).with_name(COMPILES[0])
# what the compiler may not do to the written order of operations, and the ISA of the x86 build
CFLAGS = ["-O3", "-ffp-contract=off", "-fno-fast-math", "-fno-finite-math-only", "-fopenmp"]
LDFLAGS = ["-fopenmp"]   # at::parallel_for is OpenMP inlined into this file: torch's own runtime (libgomp.so.1) runs it
X86_FLAGS = ["-mavx2", "-mfma"]


class KernelBuildError(UserError):
    """fixed.cpp could not be compiled or loaded here (one line: what to install or fix)."""


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def cflags() -> list[str]:
    if not _x86():
        return list(CFLAGS)
    from agentrl.core.numerics import cpu_info
    info = cpu_info()
    if info["flags"] and not info["avx2"]:
        return list(CFLAGS)   # an x86 CPU without AVX2/FMA: the scalar build (slow, same bits)
    return CFLAGS + X86_FLAGS


def build_key(flags: list[str]) -> str:
    import torch
    h = hashlib.sha256()
    for source in COMPILES:
        h.update(SOURCE.with_name(source).read_bytes())
    h.update(" ".join(flags).encode())
    h.update(torch.__version__.encode())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    root = os.environ.get("AGENTRL_KERNELS_CACHE")
    if root:
        return Path(root)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "agentrl-kernels"


def _import_built(name: str, directory: Path):
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = directory / f"{name}{suffix}"
        if path.is_file():
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return module
    return None


_MODULE = None


def load(verbose: bool | None = None):
    """The compiled kernels (built here first if this machine has no build of this source yet)."""
    global _MODULE
    if _MODULE is not None:
        return _MODULE
    import torch  # noqa: F401  (the extension links against the loaded torch)
    flags = cflags()
    name = f"agentrl_fixed_{build_key(flags)}"
    directory = cache_root() / name
    module = _import_built(name, directory)
    if module is None:
        verbose = os.environ.get("AGENTRL_KERNELS_VERBOSE") == "1" if verbose is None else verbose
        module = _build(name, directory, flags, verbose)
    module.set_isa_cap(isa_cap())
    _MODULE = module
    return module


ISA_CAPS = {"scalar": 0, "avx2": 1, "avx512": 2}


def isa_cap() -> int:
    """The widest vector path the kernels may take: AGENTRL_KERNELS_ISA (scalar, avx2, avx512; default the widest
    this CPU has). The bits are the same on every path; the setting exists to show it (tests/test_kernels.py)."""
    value = os.environ.get("AGENTRL_KERNELS_ISA", "avx512")
    if value not in ISA_CAPS:
        raise KernelBuildError(f"AGENTRL_KERNELS_ISA={value!r}: expected one of {', '.join(ISA_CAPS)}")
    return ISA_CAPS[value]


def _build(name: str, directory: Path, flags: list[str], verbose: bool):
    try:
        directory.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise KernelBuildError(f"{directory}: cannot create the kernels' build directory ({exc.strerror}); set "
                               f"AGENTRL_KERNELS_CACHE to a writable directory") from None
    from torch.utils.cpp_extension import load as torch_load
    try:
        return torch_load(name, [str(SOURCE)], extra_cflags=flags, extra_ldflags=LDFLAGS,
                          build_directory=str(directory), verbose=verbose)
    except (RuntimeError, OSError, ImportError) as exc:
        lines = str(exc).strip().splitlines()
        first = next((line.strip() for line in lines if "error:" in line), lines[0] if lines else type(exc).__name__)
        raise KernelBuildError(f"{SOURCE.name}: the C++ kernels did not build ({first}); a C++ compiler (g++) and "
                               f"ninja are needed: `make install` installs them into the virtualenv, "
                               f"AGENTRL_KERNELS_VERBOSE=1 shows the compiler's output") from None


if __name__ == "__main__":   # `make install`: build (or find) this machine's kernels, one line either way
    import sys
    import time
    start = time.perf_counter()
    try:
        built = load()
    except KernelBuildError as exc:
        print(f"kernels: {exc}", file=sys.stderr)
        sys.exit(2)
    print(f"kernels: {built.__name__} ({built.isa()} path) ready in {time.perf_counter() - start:.1f} s")
