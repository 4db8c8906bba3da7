"""The Hugging Face backend's sampler: batched, KV-cached decoding of whole episodes (agentrl.backends.base.Sampler).

- **The shared prompt once.** The first chunk's longest common prefix (the system prompt with the tools) is computed
  for one row and its cache repeated for every row.
- **Slots, not rows, advance.** A chunk appends the same number of slots to every row; a row with nothing to add at
  a slot leaves it masked (attention mask 0) with positions counted per row, so episodes at different points of
  their turns advance together. Finished rows leave with `keep`. The LM head runs only after each row's last slot.
- **A KV slab.** Each layer's keys and values live in one preallocated buffer [rows, heads, capacity, dim] that a
  new slot is written into in place (capacity doubles when full); transformers' DynamicCache concatenates the whole
  cache on every token, which at 64 rows of 600 slots copied 1.5 GB per decoded token.
- **Stored once, or in every row** (`PREFIX_KV`). `repeat` copies the shared prefix's keys and values into every
  row, and transformers' attention (SDPA) reads each row's copy: at 64 rows of a 350-token shared prompt those copies
  are most of the bytes a decode step reads. `once` keeps them once per batch; a registered attention function
  (`prefix_once_attention`) scores every row's queries against them in one product per KV head and merges that
  softmax with the row's own slots. The same function, in another floating-point order: a lab chooses it
  (LabRun.prefix_kv); results at `repeat` stay those of the committed seeds.
- **The sampler's own copy of the weights** (`SamplerWeights`): every linear layer's W^T, contiguous, in the
  policy's compute dtype, refreshed when an optimizer step has changed a weight (each parameter's in-place version
  counter). MKL repacks a transposed-layout weight on every call, which for decode's skinny products (a few dozen
  rows) costs more than the product itself; bf16 decoding reads half the bytes instead of casting every weight on
  every call. The trainer keeps computing from the fp32 master weights, so the sampler-trainer gap stays a measured
  property of the run (docs/performance.md).
"""
from __future__ import annotations

import contextlib
import contextvars
import functools

import torch
import torch.nn as nn

from agentrl.backends.offline import transformers
from agentrl.core.lab_config import PREFIX_KV
from agentrl.model import floors
from agentrl.model.packing import pad_rows

MIN_SHARED_PREFIX = 16  # a common prompt prefix at least this long is computed once per batch
PREFIX_ATTENTION = "agentrl_prefix_once"   # the attention function `once` registers with transformers
_SAMPLING_CACHE: contextvars.ContextVar = contextvars.ContextVar("sampling_cache")   # the cache a forward reads


def shared_prefix(chunks: list[list[int]]) -> int:
    """The length of the longest prefix every chunk shares, leaving each chunk at least one token of its own."""
    n = min(len(c) for c in chunks) - 1
    first = chunks[0]
    for i in range(max(n, 0)):
        if any(c[i] != first[i] for c in chunks[1:]):
            return i
    return max(n, 0)


@functools.cache
def slab_layer():
    """The SlabLayer class (a transformers DynamicLayer, defined on first use so that importing this module does
    not import transformers)."""

    class SlabLayer(transformers().cache_utils.DynamicLayer):
        """A cache layer whose keys and values [rows, heads, slots, dim] are views of a preallocated slab: appending L
        slots writes them in place; the slab doubles when full, and is copied only when rows leave or are repeated."""

        prefix_keys = prefix_values = None   # [1, heads, prefix, dim] under PREFIX_KV `once`

        def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
            super().lazy_initialization(key_states, value_states)
            self.slab_keys = self.slab_values = None
            self.slots = 0

        def hold_as_prefix(self) -> None:
            """The one row's slots become the batch's shared prefix, kept apart; the slab starts empty."""
            self.prefix_keys, self.prefix_values = self.keys.clone(), self.values.clone()
            self.slab_keys = self.slab_values = None
            self.slots = 0

        def _view(self) -> None:
            self.keys = self.slab_keys[:, :, :self.slots]
            self.values = self.slab_values[:, :, :self.slots]

        def _reserve(self, need: int, like: torch.Tensor) -> None:
            capacity = 0 if self.slab_keys is None else self.slab_keys.shape[2]
            if need <= capacity:
                return
            rows, heads, _, dim = like.shape
            size = max(need, 2 * capacity, 64)
            keys, values = like.new_empty(rows, heads, size, dim), like.new_empty(rows, heads, size, dim)
            if self.slots:
                keys[:, :, :self.slots] = self.keys
                values[:, :, :self.slots] = self.values
            self.slab_keys, self.slab_values = keys, values

        def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs):
            if not self.is_initialized:
                self.lazy_initialization(key_states, value_states)
            n = key_states.shape[2]
            self._reserve(self.slots + n, key_states)
            self.slab_keys[:, :, self.slots:self.slots + n] = key_states
            self.slab_values[:, :, self.slots:self.slots + n] = value_states
            self.slots += n
            self._view()
            return self.keys, self.values

        def get_seq_length(self) -> int:
            return self.slots if self.is_initialized else 0

        def batch_repeat_interleave(self, repeats: int) -> None:
            if self.is_initialized and self.slots:
                self.slab_keys = self.slab_keys.repeat_interleave(repeats, dim=0)
                self.slab_values = self.slab_values.repeat_interleave(repeats, dim=0)
                self._view()

        def batch_select_indices(self, indices: torch.Tensor) -> None:
            if self.is_initialized and self.slots:
                self.slab_keys, self.slab_values = self.slab_keys[indices], self.slab_values[indices]
                self._view()

    return SlabLayer


@functools.cache
def register_prefix_attention() -> str:
    """Register prefix_once_attention with transformers under PREFIX_ATTENTION (once per process)."""
    transformers().AttentionInterface.register(PREFIX_ATTENTION, prefix_once_attention)
    return PREFIX_ATTENTION


def prefix_once_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor, scaling: float | None = None, **kwargs):
    """Attention over a shared prefix kept once and each row's own slots, as one softmax.

    query [R, H, L, d]; key, value [R, K, S, d] (the row's own slots, K key-value heads, H = K * G);
    attention_mask [R, 1, L, S] bool (True: attend); the prefix [1, K, n, d] (every query sees all of it) is the
    layer's in the cache the sampler's forward set. Returns ([R, L, H, d], None), as transformers' SDPA does.
    The prefix scores are one [R*G*L, d] x [d, n] product per KV head: the prefix is read once, not once a row."""
    layer = _SAMPLING_CACHE.get().layers[module.layer_idx]
    kp, vp = layer.prefix_keys[0], layer.prefix_values[0]   # [K, n, d]
    R, H, L, d = query.shape
    K, n = kp.shape[0], kp.shape[1]
    G = H // K
    scale = d ** -0.5 if scaling is None else scaling
    q = query.reshape(R, K, G * L, d)   # head h reads key-value head h // G (transformers' repeat_kv)
    prefix_scores = torch.matmul(q.transpose(0, 1).reshape(K, R * G * L, d), kp.transpose(1, 2)).float()
    prefix_scores = prefix_scores.mul_(scale).view(K, R, G * L, n)
    own_scores = torch.matmul(q, key.transpose(-1, -2)).float().mul_(scale)   # [R, K, G*L, S]
    own_scores.view(R, K, G, L, -1).masked_fill_(~attention_mask[:, :, None], float("-inf"))
    top = torch.maximum(prefix_scores.amax(-1).transpose(0, 1), own_scores.amax(-1))[..., None]   # [R, K, G*L, 1]
    prefix_p = (prefix_scores - top.transpose(0, 1)).exp_()   # [K, R, G*L, n]
    own_p = (own_scores - top).exp_()
    total = prefix_p.sum(-1).transpose(0, 1)[..., None] + own_p.sum(-1, keepdim=True)
    mixed = torch.matmul(prefix_p.view(K, R * G * L, n).to(vp.dtype), vp).view(K, R, G * L, d).transpose(0, 1)
    mixed = mixed + torch.matmul(own_p.to(value.dtype), value)
    out = (mixed / total).to(query.dtype)
    return out.reshape(R, H, L, d).transpose(1, 2).contiguous(), None


def check_plain_attention(config) -> None:
    """prefix_once_attention is full causal softmax attention, nothing else: refuse a model whose attention has a
    sliding window or soft-capped scores, in one line, before any forward."""
    layer_types = set(getattr(config, "layer_types", None) or ["full_attention"])
    capped = getattr(config, "attn_logit_softcapping", None)
    if layer_types != {"full_attention"} or capped:
        kinds = ", ".join(sorted(layer_types)) + (f", scores soft-capped at {capped}" if capped else "")
        raise ValueError(f"prefix_kv: 'once' needs full causal attention in every layer; this model has {kinds}; "
                         f"allowed for it: repeat")


def slab_cache(config):
    """A transformers DynamicCache for `config` whose layers are SlabLayers."""
    cache = transformers().DynamicCache(config=config)
    cache.layers = [slab_layer()() for _ in cache.layers]
    return cache


class SamplerWeights:
    """The sampler's copy of a model's linear layers: W^T contiguous in `dtype`, refreshed when a weight changed.
    While `active()`, every nn.Linear of the model computes x @ W^T (+ b) from the copy."""

    def __init__(self, module: nn.Module, dtype: torch.dtype = torch.float32):
        self.linears = [m for m in module.modules() if isinstance(m, nn.Linear)]
        self.dtype = dtype
        self.copies: list[torch.Tensor] = []
        self.versions: tuple = ()

    def _version(self) -> tuple:
        return tuple((m.weight._version, m.weight.data_ptr()) for m in self.linears)

    def refresh(self) -> None:
        """Copy the weights again if any changed since the last copy (an optimizer step bumps their versions)."""
        version = self._version()
        if version != self.versions:
            with torch.no_grad():
                self.copies = [m.weight.detach().t().to(self.dtype).contiguous() for m in self.linears]
            self.versions = version

    @contextlib.contextmanager
    def active(self):
        self.refresh()
        for m, wt in zip(self.linears, self.copies):
            m.forward = _transposed_linear(wt, m.bias)
        try:
            yield
        finally:
            for m in self.linears:
                del m.forward


def _transposed_linear(wt: torch.Tensor, bias: torch.Tensor | None):
    def forward(x: torch.Tensor) -> torch.Tensor:
        y = torch.matmul(x, wt)   # a bf16 copy is only ever active under autocast, which casts x to match
        return y if bias is None else y + bias
    return forward


class HFSampler:
    """Batched KV-cached sampling state of an HFPolicy (agentrl.backends.base.Sampler)."""

    def __init__(self, policy, pad_id: int, prefix_kv: str = "repeat"):
        if prefix_kv not in PREFIX_KV:
            raise ValueError(f"prefix_kv: unknown value {prefix_kv!r}; allowed: {', '.join(PREFIX_KV)}")
        if prefix_kv == "once":
            check_plain_attention(policy.lm.config)
        self.policy, self.pad_id, self.prefix_kv = policy, pad_id, prefix_kv
        self.cache = slab_cache(policy.lm.config)
        self.mask: torch.Tensor | None = None      # [rows, slots]: 1 where the slot holds a token of the row
        self.lengths: torch.Tensor | None = None   # tokens in each row
        self.prefix_tokens = 0                     # the shared prefix computed once (for the bench's accounting)
        self.prefix_apart = False                  # the prefix's keys and values kept once (PREFIX_KV `once`)

    def _forward(self, ids: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """ids, valid [rows, L] appended as L slots; returns the logits after slot last[r] of each row in `last`'s
        rows (last: [n, 2] of (row, slot))."""
        L = ids.shape[1]
        pos = self.lengths[:, None] + (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = valid.long() if self.mask is None else torch.cat([self.mask, valid.long()], 1)
        with self.policy.sampling(), self._attention(mask, L) as attention_mask:
            out = self.policy.decoder(input_ids=ids, attention_mask=attention_mask, position_ids=pos,
                                      past_key_values=self.cache, use_cache=True)
            self.mask = mask
            self.lengths = self.lengths + valid.sum(1)
            if floors.METER is not None:
                shared = self.prefix_tokens if self.prefix_apart else 0
                floors.METER.sampler_forward(ids.shape[0], L, mask.shape[1] + shared, shared=shared)
            assert out.last_hidden_state.shape[1] == L
            return self.policy.head(out.last_hidden_state[last[:, 0], last[:, 1]]).float()

    @contextlib.contextmanager
    def _attention(self, mask: torch.Tensor, L: int):
        """The attention mask the decoder gets: the rows' 2D mask for transformers' own attention; under a prefix
        kept apart, the own slots' 4D causal mask [rows, 1, L, slots] (bool) for prefix_once_attention, which is the
        model's attention for this forward."""
        if not self.prefix_apart:
            yield mask
            return
        S = mask.shape[1]
        causal = torch.arange(S)[None, :] <= torch.arange(S - L, S)[:, None]   # [L, S]
        config = self.policy.lm.config
        before, token = config._attn_implementation, _SAMPLING_CACHE.set(self.cache)
        config._attn_implementation = register_prefix_attention()
        try:
            yield mask.bool()[:, None, None, :] & causal[None, None]
        finally:
            config._attn_implementation = before
            _SAMPLING_CACHE.reset(token)

    def _prefill_shared(self, chunks: list[list[int]]) -> list[list[int]]:
        """Compute the chunks' common prefix once and repeat its cache for every row (PREFIX_KV `repeat`) or keep
        it once for all rows (`once`); returns the rest of each."""
        n = shared_prefix(chunks)
        if len(chunks) < 2 or n < MIN_SHARED_PREFIX:
            return chunks
        rows = len(chunks)
        ids = torch.tensor([chunks[0][:n]])
        with self.policy.sampling():
            self.policy.decoder(input_ids=ids, attention_mask=torch.ones_like(ids),
                                position_ids=torch.arange(n)[None], past_key_values=self.cache, use_cache=True)
        if floors.METER is not None:
            floors.METER.sampler_forward(1, n, n)
        self.lengths = torch.full((rows,), n, dtype=torch.long)
        self.prefix_tokens = n
        if self.prefix_kv == "once":
            for layer in self.cache.layers:
                layer.hold_as_prefix()
            self.prefix_apart = True
            return [c[n:] for c in chunks]
        self.cache.batch_repeat_interleave(rows)
        self.mask = torch.ones(rows, n, dtype=torch.long)
        return [c[n:] for c in chunks]

    def append(self, chunks: list[list[int]]) -> torch.Tensor:
        if self.lengths is None:
            self.lengths = torch.zeros(len(chunks), dtype=torch.long)
            chunks = self._prefill_shared(chunks)
        n = torch.tensor([len(c) for c in chunks])
        L = int(n.max())
        valid = torch.arange(L)[None] < n[:, None]
        last = torch.stack([torch.arange(len(chunks)), n - 1], 1)
        return self._forward(pad_rows(chunks, self.pad_id, L), valid, last)

    def step(self, tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        rows = active.nonzero().squeeze(1)
        last = torch.stack([rows, torch.zeros_like(rows)], 1)
        return self._forward(tokens, active[:, None], last)

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.lengths = self.mask[rows], self.lengths[rows]
