"""Computing only the real tokens of a padded batch, with the dense pass's exact floating-point results.

Padding costs the trainer and the sampler most of their work: a step's batch is ~30% real tokens, a chunk of
environment replies ~15%. Layer norms, GELU and the residual work row by row and attention head by head, so
leaving padded rows out changes no other row. The matmuls of the linear layers do too, except that MKL picks a
different kernel for very few rows (on this machine: at most 10 rows for d_ff -> d_model, 2 otherwise), which
rounds differently; `rowwise` therefore pads a packed matmul with zero rows to the row count the dense pass would
have had, capped at MIN_ROWS. Attention runs on the padded layout itself (real queries never see a padded key),
so its kernels see exactly the shapes they always saw.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

MIN_ROWS = 32


def rowwise(fn, x: torch.Tensor, min_rows: int) -> torch.Tensor:
    """fn (a linear layer, or any row-wise matmul) of x [M, D], computed on at least `min_rows` rows (zero rows
    added, then dropped)."""
    if isinstance(fn, torch.nn.Linear):  # the layer's own F.linear call, without the module call around it
        layer = fn
        fn = lambda h: F.linear(h, layer.weight, layer.bias)
    M = x.shape[0]
    if M >= min_rows:
        return fn(x)
    return fn(torch.cat([x, x.new_zeros(min_rows - M, x.shape[1])]))[:M]


def real_positions(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Flat indices (row * width + col) of each row's first lengths[row] positions, row-major."""
    return (torch.arange(width)[None] < lengths[:, None]).reshape(-1).nonzero().squeeze(1)


def pad_rows(rows: list[list], pad_value, width: int | None = None, dtype=torch.long) -> torch.Tensor:
    """Right-pad lists to one width -> [B, width]."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    out = torch.full((len(rows), width), pad_value, dtype=dtype)
    for i, r in enumerate(rows):
        if r:
            out[i, :len(r)] = torch.tensor(r, dtype=dtype)
    return out
