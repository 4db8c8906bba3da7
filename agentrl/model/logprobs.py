"""Log-probabilities and entropy from logits: the two formulas every policy backend and the trainer share."""
from __future__ import annotations

import torch
import torch.nn.functional as F


def selected_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits [B, L, V], targets [B, L] -> [B, L]."""
    return F.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits) per position: [..., V] -> [...]."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)
