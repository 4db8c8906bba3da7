"""One small function per formula, each testable on tensors alone. Shapes: B rows, T tokens, V vocab;
per-token quantities live on targets, i.e. [B, T-1] aligned to ids[1:]. Where a knob selects a variant, the
variants are named functions in a registry next to their formula (BASELINES, REWARD_SCALES, POLICY_RATIOS)."""
from __future__ import annotations

import torch

from agentrl.core.config import KL_KINDS, LOSS_MODES


def group_mean_baseline(r: torch.Tensor) -> torch.Tensor:
    """GRPO: every episode's baseline is its group's mean reward."""
    return r.mean()


def leave_one_out_baseline(r: torch.Tensor) -> torch.Tensor:
    """RLOO: each episode's baseline is the mean reward of the other episodes of its group."""
    return (r.sum() - r) / max(r.numel() - 1, 1)


def group_std(r: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """The unbiased std of the group's rewards (0 for a single episode)."""
    return r.std(unbiased=True) if r.numel() > 1 else r.new_zeros(())


def batch_std(r: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """The unbiased std of every reward of the batch (TRL's scale_rewards='batch')."""
    return rewards.std(unbiased=True) if rewards.numel() > 1 else rewards.new_zeros(())


BASELINES = {"grpo": group_mean_baseline, "rloo": leave_one_out_baseline}
REWARD_SCALES = {"none": None, "group": group_std, "batch": batch_std}


def compute_advantages(rewards: torch.Tensor, group: torch.Tensor, std_scale: bool = False,
                       eps: float = 1e-6, estimator: str = "grpo", scale: str | None = None) -> torch.Tensor:
    """Group-relative advantage [B]: reward minus its baseline (BASELINES[estimator]), divided by
    (REWARD_SCALES[scale] + eps) unless scale is 'none'. scale=None: 'group' if std_scale else 'none'."""
    std = REWARD_SCALES[scale or ("group" if std_scale else "none")]
    baseline = BASELINES[estimator]
    adv = torch.zeros_like(rewards)
    for g in torch.unique(group):
        rows = group == g
        r = rewards[rows]
        a = r - baseline(r)
        if std is not None:
            a = a / (std(r, rewards) + eps)
        adv[rows] = a
    return adv


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


def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PPO/GRPO: one importance ratio per token, r_t = exp(logp_t - old_logp_t)."""
    return torch.exp(logp - old_logp)


MAX_LOG_SEQ_RATIO = 10.0   # as verl: exp(10) already clips; beyond it only overflow waits


def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO: one length-normalised ratio per sequence, s = exp(mean of logp - old_logp over its policy tokens), on
    every token of the row as exp(logp - sg(logp) + sg(log s)): its value is s, its gradient s * grad logp_t, so a
    row's mean token loss has the gradient of the sequence-level objective."""
    log_s = ((logp - old_logp) * mask).sum(1) / mask.sum(1).clamp(min=1)
    return torch.exp((logp - logp.detach() + log_s.detach()[:, None]).clamp(max=MAX_LOG_SEQ_RATIO))


POLICY_RATIOS = {"token": token_ratio, "sequence": sequence_ratio}


def clip_objective(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """PPO per-token loss -min(r A, clip(r, 1 - low, 1 + high) A); high > low is DAPO's clip-higher."""
    surr = torch.min(ratio * adv, ratio.clamp(1 - low, 1 + high) * adv)
    return -surr


def dual_clip(per_token: torch.Tensor, adv: torch.Tensor, c: float) -> torch.Tensor:
    """Dual clip (verl): where A < 0 the per-token loss is at most c * |A|, so one very unlikely bad token (a huge
    ratio) cannot dominate the update."""
    return torch.where(adv < 0, torch.minimum(per_token, -adv * c), per_token)


def clipped_surrogate(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, clip_eps: float,
                      clip_eps_high: float | None = None):
    """Token-level PPO loss clip_objective(r, A, eps, eps_high or eps) and the ratio r = exp(logp - old_logp)."""
    ratio = torch.exp(logp - old_logp)
    return clip_objective(ratio, adv, clip_eps, clip_eps if clip_eps_high is None else clip_eps_high), ratio


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
    """Clipped-surrogate loss over policy tokens (ratio per cfg.ratio_level, clip range cfg.clip_range, dual clip
    if cfg.clip_ratio_c), aggregated by cfg.loss_mode. logp, old_logp, mask [B, L]; adv [B] or [B, L].
    Returns (loss, stats)."""
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    low, high = cfg.clip_range
    ratio = POLICY_RATIOS[cfg.ratio_level](logp, old_logp, mask)
    per_token = clip_objective(ratio, adv, low, high)
    if cfg.clip_ratio_c is not None:
        per_token = dual_clip(per_token, adv, cfg.clip_ratio_c)
    loss = aggregate_loss(per_token, mask, cfg.loss_mode, cfg.loss_norm_len)
    with torch.no_grad():
        on = mask > 0
        r = ratio[on] if on.any() else ratio.new_ones(1)
        dev = ratio - 1  # -dev is exact, so with low == high this is |r - 1| > eps
        clipped = torch.where(dev > 0, dev > high, -dev > low).float()
        stats = {
            "clip_frac": float(masked_mean(clipped, mask)),
            "approx_kl": float(approx_kl(logp, old_logp, mask)),
            "ratio_max": float(r.max()),
            "ratio_min": float(r.min()),
        }
    return loss, stats
