"""TinyAgent's block -- pre-LN attention, then an MLP, each added to the residual -- computed from its declaration,
and whether the kernel set's one-call decode step can run it.

What the block declares is what runs: `compute` applies each declared module as the kernel set computes it (COMPUTED:
nn.Linear -> ops.linear; nn.LayerNorm -> layer norm with its own shape, eps, gain and bias; nn.GELU() -> ops.gelu;
nn.ReLU -> ops.relu; an nn.Sequential's modules in order), on the trainer's packed pass and the sampler's cached pass
alike, so an edit of the declaration (a norm, the activation, a width) changes the model on every path. When a model
is built, `check` refuses in one line a module the kernels do not compute, and a declared module that a pass of the
block never computes.

The sampler's decode step (fixed.cpp) runs every block in one call, and declares the block it runs: its tensors and
their roles, in the order it takes them (`KernelSet.decode_layout`: fixed.cpp's BLOCK_LAYOUT, e.g. `ln1.weight` is a
`layer_norm.weight`), and its one module without tensors, the activation, with the activations it computes
(`KernelSet.decode_activation`). Before a model samples through decode, `decode_mismatch` holds the block against
that declaration (its tensors, its modules without tensors, its layer norms' eps) and, on a probe, the bits of its
layer-by-layer pass against decode's; `decode_step` then binds each layer's activation. A block that differs samples
layer by layer instead, on the same kernels (the trainer's bits), and says so in one line on stderr.
"""
from __future__ import annotations

import copy
import functools
import sys

import torch
import torch.nn as nn
import torch.nn.functional as F

from agentrl.core.knobs import ConfigError
from agentrl.model.cache import Chunk, KVCache

# a rollout step of the pipeline's shape (64 episodes, d_model 64, 3 layers, 2 threads), medians of 14 alternating
# runs on a loaded 2-core machine: 0.57 s through decode, 1.34 s layer by layer
LAYER_BY_LAYER_COST = "about 2x the rollout time"

# a leaf module's type -> its name in the kernel set (decode's role prefix for its tensors) and how the set computes it
COMPUTED = {
    nn.Linear: ("linear", lambda m, x, ops: ops.linear(x, m.weight, m.bias)),
    nn.LayerNorm: ("layer_norm", lambda m, x, ops: F.layer_norm(x, m.normalized_shape, m.weight, m.bias, m.eps)),
    nn.GELU: ("gelu", lambda m, x, ops: ops.gelu(x)),   # the erf form only (kernel_op)
    nn.ReLU: ("relu", lambda m, x, ops: ops.relu(x)),
}
SUPPORTED = "Linear, LayerNorm, GELU(approximate='none'), ReLU, and nn.Sequential of them"


def kernel_op(module: nn.Module) -> str | None:
    """The kernel set's name for a leaf module it computes (`linear`, `layer_norm`, `gelu`, `relu`), else None."""
    entry = COMPUTED.get(type(module))   # the exact type: a subclass may compute something else in its forward
    if entry is None or (isinstance(module, nn.GELU) and module.approximate != "none"):
        return None
    return entry[0]


def what(module: nn.Module) -> str:
    """A module as a message names it: its class, with its arguments where it has no tensors (`GELU(approximate=
    'tanh')`)."""
    extra = module.extra_repr()
    if extra and "\n" not in extra and next(module.parameters(), None) is None:
        return f"{type(module).__name__}({extra})"
    return type(module).__name__


_traced: set | None = None   # while `check` traces a pass: the ids of the leaf modules `compute` applies


def compute(module: nn.Module, x: torch.Tensor, ops) -> torch.Tensor:
    """x through a declared module as the kernel set `ops` computes it: an nn.Sequential's modules in order, a leaf
    by COMPUTED."""
    if type(module) is nn.Sequential:
        for m in module:
            x = compute(m, x, ops)
        return x
    if kernel_op(module) is None:
        raise ConfigError(f"{what(module)} is not computed by TinyAgent's kernels; supported: {SUPPORTED}")
    if _traced is not None:
        _traced.add(id(module))
    return COMPUTED[type(module)][1](module, x, ops)


class Attention(nn.Module):
    def __init__(self, cfg):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def heads(self, x, ops):
        """x [N, D] -> q, k, v [N, H, Dh]."""
        N, D = x.shape
        qkv = compute(self.qkv, x, ops)
        return (t.reshape(N, self.n_head, D // self.n_head) for t in qkv.split(D, dim=1))

    def forward(self, x, starts: torch.Tensor, ops):
        """Causal self-attention within each packed row of x [N, D] (row b: tokens starts[b]..starts[b+1]-1)."""
        q, k, v = self.heads(x, ops)
        y = ops.attention(q, k, v, starts)
        return compute(self.proj, y.reshape(x.shape), ops)

    def cached(self, x, chunk: Chunk, keys: torch.Tensor, values: torch.Tensor, valid: torch.Tensor, ops):
        """x [M, D] at the chunk's computed slots: writes their keys and values into this layer's cache
        [B, H, capacity, Dh], attends from each to the valid slots of its row up to its own, returns [M, D]."""
        q, k, v = self.heads(x, ops)
        keys[chunk.row, :, chunk.slot] = k
        values[chunk.row, :, chunk.slot] = v
        y = ops.attention_cached(q, chunk.row, chunk.slots, keys, values, valid)
        return compute(self.proj, y.reshape(x.shape), ops)


class Block(nn.Module):
    """x + attn(ln1(x)), then x + mlp(ln2(x)); x [N, D]."""

    def __init__(self, cfg):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x, starts: torch.Tensor, ops):
        x = x + self.attn(compute(self.ln1, x, ops), starts, ops)
        return x + compute(self.mlp, compute(self.ln2, x, ops), ops)

    def cached(self, x, chunk: Chunk, keys, values, valid, ops):
        x = x + self.attn.cached(compute(self.ln1, x, ops), chunk, keys, values, valid, ops)
        return x + compute(self.mlp, compute(self.ln2, x, ops), ops)


# ---------------------------------------------------------------- every declared module computed, by the kernels

def leaves(block: nn.Module):
    """(name in the block, module) of each module without submodules but an nn.Sequential, in declaration order."""
    return [(name, m) for name, m in block.named_modules()
            if next(m.children(), None) is None and type(m) is not nn.Sequential]


def _probe_cache(width: int, heads: int) -> tuple[KVCache, Chunk]:
    """A one-layer cache and a chunk of two rows of three tokens."""
    valid = torch.ones(2, 3, dtype=torch.bool)
    cache = KVCache(1, heads, width // heads)
    return cache, Chunk(valid, cache, cache.append(valid), packed=False)


def probe_pass(block: nn.Module, kernels, x: torch.Tensor, cached: bool) -> torch.Tensor:
    """x [6, D], two rows of three tokens, through the block's packed pass (`forward`, the trainer's) or its
    layer-by-layer cached pass (the sampler's), without gradient."""
    with torch.no_grad():
        if not cached:
            return block(x, torch.tensor([0, 3, 6]), kernels)
        cache, chunk = _probe_cache(x.shape[1], block.attn.n_head)
        return block.cached(x, chunk, *cache.layer(0), cache.valid, kernels)


_COMPUTES: set = set()


def check(block: nn.Module, kernels) -> None:
    """Refuse a block the kernels do not compute as declared, in one line (ConfigError): a module that is not one of
    SUPPORTED (other than its Attention, whose tensors are), or a declared module that its packed pass (`forward`,
    the trainer's) or its cached pass (the sampler's) never computes through `compute`. Decided once per block
    declaration and kernel set."""
    key = (type(block), repr(block), kernels.name)
    if key in _COMPUTES:
        return
    cls = type(block).__name__
    for name, m in block.named_modules():
        container = m is block or isinstance(m, Attention) or type(m) is nn.Sequential
        if not container and kernel_op(m) is None:
            raise ConfigError(f"{cls}.{name}: {what(m)} is not computed by TinyAgent's kernels; supported: {SUPPORTED}")
    global _traced
    x = torch.zeros(6, block.attn.proj.out_features)
    for name, cached in (("forward", False), ("cached", True)):
        _traced = ran = set()
        try:
            probe_pass(block, kernels, x, cached)
        finally:
            _traced = None
        for path, m in leaves(block):
            if id(m) not in ran:
                raise ConfigError(f"{cls}.{path}: {what(m)} is declared but the block's {name} pass never computes "
                                  f"it (agentrl.model.block.compute)")
    _COMPUTES.add(key)


# ---------------------------------------------------------------- the block against the decode step's declaration

def layout(block: nn.Module) -> tuple[tuple[str, str], ...]:
    """A block's tensors as (name, role), in the order the block holds them: the role is the owning module's kernel
    op and the tensor's own name (`linear.weight`); a module the kernels do not compute is named by its class."""
    owners = dict(block.named_modules())
    out = []
    for name, _ in block.named_parameters():
        owner, _, leaf = name.rpartition(".")
        kind = kernel_op(owners[owner]) or type(owners[owner]).__name__
        out.append((name, f"{kind}.{leaf}"))
    return tuple(out)


def tensors(block: nn.Module, declared) -> list[torch.Tensor]:
    """The block's tensors in the declared order (decode's)."""
    params = dict(block.named_parameters())
    return [params[name] for name, _ in declared]


def activations(block: nn.Module) -> list[tuple[str, str | None]]:
    """The block's modules without tensors, as (name in the block, kernel op): its activations."""
    return [(name, kernel_op(m)) for name, m in leaves(block) if next(m.parameters(), None) is None]


def _few(names: list[str]) -> str:
    return ", ".join(names[:2]) + (f" and {len(names) - 2} more" if len(names) > 2 else "")


def _layout_difference(declared, have) -> str:
    want, got = dict(declared), dict(have)
    missing, extra = [n for n in want if n not in got], [n for n in got if n not in want]
    if missing:
        return f"no {_few(missing)}"
    if extra:
        return f"an extra {_few(extra)}"
    other = [f"{n} is {role}" for n, role in have if want[n] != role]
    return _few(other) if other else "its tensors in another order"


def _probe_agrees(block: nn.Module, kernels, activation: str) -> bool:
    """The block's layer-by-layer cached pass and decode give the same bits on a probe: two rows of three tokens,
    every tensor of a copy of the block drawn at random (so no gain of one or bias of zero hides an order)."""
    probe = copy.deepcopy(block).requires_grad_(False)
    g = torch.Generator().manual_seed(0)
    for p in probe.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    x = torch.randn(6, probe.attn.proj.out_features, generator=g)
    per_layer = probe_pass(probe, kernels, x, cached=True)
    cache, chunk = _probe_cache(x.shape[1], probe.attn.n_head)
    with torch.no_grad():
        fused = kernels.decode(x, kernels.decode_weights(tensors(probe, kernels.decode_layout())), cache.kv,
                               cache.valid, chunk.row, chunk.slots, probe.ln1.eps, activations=[activation])
    return torch.equal(per_layer, fused)


_CHECKED: dict = {}


def decode_mismatch(block: nn.Module, kernels, eps: float) -> str | None:
    """Why the kernel set's decode step cannot run `block` in a model whose final layer norm has `eps` (decode takes
    one eps for every norm), or None: it can, or the set has no decode step. Decided once per block declaration,
    kernel set and eps; the first refusal is one line on stderr."""
    if kernels.decode is None:
        return None
    key = (type(block), repr(block), kernels.name, eps)
    if key not in _CHECKED:
        declared, have = kernels.decode_layout(), layout(block)
        module, computed = kernels.decode_activation()
        free = dict(activations(block))
        extra = [f"{n} ({op})" for n, op in free.items() if n != module]
        norms = sorted({m.eps for m in block.modules() if isinstance(m, nn.LayerNorm)})
        if have != declared:
            reason = _layout_difference(declared, have)
        elif extra:
            reason = f"an extra {_few(extra)}"
        elif free.get(module) not in computed:
            reason = f"{module} is {free.get(module)}, decode's one of {', '.join(computed)}"
        elif norms != [eps]:
            reason = f"layer norm eps {_few([str(e) for e in norms])}, ln_f's {eps}"
        elif not _probe_agrees(block, kernels, free[module]):
            reason = "other bits than decode on a probe"
        else:
            reason = None
        _CHECKED[key] = reason
        if reason is not None:
            print(f"warning: {type(block).__name__}: {kernels.name} decode cannot run it ({reason}); sampling layer by "
                  f"layer on the same kernels, {LAYER_BY_LAYER_COST}", file=sys.stderr)
    return _CHECKED[key]


def decode_step(blocks, kernels, eps: float):
    """The kernel set's one-call decode step with each block's activation bound, or None where the set has none or
    cannot run one of the blocks (decode_mismatch)."""
    if kernels.decode is None or any(decode_mismatch(b, kernels, eps) is not None for b in blocks):
        return None
    module, _ = kernels.decode_activation()
    return functools.partial(kernels.decode, activations=[kernel_op(b.get_submodule(module)) for b in blocks])
