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
    """Keys and values of every layer in one buffer [2, n_layer, B, H, capacity, Dh], which slots hold a token
    [B, capacity], and how many slots are `used`."""

    def __init__(self, n_layer: int, n_head: int, head_dim: int, capacity: int = INITIAL_CAPACITY):
        self.n_layer, self.n_head, self.head_dim = n_layer, n_head, head_dim
        self.capacity, self.used = capacity, 0
        self.kv: torch.Tensor | None = None
        self.valid: torch.Tensor | None = None
        self.bias: torch.Tensor | None = None  # valid as the additive attention mask: 0 or -inf
        self.batch = 0  # rows when allocated: a dense pass over every episode of the batch has this many per slot

    def _buffers(self, rows: int, slots: int):
        return (torch.empty(2, self.n_layer, rows, self.n_head, slots, self.head_dim),
                torch.zeros(rows, slots, dtype=torch.bool), torch.empty(rows, slots))

    def layer(self, i: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Layer i's keys and values, views [B, H, capacity, Dh]."""
        return self.kv[0, i], self.kv[1, i]

    def append(self, valid: torch.Tensor) -> int:
        """Reserve the slots of one chunk, valid [B, L] (zeroed, for the slots nobody writes); returns its first
        slot."""
        rows, width = valid.shape
        if self.valid is None:
            self.kv, self.valid, self.bias = self._buffers(rows, self.capacity)
            self.batch = rows
        if self.used + width > self.capacity:
            self._resize(self.valid.shape[0], max(2 * self.capacity, self.used + width))
        start = self.used
        self.valid[:, start:start + width] = valid
        self.bias[:, start:start + width] = 0.0
        self.bias[:, start:start + width].masked_fill_(~valid, float("-inf"))
        self.kv[..., start:start + width, :] = 0.0
        self.used += width
        return start

    def _resize(self, rows: int, capacity: int, keep: torch.Tensor | None = None) -> None:
        """New buffers with the used slots of every row (or of the rows `keep`) copied over."""
        used = self.used
        kv, valid, bias = self._buffers(rows, capacity)
        if keep is None:
            kv[..., :used, :], valid[:, :used], bias[:, :used] = \
                self.kv[..., :used, :], self.valid[:, :used], self.bias[:, :used]
        else:
            torch.index_select(self.kv[..., :used, :], 2, keep, out=kv[..., :used, :])
            torch.index_select(self.valid[:, :used], 0, keep, out=valid[:, :used])
            torch.index_select(self.bias[:, :used], 0, keep, out=bias[:, :used])
        self.kv, self.valid, self.bias, self.capacity = kv, valid, bias, capacity

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (ascending indices), e.g. the episodes still running."""
        self._resize(rows.numel(), self.capacity, rows)


class Chunk:
    """Which slots of a chunk (valid [B, L], just appended to `cache` at `start`) are computed, where their keys
    go, which rows query, and the additive attention mask [rows that query, 1, L, S] over every slot so far."""

    def __init__(self, valid: torch.Tensor, cache: KVCache, start: int, packed: bool):
        B, L = valid.shape
        S = start + L
        self.width, self.slots, self.packed = L, S, packed
        self.min_rows = min(cache.batch * L, MIN_ROWS)
        if packed:
            self.computed = valid.reshape(-1).nonzero().squeeze(1)
            query_rows = self.computed if L == 1 else valid.any(1).nonzero().squeeze(1)
        else:
            self.computed, query_rows = torch.arange(B * L), torch.arange(B)
        self.row, self.col = (self.computed, None) if L == 1 else (self.computed // L, self.computed % L)
        self.slot = start if L == 1 else self.col + start
        self.all_rows = query_rows.numel() == B
        self.query_rows = query_rows
        self.n_query_rows = query_rows.numel()
        if L == 1:  # one slot per querying row, in the same order
            self.query_row = self.last = None
        else:
            index = torch.full((B,), -1, dtype=torch.long)
            index[query_rows] = torch.arange(self.n_query_rows)
            self.query_row = index[self.row]
            self.last = valid.sum(1)[query_rows].cumsum(0) - 1  # each querying row's last slot among the computed
        # the additive form scaled_dot_product_attention makes of a boolean mask, made once for every layer
        seen = cache.bias[:, :S] if self.all_rows else cache.bias[query_rows, :S]
        if L == 1:
            self.mask = seen[:, None, None]
            return
        seen = cache.valid[:, :S] if self.all_rows else cache.valid[query_rows, :S]
        query_valid = valid if self.all_rows else valid[query_rows]
        mask = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)[None] & seen[:, None, :]  # j visible to i
        if not bool(query_valid.all()):
            # an invalid (padding) query still needs one visible key to keep softmax finite; its output is unused
            mask = mask | (_eye_offset(L, S, S - L)[None] & ~query_valid[:, :, None])
        self.mask = torch.zeros(mask.shape).masked_fill_(~mask, float("-inf"))[:, None]

    def visible(self, buffer: torch.Tensor) -> torch.Tensor:
        """A layer's keys or values [B, H, capacity, Dh] -> those of the querying rows up to this chunk."""
        used = buffer[:, :, :self.slots]
        return used if self.all_rows else used.index_select(0, self.query_rows)

    def queries(self, q: torch.Tensor) -> torch.Tensor:
        """Queries of the computed slots [M, H, Dh] -> [rows that query, H, L, Dh] (zero at invalid slots)."""
        if self.width == 1:
            return q[:, :, None]
        out = q.new_zeros(self.n_query_rows, self.width, *q.shape[1:])
        out[self.query_row, self.col] = q
        return out.transpose(1, 2)

    def outputs(self, y: torch.Tensor) -> torch.Tensor:
        """Attention output [rows that query, H, L, Dh] -> [M, H * Dh] at the computed slots."""
        M = self.computed.numel()
        if self.width == 1:
            return y.reshape(M, -1)
        return y.transpose(1, 2)[self.query_row, self.col].reshape(M, -1)

    def rows(self, layer, x: torch.Tensor) -> torch.Tensor:
        """A linear layer (or a row-wise matmul) of x [M, D] at the dense pass's row count (agentrl.model.packing)."""
        return rowwise(layer, x, self.min_rows)


def _eye_offset(L: int, S: int, offset: int) -> torch.Tensor:
    m = torch.zeros(L, S, dtype=torch.bool)
    m[torch.arange(L), torch.arange(L) + offset] = True
    return m
