"""A lab's dtype on this machine: bf16 mixed precision runs where the hardware computes bf16 products, and is
refused (one line naming the CPU's flags, before the model loads) where it would only be emulated: a CPU without
`amx_bf16` or `avx512_bf16` (AMD Zen 3, Intel before Cooper Lake) runs bf16 products several times slower than fp32,
and so does a CPU with them whose oneDNN is capped below its bf16 kernels (`portable` numerics cap it at AVX2; on
the AMX Xeon a bf16 GEMM then runs at 2 GFLOP/s against fp32's 162-423, docs/performance.md). On CUDA, torch says
whether the device supports bf16."""
from __future__ import annotations

import os

from agentrl.core.config import ConfigError
from agentrl.core.numerics import cpu_info

BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})   # /proc/cpuinfo flags of hardware bf16 products
# oneDNN's ISA caps (ONEDNN_MAX_CPU_ISA, else DNNL_MAX_CPU_ISA) below its first bf16 product kernel
# (AVX512_CORE_BF16): under these, torch's bf16 matmuls fall back to emulation
ONEDNN_ISAS_WITHOUT_BF16 = frozenset({"SSE41", "AVX", "AVX2", "AVX2_VNNI", "AVX2_VNNI_2", "AVX512_CORE",
                                      "AVX512_CORE_VNNI"})


def onednn_cap(environ=None) -> str | None:
    """The ISA cap oneDNN reads at its first call (its own name first, then the older DNNL_ one); None: uncapped."""
    environ = os.environ if environ is None else environ
    value = environ.get("ONEDNN_MAX_CPU_ISA") or environ.get("DNNL_MAX_CPU_ISA")
    return value.upper() if value else None


def check_dtype(dtype: str, device: str, field: str, flags: set | None = None, environ=None) -> None:
    """Refuse bf16 where the device cannot compute it natively; `flags` (a test's) replaces /proc/cpuinfo's and
    `environ` (a test's) the process environment this process's numerics pin set."""
    if dtype != "bf16":
        return
    if device == "cuda":
        import torch
        if not torch.cuda.is_bf16_supported():
            raise ConfigError(f"{field}: bf16, but this CUDA device does not support it; allowed here: fp32")
        return
    cpu = cpu_info()
    flags = cpu["flags"] if flags is None else set(flags)
    if not BF16_FLAGS & flags:
        raise ConfigError(f"{field}: bf16 needs a CPU flag {' or '.join(sorted(BF16_FLAGS))}; this CPU "
                          f"({cpu['model']}) has neither (bf16 products would be emulated, slower than fp32); "
                          "allowed here: fp32")
    environ = os.environ if environ is None else environ
    cap = onednn_cap(environ)
    if cap in ONEDNN_ISAS_WITHOUT_BF16:
        why = ("portable numerics cap" if environ.get("AGENTRL_NUMERICS") == "portable"
               else "the environment's ONEDNN_MAX_CPU_ISA/DNNL_MAX_CPU_ISA caps")
        raise ConfigError(f"{field}: bf16 needs native numerics with oneDNN uncapped: {why} oneDNN at {cap}, where "
                          "bf16 products are emulated, slower than fp32; allowed here: fp32, or bf16 under "
                          "numerics: native")
