"""The sampler's KV cache, laid out in slots, and the plan of one chunk of slots.

Every row of the cache owns the same slots: a chunk appends L slots to every row, and a row with nothing to add at
a slot leaves it invalid, so episodes at different points of their turn structure advance together. Keys and
values live in preallocated buffers [B, H, capacity, Dh]: appending writes only the new slots (the capacity doubles
when full), and rows whose episode ended leave with `keep`. An invalid slot holds zeros (a kernel set that masks
instead of skipping still sees finite keys) and `valid` [B, capacity] says which slots hold a token.

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

    def _buffers(self, rows: int, slots: int):
        return (torch.empty(2, self.n_layer, rows, self.n_head, slots, self.head_dim),
                torch.zeros(rows, slots, dtype=torch.bool))

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's keys and values, views [B, H, capacity, Dh]."""
        return self.kv[0, i], self.kv[1, i]

    def append(self, valid: torch.Tensor) -> int:
        """Reserve the slots of one chunk, valid [B, L] (zeroed, for the slots nobody writes); returns its first
        slot."""
        rows, width = valid.shape
        if self.valid is None:
            self.kv, self.valid = self._buffers(rows, self.capacity)
        if self.used + width > self.capacity:
            self._resize(self.valid.shape[0], max(2 * self.capacity, self.used + width))
        start = self.used
        self.valid[:, start:start + width] = valid
        self.kv[..., start:start + width, :] = 0.0
        self.used += width
        return start

    def _resize(self, rows: int, capacity: int, keep: torch.Tensor | None = None) -> None:
        """New buffers with the used slots of every row (or of the rows `keep`) copied over."""
        used = self.used
        kv, valid = self._buffers(rows, capacity)
        if keep is None:
            kv[..., :used, :], valid[:, :used] = self.kv[..., :used, :], self.valid[:, :used]
        else:
            torch.index_select(self.kv[..., :used, :], 2, keep, out=kv[..., :used, :])
            torch.index_select(self.valid[:, :used], 0, keep, out=valid[:, :used])
        self.kv, self.valid, self.capacity = kv, valid, capacity

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (ascending indices), e.g. the episodes still running."""
        self._resize(rows.numel(), self.capacity, rows)


class Chunk:
    """Which slots of a chunk (valid [B, L], appended to the cache at slot `start`) are computed: their flat
    indices `computed` [M] in [B, L], cache rows `row` [M] and slots `slots` [M] (`slot`: the same, as one integer
    when L == 1), and with `packed` the index among them of each row's last valid slot (`last`, rows that have
    one)."""

    def __init__(self, valid: torch.Tensor, start: int, packed: bool):
        B, L = valid.shape
        self.computed = valid.reshape(-1).nonzero().squeeze(1) if packed else torch.arange(B * L)
        self.row, col = (self.computed, None) if L == 1 else (self.computed // L, self.computed % L)
        self.slots = torch.full_like(self.computed, start) if L == 1 else col + start
        self.slot = start if L == 1 else self.slots
        self.last = None
        if packed and L > 1:
            self.last = valid.sum(1)[valid.any(1)].cumsum(0) - 1
