"""TinyAgent: a small causal transformer (pre-LN, tied embeddings, fixed sinusoidal positions), fp32.

Two ways to run it:
- `forward(ids)`: the trainer's full causal pass over right-padded rows, ids [B, T] -> logits [B, T, V].
- `forward_cached(ids, pos, valid, cache, last)`: the sampler's incremental pass over one chunk of *slots* of a
  `KVCache` (agentrl.model.cache): slots are shared by all rows and a row with nothing to add at a slot leaves it
  invalid (masked), so episodes at different points of their turn structure advance together. Attention sees
  only valid earlier slots, and `pos` is each token's position in its own row, so the result equals the full pass
  on the compact row. With `last`, only the valid slots are computed (bit-identical at those slots).

TinyAgent is a policy backend (agentrl.backends.base): `sampler`, `logits`, `log_probs`, `frozen_log_probs`,
and `describe` wrap the passes above, and the sampler, trainer, evaluation and invariants call only those.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from agentrl.model.cache import Chunk, KVCache
from agentrl.model.logprobs import entropy_from_logits, selected_log_probs
from agentrl.model.packing import MIN_ROWS, pad_rows, real_positions, rowwise


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 64
    n_layer: int = 3
    n_head: int = 4
    d_ff: int = 256
    max_len: int = 1024
    tie_embeddings: bool = True
    emb_std: float = 1.0   # token embeddings as large as the positional signal (docs/design.md)

    def to_dict(self) -> dict:
        return asdict(self)


def sinusoid_table(max_len: int, d: int) -> torch.Tensor:
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = torch.exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(max_len, d)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_head = cfg.n_head
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)

    def forward(self, x):
        """Causal self-attention over x [B, T, D]."""
        B, T, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(B, T, D))

    def packed(self, x, real: torch.Tensor, B: int, T: int, min_rows: int):
        """Causal self-attention of the real tokens x [N, D] (flat positions `real` of [B, T]) on the padded
        layout, zeros at the padding."""
        D = x.shape[1]
        qkv = x.new_zeros(B * T, 3 * D)
        qkv[real] = rowwise(self.qkv, x, min_rows)
        q, k, v = qkv.view(B, T, 3 * D).split(D, dim=2)
        q, k, v = (t.view(B, T, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return rowwise(self.proj, y.transpose(1, 2).reshape(B * T, D)[real], min_rows)

    def cached(self, x, chunk: Chunk, keys: torch.Tensor, values: torch.Tensor):
        """x [M, D] at the chunk's computed slots: writes their keys and values into this layer's cache
        [B, H, capacity, Dh], attends from them to every visible slot, returns [M, D]."""
        M, D = x.shape
        q, k, v = chunk.rows(self.qkv, x).split(D, dim=1)
        q, k, v = (t.view(M, self.n_head, D // self.n_head) for t in (q, k, v))
        keys[chunk.row, :, chunk.slot] = k
        values[chunk.row, :, chunk.slot] = v
        y = F.scaled_dot_product_attention(chunk.queries(q), chunk.visible(keys), chunk.visible(values),
                                           attn_mask=chunk.mask)
        return chunk.rows(self.proj, chunk.outputs(y))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))

    def mlp_rows(self, x, min_rows: int):
        up, act, down = self.mlp
        return rowwise(down, act(rowwise(up, self.ln2(x), min_rows)), min_rows)

    def packed(self, x, real: torch.Tensor, B: int, T: int, min_rows: int):
        x = x + self.attn.packed(self.ln1(x), real, B, T, min_rows)
        return x + self.mlp_rows(x, min_rows)

    def cached(self, x, chunk: Chunk, keys, values):
        # the modules' own functional calls, without the module calls around them (the sampler's per-token cost)
        D = x.shape[1]
        x = x + self.attn.cached(F.layer_norm(x, (D,), self.ln1.weight, self.ln1.bias, self.ln1.eps), chunk,
                                 keys, values)
        up, _, down = self.mlp
        h = F.layer_norm(x, (D,), self.ln2.weight, self.ln2.bias, self.ln2.eps)
        return x + chunk.rows(down, F.gelu(chunk.rows(up, h)))


class TinyAgent(nn.Module):
    def __init__(self, cfg: ModelConfig, generator: torch.Generator | None = None):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.register_buffer("pos_table", sinusoid_table(cfg.max_len, cfg.d_model), persistent=False)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_weights(generator if generator is not None else torch.Generator().manual_seed(0))

    @torch.no_grad()
    def init_weights(self, generator: torch.Generator):
        """GPT-2 style init drawn from an explicit generator (never the global RNG)."""
        for name, p in self.named_parameters():
            if name.endswith("bias"):
                p.zero_()
            elif p.dim() == 1:  # LayerNorm gains
                p.fill_(1.0)
            else:
                std = 0.02 / math.sqrt(2 * self.cfg.n_layer) if name.endswith(("proj.weight", "mlp.2.weight")) else 0.02
                if name == "tok_emb.weight":
                    std = self.cfg.emb_std
                p.normal_(0.0, std, generator=generator)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _logits(self, h):
        return F.linear(self.ln_f(h), self.tok_emb.weight if self.head is None else self.head.weight)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] (right padding is harmless: queries never see later keys) -> logits [B, T, V]."""
        T = ids.shape[1]
        x = self.tok_emb(ids) + self.pos_table[:T]
        for block in self.blocks:
            x = block(x)
        return self._logits(x)

    def forward_packed(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ids [B, T], lengths [B] -> logits [N, V] at each row's first lengths[b] positions (row-major, N =
        lengths.sum()), computing nothing else; bit-identical to forward(ids) there (agentrl.model.packing). No
        gradient: the parameter gradients would sum over other rows than the dense pass's."""
        if torch.is_grad_enabled():
            raise RuntimeError("forward_packed is a no-grad pass (use forward for training)")
        B, T = ids.shape
        real = real_positions(lengths, T)
        min_rows = min(B * T, MIN_ROWS)
        x = self.tok_emb(ids.reshape(-1)[real]) + self.pos_table[real % T]
        for block in self.blocks:
            x = block.packed(x, real, B, T, min_rows)
        return rowwise(self._logits, x, min_rows)

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layer, self.cfg.n_head, self.cfg.d_model // self.cfg.n_head)

    def forward_cached(self, ids, pos, valid, cache: KVCache, last: bool = False) -> torch.Tensor:
        """ids, pos, valid [B, L]: one chunk of slots, appended to the cache. Returns the logits of every slot
        [B, L, V]; or, with `last`, only those after each row's last valid slot, for the rows that have one
        [rows, V], and then only the valid slots are computed."""
        B, L = ids.shape
        chunk = Chunk(valid, cache, cache.append(valid), packed=last)
        x = F.embedding(ids.reshape(-1)[chunk.computed], self.tok_emb.weight) + \
            self.pos_table[pos.reshape(-1)[chunk.computed]]
        for i, block in enumerate(self.blocks):
            x = block.cached(x, chunk, *cache.layer(i))
        if not last:
            return chunk.rows(self._logits, x).view(B, L, -1)
        return chunk.rows(self._logits, x if L == 1 else x[chunk.last])

    # ---------------------------------------------------------------- the policy-backend interface

    kind = "tinyagent"

    def describe(self) -> dict:
        return {"backend": self.kind, "parameters": self.num_params(), "config": self.cfg.to_dict()}

    def sampler(self, pad_id: int) -> CachedSampler:
        return CachedSampler(self, pad_id)

    def logits(self, ids: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """The full pass's logits after every position [B, T, V], or only at the positions `at` [B, T] marks [N, V]."""
        z = self(ids)
        return z if at is None else z[at]

    def log_probs(self, ids: torch.Tensor, at: torch.Tensor | None = None, temperature: float = 1.0,
                  entropy: bool = False):
        """The trainer's differentiable pass: log p(ids[1:]) of softmax(logits / temperature) [B, T-1] and, if
        asked, its entropy [B, T-1]. TinyAgent is small enough to compute every position (`at` is a hint)."""
        logits = self(ids)[:, :-1] / temperature
        logp = selected_log_probs(logits, ids[:, 1:])
        return logp, (entropy_from_logits(logits) if entropy else None)

    def frozen_log_probs(self, ids: torch.Tensor, lengths: torch.Tensor, at: torch.Tensor | None = None,
                         temperature: float = 1.0, entropy: bool = False):
        """log_probs without gradient (called under torch.no_grad) from the real tokens only (forward_packed):
        bit-identical to the dense pass wherever the input token is real and 0 where it is padding (no mask covers
        those: every log-ratio there is exp(logp - 0) <= 1). Returns (logp, entropy or None)."""
        B, T = ids.shape
        logits = self.forward_packed(ids, lengths)
        inputs = real_positions(lengths, T)                # flat [B, T] positions of the computed logits
        predicts = (inputs % T) < T - 1                    # ... that have a target in ids[1:]
        at = inputs[predicts]
        at = at - at // T                                  # the same positions in [B, T-1]
        logits = logits[predicts] / temperature
        logp = selected_log_probs(logits, ids[:, 1:].reshape(-1)[at])
        out = logp.new_zeros(B * (T - 1)).index_put_((at,), logp).view(B, T - 1)
        if not entropy:
            return out, None
        return out, logp.new_zeros(B * (T - 1)).index_put_((at,), entropy_from_logits(logits)).view(B, T - 1)


class CachedSampler:
    """TinyAgent's KV-cached sampling state over a batch of rows (agentrl.backends.base.Sampler)."""

    def __init__(self, model: TinyAgent, pad_id: int):
        self.model, self.pad_id = model, pad_id
        self.cache = model.new_cache()
        self.lengths: torch.Tensor | None = None   # tokens in each cache row

    def append(self, chunks: list[list[int]]) -> torch.Tensor:
        """One non-empty chunk of tokens per row -> logits after each row's last token [rows, V]."""
        if self.lengths is None:
            self.lengths = torch.zeros(len(chunks), dtype=torch.long)
        n = torch.tensor([len(c) for c in chunks])
        L = int(n.max())
        offs = torch.arange(L)[None]
        pos = (self.lengths[:, None] + offs).clamp(max=self.model.cfg.max_len - 1)
        logits = self.model.forward_cached(pad_rows(chunks, self.pad_id, L), pos, offs < n[:, None], self.cache,
                                           last=True)
        self.lengths += n
        return logits

    def step(self, tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """tokens [rows, 1] (padding where not active), active [rows] -> logits after them [active rows, V]."""
        logits = self.model.forward_cached(tokens, self.lengths[:, None], active[:, None], self.cache, last=True)
        self.lengths += active
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (ascending), the episodes still running."""
        self.cache.keep(rows)
        self.lengths = self.lengths[rows]
