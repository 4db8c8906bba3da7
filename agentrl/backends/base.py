"""The policy-backend interface: everything the rest of the pipeline asks of a policy.

A backend is a torch.nn.Module (the optimizer, `copy.deepcopy` and `state_dict` work on it as on any module) with:

- `sampler(pad_id) -> Sampler`: batched, KV-cached sampling state; the rollout (agentrl.rl.rollout) draws each
  token from the logits it returns, so the sampled ids and their log-probs are the rollout's, at its temperature;
- `log_probs(ids, at, temperature, entropy)`: the trainer's differentiable pass, log p(ids[1:]) [B, T-1] of
  softmax(logits / temperature) (and its entropy), needed only at the positions `at` [B, T-1] marks (a backend
  may compute more; the rest is never read except as a finite number times a zero mask);
- `frozen_log_probs(ids, lengths, at, temperature, entropy)`: the same without gradient (old, reference and
  dashboard log-probs), from rows of the given real lengths;
- `logits(ids, at)`: the plain full forward's logits after each position [B, T, V], or at the positions `at`
  [B, T] marks [N, V] (the invariants' independent references and the full-recompute bench baseline);
- `describe() -> {"backend", "parameters", "config"}`.

A backend module registers a `BackendSpec` under its name in agentrl.backends.registry.BACKENDS: how to build a
model from a described config, save a checkpoint and load one, and the invariants' thresholds its rounding needs
(its bench, if it has one, is registered in agentrl.bench). Adding a backend is that one module (plus its name and
module in the registry's `builtin` when it ships with the project, so that it loads on first lookup by name).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch


class Sampler(Protocol):
    """KV-cached sampling state of a batch of rows (episodes); rows leave with `keep` when their episode ends."""

    def append(self, chunks: list[list[int]]) -> torch.Tensor:
        """One non-empty chunk of token ids per row -> logits after each row's last token [rows, V]."""

    def step(self, tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        """tokens [rows, 1] (any id where not active), active [rows] bool -> logits after them [active rows, V]."""

    def keep(self, rows: torch.Tensor) -> None:
        """Keep only `rows` (ascending indices)."""


@runtime_checkable
class PolicyBackend(Protocol):
    kind: str

    def describe(self) -> dict: ...

    def sampler(self, pad_id: int) -> Sampler: ...

    def logits(self, ids: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor: ...

    def log_probs(self, ids: torch.Tensor, at: torch.Tensor | None = None, temperature: float = 1.0,
                  entropy: bool = False) -> tuple[torch.Tensor, torch.Tensor | None]: ...

    def frozen_log_probs(self, ids: torch.Tensor, lengths: torch.Tensor, at: torch.Tensor | None = None,
                         temperature: float = 1.0, entropy: bool = False
                         ) -> tuple[torch.Tensor, torch.Tensor | None]: ...


@dataclass(frozen=True)
class BackendSpec:
    """A policy backend as the registry holds it."""
    name: str
    doc: str
    from_config: Callable            # config dict (describe()["config"]) -> a fresh model
    save: Callable                   # (model, path, tokenizer_hash, extra | None) -> None
    load: Callable                   # (path, tok, expect=None) -> (model, extra); tok has .hash (and len() where
                                     # expect, the config the checkpoint must have, is checked against it)
    read: Callable | None = None     # path -> {"state_dict", "extra"} without building a model (resume, diffs)
    thresholds: dict = field(default_factory=dict)   # {invariant: (relation, threshold)} where its rounding needs
