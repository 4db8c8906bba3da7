"""The sampler's KV cache, laid out in slots, and the plan of one chunk of slots.

Every row of the cache owns the same slots: a chunk appends L slots to every row, and a row with nothing to add at
a slot leaves it invalid, so episodes at different points of their turn structure advance together. Keys and
values live in preallocated buffers [B, H, capacity, Dh]: appending writes only the new slots (the capacity doubles
when full). Rows whose episode ended leave with `keep`, which only renumbers: the callers' rows map to cache rows
(`rows`), and nothing is copied. An unwritten slot holds anything (a kernel set reads only the slots `valid`
[B, capacity] marks).

A packed `Chunk` computes only the valid slots: M rows through every layer, each attending to its row's valid slots
up to its own (agentrl.model.policy).
"""
from __future__ import annotations

import torch

INITIAL_CAPACITY = 128


class KVCache:
    """Keys and values of every layer in one buffer [2, n_layer, B, H, capacity, Dh], which slots hold a token
    [B, capacity], and how many slots are `used`."""

    def __init__(self, n_layer: int, n_head: int, head_dim: int, capacity: int = INITIAL_CAPACITY):
        self.n_layer, self.n_head, self.head_dim = n_layer, n_head, head_dim
        self.capacity, self.used = capacity, 0
        self.kv: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        self.rows: torch.Tensor | None = None   # the cache row of each of the caller's rows (None: all, in order)

    def _buffers(self, rows: int, slots: int):
        return (torch.empty(2, self.n_layer, rows, self.n_head, slots, self.head_dim),
                torch.zeros(rows, slots, dtype=torch.bool))

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's keys and values, views [B, H, capacity, Dh]."""
        return self.kv[0, i], self.kv[1, i]

    def append(self, valid: torch.Tensor) -> int:
        """Reserve the slots of one chunk, valid [rows, L] for the caller's rows; returns its first slot."""
        rows, width = valid.shape
        if self.valid is None:
            self.kv, self.valid = self._buffers(rows, self.capacity)
        if self.used + width > self.capacity:
            self._resize(max(2 * self.capacity, self.used + width))
        start = self.used
        if self.rows is None:
            self.valid[:, start:start + width] = valid
        else:
            self.valid[self.rows, start:start + width] = valid
        self.used += width
        return start

    def cache_rows(self, rows: torch.Tensor) -> torch.Tensor:
        """The cache rows of some of the caller's rows."""
        return rows if self.rows is None else self.rows[rows]

    def _resize(self, capacity: int) -> None:
        """New buffers with the used slots copied over."""
        used = self.used
        kv, valid = self._buffers(self.valid.shape[0], capacity)
        kv[..., :used, :], valid[:, :used] = self.kv[..., :used, :], self.valid[:, :used]
        self.kv, self.valid, self.capacity = kv, valid, capacity

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only the caller's rows `rows` (ascending), e.g. the episodes still running: they become rows
        0..len(rows)-1 (no slot is copied)."""
        self.rows = self.cache_rows(rows)


class Chunk:
    """Which slots of a chunk (valid [B, L] over the caller's rows, appended to `cache` at slot `start`) are
    computed: their flat indices `computed` [M] in [B, L], cache rows `row` [M] and slots `slots` [M] (`slot`: the
    same, as one integer when L == 1), and with `packed` the index among them of each row's last valid slot
    (`last`, rows that have one)."""

    def __init__(self, valid: torch.Tensor, cache: KVCache, start: int, packed: bool):
        B, L = valid.shape
        self.computed = valid.reshape(-1).nonzero().squeeze(1) if packed else torch.arange(B * L)
        row, col = (self.computed, None) if L == 1 else (self.computed // L, self.computed % L)
        self.row = cache.cache_rows(row)
        self.slots = torch.full_like(self.computed, start) if L == 1 else col + start
        self.slot = start if L == 1 else self.slots
        self.last = None
        if packed and L > 1:
            self.last = valid.sum(1)[valid.any(1)].cumsum(0) - 1
