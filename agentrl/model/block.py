"""TinyAgent's block -- pre-LN attention, then a GELU MLP, each added to the residual -- and whether the kernel set's
one-call decode step can run it.

The block's tensors and their order, as the sampler's decode step takes them, are declared once: by the decode step
itself (`KernelSet.decode_layout`: fixed.cpp's BLOCK_LAYOUT, each tensor's name in the block and its role, such as
`layer_norm.weight` or `linear.weight`). TinyAgent hands decode its block's tensors in that order, the kernels'
binding packs those whose role is `linear.weight`, and before a model samples through decode, `decode_mismatch`
holds the block against the declaration: its own tensors and roles (`layout`), and, on a probe, the bits of its
layer-by-layer pass against decode's. A block that differs in either samples layer by layer instead, on the same
kernels (the trainer's bits), and says so once on stderr with the cost; it is never silently different.
"""
from __future__ import annotations

import copy
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from agentrl.model.cache import Chunk, KVCache

# a rollout step of the pipeline's shape (64 episodes, d_model 64, 3 layers, 2 threads), medians of 14 alternating
# runs on a loaded 2-core machine: 0.57 s through decode, 1.34 s layer by layer
LAYER_BY_LAYER_COST = "about 2x the time per rollout step"


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def heads(self, x, ops):
        """x [N, D] -> q, k, v [N, H, Dh]."""
        N, D = x.shape
        qkv = ops.linear(x, self.qkv.weight, self.qkv.bias)
        return (t.reshape(N, self.n_head, D // self.n_head) for t in qkv.split(D, dim=1))

    def forward(self, x, starts: torch.Tensor, ops):
        """Causal self-attention within each packed row of x [N, D] (row b: tokens starts[b]..starts[b+1]-1)."""
        q, k, v = self.heads(x, ops)
        y = ops.attention(q, k, v, starts)
        return ops.linear(y.reshape(x.shape), self.proj.weight, self.proj.bias)

    def cached(self, x, chunk: Chunk, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, ops):
        """x [M, D] at the chunk's computed slots: writes their keys and values into this layer's cache
        [B, H, capacity, Dh], attends from each to the valid slots of its row up to its own, returns [M, D]."""
        q, k, v = self.heads(x, ops)
        keys[chunk.row, :, chunk.slot] = k
        values[chunk.row, :, chunk.slot] = v
        y = ops.attention_cached(q, chunk.row, chunk.slots, keys, values, valid)
        return ops.linear(y.reshape(x.shape), self.proj.weight, self.proj.bias)


class Block(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def _mlp(self, x, ops):
        up, _, down = self.mlp
        h = F.layer_norm(x, x.shape[-1:], self.ln2.weight, self.ln2.bias, self.ln2.eps)
        return ops.linear(ops.gelu(ops.linear(h, up.weight, up.bias)), down.weight, down.bias)

    def _ln1(self, x):
        return F.layer_norm(x, x.shape[-1:], self.ln1.weight, self.ln1.bias, self.ln1.eps)

    def forward(self, x, starts: torch.Tensor, ops):
        x = x + self.attn(self._ln1(x), starts, ops)
        return x + self._mlp(x, ops)

    def cached(self, x, chunk: Chunk, keys, values, valid, ops):
        x = x + self.attn.cached(self._ln1(x), chunk, keys, values, valid, ops)
        return x + self._mlp(x, ops)


# ---------------------------------------------------------------- the block against the decode step's declaration

ROLES = {nn.LayerNorm: "layer_norm", nn.Linear: "linear"}   # module class -> the role prefix decode knows it by


def layout(block: nn.Module) -> tuple[tuple[str, str], ...]:
    """A block's tensors as (name, role), in the order the block holds them: the role is the owning module's kind
    and the tensor's own name (`linear.weight`); a module decode does not know is named by its class."""
    owners = dict(block.named_modules())
    out = []
    for name, _ in block.named_parameters():
        owner, _, leaf = name.rpartition(".")
        kind = ROLES.get(type(owners[owner]), type(owners[owner]).__name__)
        out.append((name, f"{kind}.{leaf}"))
    return tuple(out)


def tensors(block: nn.Module, declared) -> list[torch.Tensor]:
    """The block's tensors in the declared order (decode's)."""
    params = dict(block.named_parameters())
    return [params[name] for name, _ in declared]


def describe(entries) -> str:
    return ", ".join(f"{name} ({role})" for name, role in entries)


def _probe_agrees(block: nn.Module, kernels) -> bool:
    """The block's layer-by-layer cached pass and decode give the same bits on a probe: two rows of three tokens,
    every tensor of a copy of the block drawn at random (so no gain of one or bias of zero hides an order)."""
    probe = copy.deepcopy(block).requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    for p in probe.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    declared = kernels.decode_layout()
    width = tensors(probe, declared)[0].numel()
    heads = probe.attn.n_head
    valid = torch.ones(2, 3, dtype=torch.bool)
    x = torch.randn(6, width, generator=g)
    out = []
    with torch.no_grad():
        for fused in (False, True):
            cache = KVCache(1, heads, width // heads)
            chunk = Chunk(valid, cache, cache.append(valid), packed=False)
            if fused:
                out.append(kernels.decode(x, kernels.decode_weights(tensors(probe, declared)), cache.kv, cache.valid,
                                          chunk.row, chunk.slots, probe.ln1.eps))
            else:
                out.append(probe.cached(x, chunk, *cache.layer(0), cache.valid, kernels))
    return torch.equal(*out)


_CHECKED: dict = {}


def decode_mismatch(block: nn.Module, kernels) -> str | None:
    """Why the kernel set's decode step cannot run `block` (None: it can, or the set has no decode step). Decided
    once per block class, kernel set and tensor shapes; the first refusal is one line on stderr."""
    if kernels.decode is None:
        return None
    key = (type(block), kernels.name, tuple((n, tuple(p.shape)) for n, p in block.named_parameters()))
    if key not in _CHECKED:
        declared, have = kernels.decode_layout(), layout(block)
        if have != declared:
            reason = f"its tensors are {describe(have)}"
        elif not _probe_agrees(block, kernels):
            reason = "its layer-by-layer pass computes other bits than decode's on a probe"
        else:
            reason = None
        _CHECKED[key] = reason
        if reason is not None:
            print(f"warning: {type(block).__name__}: the {kernels.name} kernels' decode step runs a block of "
                  f"{describe(declared)}, and {reason}: this model samples layer by layer on the same kernels (the "
                  f"trainer's bits), {LAYER_BY_LAYER_COST}", file=sys.stderr)
    return _CHECKED[key]
