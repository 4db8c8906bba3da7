"""TinyAgent: a small causal transformer (pre-LN, tied embeddings, fixed sinusoidal positions), fp32.

Two ways to run it:
- `forward(ids)`: the trainer's full causal pass over right-padded rows, ids [B, T] -> logits [B, T, V].
- `forward_cached(ids, pos, valid, cache)`: the sampler's incremental pass. The cache is laid out in *slots*
  shared by all rows; a row with nothing to add at a slot writes an invalid (masked) slot, so episodes at
  different points of their turn structure advance together. Attention sees only valid earlier slots, and
  `pos` is each token's position in its own row, so the result equals the full pass on the compact row.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F



@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 64
    n_layer: int = 3
    n_head: int = 4
    d_ff: int = 256
    max_len: int = 1024
    tie_embeddings: bool = True
    emb_std: float = 1.0   # token embeddings as large as the positional signal: see docs/design.md (held-out generalization)

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

    def forward(self, x, mask=None, cache=None):
        """x [B, L, D]; mask [B, 1, L, S] bool (None = causal over L); cache: dict with k, v [B, H, S0, Dh]."""
        B, L, D = x.shape
        q, k, v = self.qkv(x).split(D, dim=2)
        q, k, v = (t.view(B, L, self.n_head, D // self.n_head).transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            if "k" in cache:
                k = torch.cat([cache["k"], k], dim=2)
                v = torch.cat([cache["v"], v], dim=2)
            cache["k"], cache["v"] = k, v
        if mask is None:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).reshape(B, L, D))


class Block(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.attn = Attention(cfg)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x, mask=None, cache=None):
        x = x + self.attn(self.ln1(x), mask, cache)
        return x + self.mlp(self.ln2(x))


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

    def new_cache(self) -> dict:
        return {"layers": [{} for _ in self.blocks], "valid": None}

    def forward_cached(self, ids, pos, valid, cache) -> torch.Tensor:
        """ids, pos, valid [B, L] (one chunk of slots) -> logits [B, L, V]; appends the chunk to the cache."""
        B, L = ids.shape
        prev = cache["valid"]
        all_valid = valid if prev is None else torch.cat([prev, valid], dim=1)  # [B, S]
        cache["valid"] = all_valid
        S = all_valid.shape[1]
        causal = torch.ones(L, S, dtype=torch.bool).tril(diagonal=S - L)  # slot j visible to chunk query i
        mask = causal[None] & all_valid[:, None, :]
        # an invalid (padding) query still needs one visible key to keep softmax finite; its output is unused
        mask = mask | (_eye_offset(L, S, S - L)[None] & ~valid[:, :, None])
        x = self.tok_emb(ids) + self.pos_table[pos]
        for block, layer_cache in zip(self.blocks, cache["layers"]):
            x = block(x, mask[:, None], layer_cache)
        return self._logits(x)


def _eye_offset(L: int, S: int, offset: int) -> torch.Tensor:
    m = torch.zeros(L, S, dtype=torch.bool)
    m[torch.arange(L), torch.arange(L) + offset] = True
    return m
