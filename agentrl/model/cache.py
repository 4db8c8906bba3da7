"""The sampler's KV cache, laid out in slots, and the plan of one chunk of slots.

Every row of the cache owns the same slots: a chunk appends L slots to every row, and a row with nothing to add at
a slot leaves it invalid (masked), so episodes at different points of their turn structure advance together.
Keys and values live in preallocated buffers [B, H, capacity, Dh]: appending writes only the new slots (the
capacity doubles when full), and rows whose episode ended leave with `keep`. A slot nobody writes (an invalid one)
is zeroed: masked keys still enter the attention scores, so they must be finite.

A packed `Chunk` computes only the valid slots (M rows through every linear layer) and attention only for the
rows with a valid query; each valid slot's result is bit-identical to the dense pass over the whole padded chunk
(agentrl.model.packing says why), where "dense" means every episode the batch started with.
"""
from __future__ import annotations

import torch

from agentrl.model.packing import MIN_ROWS, rowwise

INITIAL_CAPACITY = 128


class KVCache:
    """Keys and values of every layer [B, H, capacity, Dh], which slots hold a token [B, capacity], `used` slots."""

    def __init__(self, n_layer: int, n_head: int, head_dim: int, capacity: int = INITIAL_CAPACITY):
        self.n_layer, self.n_head, self.head_dim = n_layer, n_head, head_dim
        self.capacity, self.used = capacity, 0
        self.keys: list[torch.Tensor] = []
        self.values: list[torch.Tensor] = []
        self.valid: torch.Tensor | None = None
        self.batch = 0  # rows when allocated: a dense pass over every episode of the batch has this many per slot

    def _buffers(self, rows: int, slots: int):
        kv = [torch.empty(rows, self.n_head, slots, self.head_dim) for _ in range(2 * self.n_layer)]
        return kv[:self.n_layer], kv[self.n_layer:], torch.zeros(rows, slots, dtype=torch.bool)

    def append(self, valid: torch.Tensor) -> int:
        """Reserve the slots of one chunk, valid [B, L] (zeroed, for the slots nobody writes); returns its first
        slot."""
        rows, width = valid.shape
        if self.valid is None:
            self.keys, self.values, self.valid = self._buffers(rows, self.capacity)
            self.batch = rows
        if self.used + width > self.capacity:
            self._grow(max(2 * self.capacity, self.used + width))
        start = self.used
        self.valid[:, start:start + width] = valid
        for buffer in self.keys + self.values:
            buffer[:, :, start:start + width] = 0.0
        self.used += width
        return start

    def _grow(self, capacity: int) -> None:
        keys, values, valid = self._buffers(self.valid.shape[0], capacity)
        for new, old in zip(keys + values, self.keys + self.values):
            new[:, :, :self.used] = old[:, :, :self.used]
        valid[:, :self.used] = self.valid[:, :self.used]
        self.keys, self.values, self.valid, self.capacity = keys, values, valid, capacity

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (ascending indices), e.g. the episodes still running."""
        self.keys = [k.index_select(0, rows) for k in self.keys]
        self.values = [v.index_select(0, rows) for v in self.values]
        self.valid = self.valid.index_select(0, rows)


class Chunk:
    """Which slots of a chunk (valid [B, L], just appended to `cache` at `start`) are computed, where their keys
    go, which rows query, and the attention mask [rows that query, 1, L, S] over every slot so far."""

    def __init__(self, valid: torch.Tensor, cache: KVCache, start: int, packed: bool):
        B, L = valid.shape
        S = start + L
        self.width, self.slots = L, S
        self.computed = valid.reshape(-1).nonzero().squeeze(1) if packed else torch.arange(B * L)
        self.packed = packed
        self.row = self.computed // L
        self.col = self.computed % L
        self.slot = self.col + start
        query_rows = valid.any(1).nonzero().squeeze(1) if packed else torch.arange(B)
        self.all_rows = query_rows.numel() == B
        self.query_rows = query_rows
        self.n_query_rows = query_rows.numel()
        index = torch.full((B,), -1, dtype=torch.long)
        index[query_rows] = torch.arange(self.n_query_rows)
        self.query_row = index[self.row]
        self.min_rows = min(cache.batch * L, MIN_ROWS)
        seen = cache.valid[:, :S] if self.all_rows else cache.valid[query_rows, :S]
        query_valid = valid if self.all_rows else valid[query_rows]
        causal = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)  # slot j visible to chunk query i
        mask = causal[None] & seen[:, None, :]
        if not bool(query_valid.all()):
            # an invalid (padding) query still needs one visible key to keep softmax finite; its output is unused
            mask = mask | (_eye_offset(L, S, S - L)[None] & ~query_valid[:, :, None])
        self.mask = mask[:, None]

    def visible(self, buffer: torch.Tensor) -> torch.Tensor:
        """A layer's keys or values [B, H, capacity, Dh] -> those of the querying rows up to this chunk."""
        used = buffer[:, :, :self.slots]
        return used if self.all_rows else used.index_select(0, self.query_rows)

    def rows(self, fn, x: torch.Tensor) -> torch.Tensor:
        """fn (a row-wise matmul) of x [M, D] at the dense pass's row count (agentrl.model.packing)."""
        return rowwise(fn, x, self.min_rows)

    def position(self, flat: torch.Tensor) -> torch.Tensor:
        """Flat chunk indices (row * L + col) of computed slots -> their index among the computed rows."""
        return torch.searchsorted(self.computed, flat) if self.packed else flat


def _eye_offset(L: int, S: int, offset: int) -> torch.Tensor:
    m = torch.zeros(L, S, dtype=torch.bool)
    m[torch.arange(L), torch.arange(L) + offset] = True
    return m
