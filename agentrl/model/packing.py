"""Packed rows: the real tokens of a padded batch one row after another, as every TinyAgent pass computes them.

Padding costs most of the work of a padded pass (a step's batch is ~30% real tokens, a chunk of environment replies
~15%), so the passes compute real tokens only; with the fixed-order kernels (agentrl.model.kernels) a token's
result does not depend on which other tokens share the call, so the packed results are the padded pass's bits.
"""
from __future__ import annotations

import torch


def real_positions(lengths: torch.Tensor, width: int) -> torch.Tensor:
    """Flat indices (row * width + col) of each row's first lengths[row] positions, row-major."""
    return (torch.arange(width)[None] < lengths[:, None]).reshape(-1).nonzero().squeeze(1)


def row_starts(lengths: torch.Tensor) -> torch.Tensor:
    """Where each packed row begins, and the end: [B + 1]."""
    return torch.cat([lengths.new_zeros(1), lengths.cumsum(0)])


def pad_rows(rows: list[list], pad_value, width: int | None = None, dtype=torch.long) -> torch.Tensor:
    """Right-pad lists to one width -> [B, width]."""
    width = max((len(r) for r in rows), default=0) if width is None else width
    if not rows or width == 0:
        return torch.full((len(rows), width), pad_value, dtype=dtype)
    return torch.tensor([list(r) + [pad_value] * (width - len(r)) for r in rows], dtype=dtype)
