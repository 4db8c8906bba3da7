"""The lab process keeps freed memory for reuse.

glibc's malloc serves every block above its mmap threshold (at most 32 MiB) with a fresh mmap and unmaps it on free,
so each [positions, 151,936] logits tensor of the lab (hundreds of MiB) is page-faulted in anew, every step. On one
GRPO step of 16 episodes this measured 2.3 M minor page faults and 5.3 s of system time, against 1.1 M and 2.4 s
with mmap off (update 6.7 s -> 4.8 s; docs/labs.md). Off, large blocks come from the heap and stay there when freed:
the resident set stays at its peak, which the lab reports anyway. Values are unchanged (only where memory comes
from), so it is set once, at the lab's entry point, and never for TinyAgent's stages.
"""
from __future__ import annotations

import ctypes
import ctypes.util

M_TRIM_THRESHOLD, M_MMAP_MAX = -1, -4   # mallopt parameters (malloc.h)


def keep_freed_memory() -> bool:
    """mallopt(M_MMAP_MAX, 0) and an unreachable trim threshold; False where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return bool(libc.mallopt(M_MMAP_MAX, 0)) and bool(libc.mallopt(M_TRIM_THRESHOLD, 2**31 - 1))
    except (OSError, AttributeError):
        return False
