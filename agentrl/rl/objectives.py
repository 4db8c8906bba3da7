"""One small function per formula, each testable on tensors alone. Shapes: B rows, T tokens, V vocab;
per-token quantities live on targets, i.e. [B, T-1] aligned to ids[1:]."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from agentrl.config import KL_KINDS, LOSS_MODES


def compute_advantages(rewards: torch.Tensor, group: torch.Tensor, std_scale: bool = False,
                       eps: float = 1e-6) -> torch.Tensor:
    """Group-relative advantage [B]: reward minus its group's mean (optionally / (unbiased group std + eps))."""
    adv = torch.zeros_like(rewards)
    for g in torch.unique(group):
        rows = group == g
        r = rewards[rows]
        a = r - r.mean()
        if std_scale:
            a = a / ((r.std(unbiased=True) if r.numel() > 1 else r.new_zeros(())) + eps)
        adv[rows] = a
    return adv


def selected_log_probs(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """log p(target) per position: logits [B, L, V], targets [B, L] -> [B, L]."""
    return F.log_softmax(logits, dim=-1).gather(-1, targets.unsqueeze(-1)).squeeze(-1)


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of softmax(logits) per position: [..., V] -> [...]."""
    logp = F.log_softmax(logits, dim=-1)
    return -(logp.exp() * logp).sum(-1)


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (0 if the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
                   norm_len: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss [B, L] to a scalar:
    token_mean: sum over masked tokens / their count;  seq_mean_token_mean: mean over rows of each row's mean;
    seq_mean_token_sum: mean over rows of each row's sum;  seq_mean_token_sum_norm: total sum / (B * norm_len),
    norm_len a constant (cfg.loss_norm_len; None: the padded width L, which moves with the batch's padding)."""
    masked = per_token * mask
    if mode == "token_mean":
        return masked.sum() / mask.sum().clamp(min=1)
    if mode == "seq_mean_token_mean":
        return (masked.sum(1) / mask.sum(1).clamp(min=1)).mean()
    if mode == "seq_mean_token_sum":
        return masked.sum(1).mean()
    if mode == "seq_mean_token_sum_norm":
        return masked.sum() / (mask.shape[0] * (mask.shape[1] if norm_len is None else norm_len))
    raise ValueError(f"loss_mode: unknown value {mode!r}; allowed: {', '.join(LOSS_MODES)}")


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_eps: float):
    """PPO per-token loss -min(r A, clip(r, 1-eps, 1+eps) A) and the ratio r = exp(logp - old_logp)."""
    ratio = torch.exp(logp - old_logp)
    surr = torch.min(ratio * adv, ratio.clamp(1 - clip_eps, 1 + clip_eps) * adv)
    return -surr, ratio


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimator of KL(pi || ref) on tokens sampled from pi: k1 = log r', k2 = (log r')^2 / 2,
    k3 = exp(-log r') - 1 + log r', with log r' = logp - ref_logp."""
    log_ratio = logp - ref_logp
    if kind == "k1":
        return log_ratio
    if kind == "k2":
        return 0.5 * log_ratio ** 2
    if kind == "k3":
        return torch.exp(-log_ratio) - 1 + log_ratio
    raise ValueError(f"kl_kind: unknown value {kind!r}; allowed: {', '.join(KL_KINDS)}")


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(old || new) over masked tokens: mean of (r - 1) - log r, r = new / old."""
    log_r = logp - old_logp
    return masked_mean(torch.exp(log_r) - 1 - log_r, mask)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, coef: float, mode: str = "token_mean",
                  norm_len: int | None = None) -> torch.Tensor:
    """Loss term -coef * aggregated entropy (a positive coef rewards entropy)."""
    return -coef * aggregate_loss(entropy, mask, mode, norm_len)


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg):
    """Clipped-surrogate loss over policy tokens, aggregated by cfg.loss_mode.
    logp, old_logp, mask [B, L]; adv [B] or [B, L]. Returns (loss, stats)."""
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    per_token, ratio = clipped_surrogate(logp, old_logp, adv, cfg.clip_eps)
    loss = aggregate_loss(per_token, mask, cfg.loss_mode, cfg.loss_norm_len)
    with torch.no_grad():
        on = mask > 0
        r = ratio[on] if on.any() else ratio.new_ones(1)
        clipped = ((ratio - 1).abs() > cfg.clip_eps).float()
        stats = {
            "clip_frac": float(masked_mean(clipped, mask)),
            "approx_kl": float(approx_kl(logp, old_logp, mask)),
            "ratio_max": float(r.max()),
            "ratio_min": float(r.min()),
        }
    return loss, stats
