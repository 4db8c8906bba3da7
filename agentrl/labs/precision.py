"""A lab's dtype on this machine: bf16 mixed precision runs where the hardware computes bf16 products, and is
refused (one line naming the CPU's flags, before the model loads) where it would only be emulated: a CPU without
`amx_bf16` or `avx512_bf16` (AMD Zen 3, Intel before Cooper Lake) runs bf16 products several times slower than fp32.
On CUDA, torch says whether the device supports bf16."""
from __future__ import annotations

from agentrl.core.config import ConfigError
from agentrl.core.numerics import cpu_info

BF16_FLAGS = frozenset({"amx_bf16", "avx512_bf16"})   # /proc/cpuinfo flags of hardware bf16 products


def check_dtype(dtype: str, device: str, field: str, flags: set | None = None) -> None:
    """Refuse bf16 where the device cannot compute it natively; `flags` (a test's) replaces /proc/cpuinfo's."""
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
