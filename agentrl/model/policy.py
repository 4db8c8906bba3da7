"""TinyAgent: a small causal transformer (pre-LN, tied embeddings, fixed sinusoidal positions), fp32.

Every pass runs on packed rows (the tokens of all rows one after another, [N, D]) through the model's kernel set
(agentrl.model.kernels; by default the fixed-order kernels, whose per-token results do not depend on which other
tokens share the call):
- `forward(ids)`: every position of right-padded rows, ids [B, T] -> logits [B, T, V].
- `forward_packed(ids, lengths)`: only each row's first lengths[b] tokens -> logits [N, V]; the trainer's pass
  (with gradients) and the frozen pre-update pass. Bit-identical to forward(ids) at those positions.
- `forward_cached(ids, pos, valid, cache, last)`: the sampler's incremental pass over one chunk of *slots* of a
  `KVCache` (agentrl.model.cache): slots are shared by all rows and a row with nothing to add at a slot leaves it
  invalid, so episodes at different points of their turn structure advance together. A query attends to the valid
  slots of its row up to its own, in order: the same keys, in the same order, as the packed pass over that row, so
  the sampler's log-probs are the trainer's bit for bit.

TinyAgent is a policy backend (agentrl.backends.base): `sampler`, `logits`, `log_probs`, `frozen_log_probs`,
and `describe` wrap the passes above, and the sampler, trainer, evaluation and invariants call only those.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn as nn
import torch.nn.functional as F

from agentrl.model.block import Block, check, decode_step, tensors
from agentrl.model.cache import Chunk, KVCache
from agentrl.model.kernels.ops import exp
from agentrl.model.kernels.registry import KERNELS
from agentrl.model.logprobs import entropy_from_logits, selected_log_probs
from agentrl.model.packing import pad_rows, real_positions, row_starts


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int = 64
    n_layer: int = 3
    n_head: int = 4
    d_ff: int = 256
    max_len: int = 1024
    tie_embeddings: bool = True
    emb_std: float = 1.0   # token embeddings as large as the positional signal (docs/deviations.md)

    def to_dict(self) -> dict:
        return asdict(self)


def sinusoid_table(max_len: int, d: int) -> torch.Tensor:
    pos = torch.arange(max_len, dtype=torch.float32)[:, None]
    freq = exp(torch.arange(0, d, 2, dtype=torch.float32) * (-math.log(10000.0) / d))
    table = torch.zeros(max_len, d)
    table[:, 0::2] = torch.sin(pos * freq)
    table[:, 1::2] = torch.cos(pos * freq)
    return table


class TinyAgent(nn.Module):
    block = Block   # the layer (agentrl.model.block); a subclass may name another

    def __init__(self, cfg: ModelConfig, generator: torch.Generator | None = None, kernels: str = "fixed"):
        super().__init__()
        self.cfg = cfg
        self.tok_emb = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.register_buffer("pos_table", sinusoid_table(cfg.max_len, cfg.d_model), persistent=False)
        self.blocks = nn.ModuleList(self.block(cfg) for _ in range(cfg.n_layer))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = None if cfg.tie_embeddings else nn.Linear(cfg.d_model, cfg.vocab_size, bias=False)
        self.init_weights(generator if generator is not None else torch.Generator().manual_seed(0))
        self.use_kernels(kernels)

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

    def use_kernels(self, name: str) -> TinyAgent:
        """Run on another kernel set (agentrl.model.kernels.KERNELS); the weights are unchanged. Decided here, at
        start-up: that the kernels compute every module the blocks declare (agentrl.model.block.check: else one
        line), and whether the set's decode step can run them (agentrl.model.block.decode_mismatch)."""
        self.kernels = KERNELS[name]
        for block in self.blocks:
            check(block, self.kernels)
        self.decode_step()
        return self

    def decode_step(self):
        """The kernel set's one-call decode step (each layer's activation bound), or None where it has none or
        cannot run these blocks."""
        if getattr(self, "_decode", (None,))[0] is not self.kernels:   # decided once per kernel set
            self._decode = (self.kernels, decode_step(self.blocks, self.kernels, self.ln_f.eps))
        return self._decode[1]

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def _logits(self, h):
        return self.kernels.linear(self.ln_f(h), self.tok_emb.weight if self.head is None else self.head.weight)

    def _packed(self, ids: torch.Tensor, pos: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """Packed rows: token ids [N], their positions in their rows [N], row starts [B + 1] -> logits [N, V]."""
        x = self.tok_emb(ids) + self.pos_table[pos]
        for block in self.blocks:
            x = block(x, starts, self.kernels)
        return self._logits(x)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """ids [B, T] (right padding is harmless: queries never see later keys) -> logits [B, T, V]."""
        B, T = ids.shape
        pos = torch.arange(T).repeat(B)
        return self._packed(ids.reshape(-1), pos, row_starts(torch.full((B,), T))).view(B, T, -1)

    def forward_packed(self, ids: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        """ids [B, T], lengths [B] -> logits [N, V] at each row's first lengths[b] positions (row-major, N =
        lengths.sum()), computing nothing else."""
        T = ids.shape[1]
        real = real_positions(lengths, T)
        return self._packed(ids.reshape(-1)[real], real % T, row_starts(lengths))

    def new_cache(self) -> KVCache:
        return KVCache(self.cfg.n_layer, self.cfg.n_head, self.cfg.d_model // self.cfg.n_head)

    def forward_cached(self, ids, pos, valid, cache: KVCache, last: bool = False,
                       weights: list[torch.Tensor] | None = None) -> torch.Tensor:
        """ids, pos, valid [B, L]: one chunk of slots, appended to the cache. Returns the logits of every slot
        [B, L, V]; or, with `last`, only those after each row's last valid slot, for the rows that have one
        [rows, V], and then only the valid slots are computed. `weights`: decode_weights(), if the caller holds
        them."""
        B, L = ids.shape
        chunk = Chunk(valid, cache, cache.append(valid), packed=last)
        x = F.embedding(ids.reshape(-1)[chunk.computed], self.tok_emb.weight) + \
            self.pos_table[pos.reshape(-1)[chunk.computed]]
        decode = None if torch.is_grad_enabled() else self.decode_step()
        if decode is not None:   # the loop below, in one call
            weights = weights or self.decode_weights()
            logits = decode(x, weights[:-3], cache.kv, cache.valid, chunk.row, chunk.slots, self.blocks[0].ln1.eps,
                            weights[-3:], self.cfg.vocab_size, chunk.last if last and L > 1 else None)
            return logits if last else logits.view(B, L, -1)
        for i, block in enumerate(self.blocks):
            x = block.cached(x, chunk, *cache.layer(i), cache.valid, self.kernels)
        if not last:
            return self._logits(x).view(B, L, -1)
        return self._logits(x if L == 1 else x[chunk.last])

    def decode_weights(self) -> list[torch.Tensor] | None:
        """Every block's tensors in the order the decode step declares (KernelSet.decode_layout), then the final
        layer norm's and the output layer's, as it takes them (None where this model does not sample through one)."""
        if self.decode_step() is None:
            return None
        declared = self.kernels.decode_layout()
        out = [t for b in self.blocks for t in tensors(b, declared)]
        head = self.tok_emb.weight if self.head is None else self.head.weight
        return self.kernels.decode_weights(out) + self.kernels.head_weights(self.ln_f.weight, self.ln_f.bias, head)

    # ---------------------------------------------------------------- the policy-backend interface

    kind = "tinyagent"

    def describe(self) -> dict:
        return {"backend": self.kind, "parameters": self.num_params(), "config": self.cfg.to_dict()}

    def sampler(self, pad_id: int) -> CachedSampler:
        return CachedSampler(self, pad_id)

    def logits(self, ids: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        """The logits after every position [B, T, V], or only at the positions `at` [B, T] marks [N, V] (each
        row's tokens up to its last marked one are computed)."""
        if at is None:
            return self(ids)
        T = ids.shape[1]
        lengths = (at * torch.arange(1, T + 1, device=at.device)).amax(1)
        return self.forward_packed(ids, lengths)[at.reshape(-1)[real_positions(lengths, T)]]

    def _row_log_probs(self, ids: torch.Tensor, lengths: torch.Tensor, temperature: float, entropy: bool):
        """log p(ids[1:]) [B, T-1] (and the entropy [B, T-1] if asked) from each row's first lengths[b] tokens: the
        positions with a target computed, 0 elsewhere."""
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

    def log_probs(self, ids: torch.Tensor, at: torch.Tensor | None = None, temperature: float = 1.0,
                  entropy: bool = False):
        """The trainer's differentiable pass: log p(ids[1:]) of softmax(logits / temperature) [B, T-1] and, if
        asked, its entropy [B, T-1], at least where `at` [B, T-1] is set (each row's tokens up to its last such
        position are computed, 0 is returned past them)."""
        B, T = ids.shape
        if at is None:
            lengths = torch.full((B,), T)
        else:   # a target at t is read from the logits after token t: tokens 0..t of the row
            lengths = (at * torch.arange(1, T, device=at.device)).amax(1) if T > 1 else torch.zeros(B, dtype=torch.long)
        return self._row_log_probs(ids, lengths, temperature, entropy)

    def frozen_log_probs(self, ids: torch.Tensor, lengths: torch.Tensor, at: torch.Tensor | None = None,
                         temperature: float = 1.0, entropy: bool = False):
        """log_probs without gradient (called under torch.no_grad) from the real tokens only: bit-identical to
        log_probs wherever both compute, 0 where the input token is padding."""
        return self._row_log_probs(ids, lengths, temperature, entropy)


class CachedSampler:
    """TinyAgent's KV-cached sampling state over a batch of rows (agentrl.backends.base.Sampler)."""

    def __init__(self, model: TinyAgent, pad_id: int):
        self.model, self.pad_id = model, pad_id
        self.cache = model.new_cache()
        self.weights = model.decode_weights()      # packed once: the weights do not change while a batch samples
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
                                           last=True, weights=self.weights)
        self.lengths += n
        return logits

    def step(self, tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """tokens [rows, 1] (padding where not active), active [rows] -> logits after them [active rows, V]."""
        logits = self.model.forward_cached(tokens, self.lengths[:, None], active[:, None], self.cache, last=True,
                                           weights=self.weights)
        self.lengths += active
        return logits

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (ascending), the episodes still running."""
        self.cache.keep(rows)
        self.lengths = self.lengths[rows]
