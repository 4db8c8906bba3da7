"""Log-probabilities, entropy and one draw from logits: the formulas every policy backend, the sampler and the
trainer share."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from agentrl.model.kernels.ops import exp

# PyTorch's fused CPU log_softmax is off by up to ~2e-4 nats in float32 on a 151,936-entry vocabulary, a bias and not
# noise (docs/labs.md), while logits - logsumexp(logits) stays within ~2e-6. Vocabularies up to this size keep the
# fused kernel, with which TinyAgent's committed numbers were made.
FUSED_LOG_SOFTMAX_MAX_VOCAB = 4096


def log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """log softmax over the last dimension, accurate in float32 on large vocabularies too."""
    if logits.shape[-1] <= FUSED_LOG_SOFTMAX_MAX_VOCAB:
        return F.log_softmax(logits, dim=-1)
    return logits - torch.logsumexp(logits, dim=-1, keepdim=True)


def selected_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits [B, L, V], targets [B, L] -> [B, L]."""
    if logits.shape[-1] <= FUSED_LOG_SOFTMAX_MAX_VOCAB:
        return F.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)
    # the target's logit minus the normaliser: no [..., V] tensor of log-probs is made, forward or backward
    return logits.gather(-1, targets.unsqueeze(-1)).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits) per position: [..., V] -> [...]."""
    logp = log_softmax(logits)
    return -(exp(logp) * logp).sum(-1)


def draw(logits: torch.Tensor, generator: torch.Generator, entropy: bool = False):
    """One token per row from softmax(logits) [rows, V] -> (tokens [rows], their log-probs [rows]), and with
    `entropy` the entropy of each row's distribution [rows] (nats) as a third element, from the same probabilities.

    Inverse-CDF sampling in float64, one uniform per row (torch.multinomial's one-sample path draws an exponential for
    every vocabulary entry: 33 ms per call on [16, 151936], two thirds of the lab's sampling time). Small vocabularies
    sum softmax's probabilities (PyTorch's own kernel, the same bits on every CPU; torch.exp of a float64 is MKL's);
    large ones exponentiate in float64 (float32 probabilities of a 151,936-entry vocabulary lose the tail)."""
    if logits.shape[-1] <= FUSED_LOG_SOFTMAX_MAX_VOCAB:
        cdf = F.softmax(logits.double(), dim=-1).cumsum(-1)
        u = torch.rand(cdf.shape[0], 1, generator=generator, dtype=torch.float64, device=generator.device)
        u = u.to(cdf.device) * cdf[:, -1:]
        token = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=cdf.shape[-1] - 1)
        logp = log_softmax(logits)
        drawn = token, logp.gather(1, token[:, None]).squeeze(1)
        return (*drawn, -(exp(logp) * logp).sum(-1)) if entropy else drawn
    z = logits.double()
    z = z - z.max(-1, keepdim=True).values
    e = z.exp()
    cdf = e.cumsum(-1)                                    # unnormalised; the last column is the normaliser
    u = torch.rand(z.shape[0], 1, generator=generator, dtype=torch.float64, device=generator.device).to(z.device)
    u = u * cdf[:, -1:]
    token = torch.searchsorted(cdf, u, right=True).squeeze(1).clamp(max=z.shape[-1] - 1)  # cdf[t-1] <= u < cdf[t]
    logp = z.gather(1, token[:, None]).squeeze(1) - cdf[:, -1].log()
    if not entropy:
        return token, logp.to(logits.dtype)
    total = cdf[:, -1]
    return token, logp.to(logits.dtype), (total.log() - (e * z).sum(-1) / total).to(logits.dtype)
