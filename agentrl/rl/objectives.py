"""One small function per formula, each testable on tensors alone. Shapes: B rows, T tokens, V vocab;
per-token quantities live on targets, i.e. [B, T-1] aligned to ids[1:]. Where a knob selects a variant, each variant
is a named function registered here beside its formula, with one fixed signature per kind, and registered with it
its independent re-derivation (`reference=`, a function of agentrl.rl.references that the invariants check the
trainer against); the registries are agentrl.core.variants', and the knob's allowed values are their names:

    ADV_ESTIMATORS  rl.adv_estimator  baseline(r [n]) -> [n] or []         r: one group's rewards
    REWARD_SCALES   rl.scale_rewards  scale(r [n], rewards [B]) -> [] or None (no division)
    RATIO_LEVELS    rl.ratio_level    ratio(logp, old_logp, mask [B, L]) -> [B, L]
    POLICY_LOSSES   rl.policy_loss    term(ratio, adv [B, L], cfg) -> per-token loss [B, L]
    LOSS_MODES      rl.loss_mode      reduce(masked per-token [B, L], mask [B, L], norm_len) -> []
                                      (meta weight: "tokens" or "rows", how microbatches share a minibatch)
    KL_KINDS        rl.kl_kind        k(log_ratio [B, L]) -> [B, L]

`exp` is agentrl.model.kernels.ops.exp: torch.exp's float32 CPU kernel depends on the CPU (docs/numerics.md).
"""
from __future__ import annotations

import torch

from agentrl.core.variants import ADV_ESTIMATORS, KL_KINDS, LOSS_MODES, POLICY_LOSSES, RATIO_LEVELS, REWARD_SCALES
from agentrl.model.kernels.ops import exp
from agentrl.rl import references


@ADV_ESTIMATORS.register("grpo", reference=references.group_mean)
def group_mean_baseline(r: torch.Tensor) -> torch.Tensor:
    """GRPO: every episode's baseline is its group's mean reward."""
    return r.mean()


@ADV_ESTIMATORS.register("rloo", reference=references.others_mean)
def leave_one_out_baseline(r: torch.Tensor) -> torch.Tensor:
    """RLOO: each episode's baseline is the mean reward of the other episodes of its group."""
    return (r.sum() - r) / max(r.numel() - 1, 1)


@REWARD_SCALES.register("none", reference=references.unscaled)
def no_scale(r: torch.Tensor, rewards: torch.Tensor) -> None:
    """Dr. GRPO: advantages are not divided."""
    return None


@REWARD_SCALES.register("group", reference=references.group_std)
def group_std(r: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """The unbiased std of the group's rewards (0 for a single episode)."""
    return r.std(unbiased=True) if r.numel() > 1 else r.new_zeros(())


@REWARD_SCALES.register("batch", reference=references.batch_std)
def batch_std(r: torch.Tensor, rewards: torch.Tensor) -> torch.Tensor:
    """The unbiased std of every reward of the batch (TRL's scale_rewards='batch')."""
    return rewards.std(unbiased=True) if rewards.numel() > 1 else rewards.new_zeros(())


def compute_advantages(rewards: torch.Tensor, group: torch.Tensor, std_scale: bool = False,
                       eps: float = 1e-6, estimator: str = "grpo", scale: str | None = None) -> torch.Tensor:
    """Group-relative advantage [B]: reward minus its baseline (ADV_ESTIMATORS[estimator]), divided by
    (REWARD_SCALES[scale] + eps) unless that scale is None ('none'). scale=None: 'group' if std_scale else 'none'."""
    scale_of = REWARD_SCALES[scale or ("group" if std_scale else "none")]
    baseline = ADV_ESTIMATORS[estimator]
    adv = torch.zeros_like(rewards)
    for g in torch.unique(group):
        rows = group == g
        r = rewards[rows]
        a = r - baseline(r)
        std = scale_of(r, rewards)
        if std is not None:
            a = a / (std + eps)
        adv[rows] = a
    return adv


def masked_mean(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Mean of x over positions where mask is 1 (0 if the mask is empty)."""
    return (x * mask).sum() / mask.sum().clamp(min=1)


@LOSS_MODES.register("token_mean", weight="tokens", reference=references.token_mean)
def token_mean(masked: torch.Tensor, mask: torch.Tensor, norm_len: int | None) -> torch.Tensor:
    """Sum over masked tokens / their count."""
    return masked.sum() / mask.sum().clamp(min=1)


@LOSS_MODES.register("seq_mean_token_mean", weight="rows", reference=references.seq_mean_token_mean)
def seq_mean_token_mean(masked: torch.Tensor, mask: torch.Tensor, norm_len: int | None) -> torch.Tensor:
    """Mean over rows of each row's token mean."""
    return (masked.sum(1) / mask.sum(1).clamp(min=1)).mean()


@LOSS_MODES.register("seq_mean_token_sum", weight="rows", reference=references.seq_mean_token_sum)
def seq_mean_token_sum(masked: torch.Tensor, mask: torch.Tensor, norm_len: int | None) -> torch.Tensor:
    """Mean over rows of each row's token sum."""
    return masked.sum(1).mean()


@LOSS_MODES.register("seq_mean_token_sum_norm", weight="rows",
                      reference=references.seq_mean_token_sum_norm)
def seq_mean_token_sum_norm(masked: torch.Tensor, mask: torch.Tensor, norm_len: int | None) -> torch.Tensor:
    """Total sum / (B * norm_len), norm_len a constant (cfg.loss_norm_len; None: the padded width L, which moves
    with the batch's padding)."""
    return masked.sum() / (mask.shape[0] * (mask.shape[1] if norm_len is None else norm_len))


def aggregate_loss(per_token: torch.Tensor, mask: torch.Tensor, mode: str = "token_mean",
                   norm_len: int | None = None) -> torch.Tensor:
    """Reduce a per-token loss [B, L] to a scalar by LOSS_MODES[mode]."""
    return LOSS_MODES[mode](per_token * mask, mask, norm_len)


@RATIO_LEVELS.register("token", reference=references.token_ratios)
def token_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """PPO/GRPO: one importance ratio per token, r_t = exp(logp_t - old_logp_t)."""
    return exp(logp - old_logp)


MAX_LOG_SEQ_RATIO = 10.0   # as verl: exp(10) already clips; beyond it only overflow waits


@RATIO_LEVELS.register("sequence", reference=references.sequence_ratios)
def sequence_ratio(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """GSPO: one length-normalised ratio per sequence, s = exp(mean of logp - old_logp over its policy tokens), on
    every token of the row as exp(logp - sg(logp) + sg(log s)): its value is s, its gradient s * grad logp_t, so a
    row's mean token loss has the gradient of the sequence-level objective."""
    log_s = ((logp - old_logp) * mask).sum(1) / mask.sum(1).clamp(min=1)
    return exp((logp - logp.detach() + log_s.detach()[:, None]).clamp(max=MAX_LOG_SEQ_RATIO))


def clip_objective(ratio: torch.Tensor, adv: torch.Tensor, low: float, high: float) -> torch.Tensor:
    """PPO per-token loss -min(r A, clip(r, 1 - low, 1 + high) A); high > low is DAPO's clip-higher."""
    surr = torch.min(ratio * adv, ratio.clamp(1 - low, 1 + high) * adv)
    return -surr


def dual_clip(per_token: torch.Tensor, adv: torch.Tensor, c: float) -> torch.Tensor:
    """Dual clip (verl): where A < 0 the per-token loss is at most c * |A|, so one very unlikely bad token (a huge
    ratio) cannot dominate the update."""
    return torch.where(adv < 0, torch.minimum(per_token, -adv * c), per_token)


@KL_KINDS.register("k1", reference=references.k1)
def kl_k1(log_ratio: torch.Tensor) -> torch.Tensor:
    """log r'"""
    return log_ratio


@KL_KINDS.register("k2", reference=references.k2)
def kl_k2(log_ratio: torch.Tensor) -> torch.Tensor:
    """(log r')^2 / 2"""
    return 0.5 * log_ratio ** 2


@KL_KINDS.register("k3", reference=references.k3)
def kl_k3(log_ratio: torch.Tensor) -> torch.Tensor:
    """exp(-log r') - 1 + log r' (unbiased, always >= 0)"""
    return exp(-log_ratio) - 1 + log_ratio


def kl_penalty(logp: torch.Tensor, ref_logp: torch.Tensor, kind: str = "k3") -> torch.Tensor:
    """Per-token estimator KL_KINDS[kind] of KL(pi || ref) on tokens sampled from pi, of log r' = logp - ref_logp
    (Schulman's k1, k2, k3)."""
    return KL_KINDS[kind](logp - ref_logp)


def approx_kl(logp: torch.Tensor, old_logp: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """k3 estimate of KL(old || new) over masked tokens: mean of (r - 1) - log r, r = new / old."""
    log_r = logp - old_logp
    return masked_mean(exp(log_r) - 1 - log_r, mask)


def entropy_bonus(entropy: torch.Tensor, mask: torch.Tensor, coef: float, mode: str = "token_mean",
                  norm_len: int | None = None) -> torch.Tensor:
    """Loss term -coef * aggregated entropy (a positive coef rewards entropy)."""
    return -coef * aggregate_loss(entropy, mask, mode, norm_len)


@POLICY_LOSSES.register("clip", reference=references.clip_term)
def clipped_policy_term(ratio: torch.Tensor, adv: torch.Tensor, cfg) -> torch.Tensor:
    """PPO's clipped surrogate clip_objective(r, A, *cfg.clip_range), with verl's dual clip when cfg.clip_ratio_c."""
    low, high = cfg.clip_range
    per_token = clip_objective(ratio, adv, low, high)
    if cfg.clip_ratio_c is not None:
        per_token = dual_clip(per_token, adv, cfg.clip_ratio_c)
    return per_token


def policy_loss(logp: torch.Tensor, old_logp: torch.Tensor, adv: torch.Tensor, mask: torch.Tensor, cfg):
    """The policy loss over policy tokens: the ratio RATIO_LEVELS[cfg.ratio_level], the per-token term
    POLICY_LOSSES[cfg.policy_loss], aggregated by cfg.loss_mode. logp, old_logp, mask [B, L]; adv [B] or [B, L].
    Returns (loss, stats); clip_frac counts ratios outside cfg.clip_range whatever the term."""
    if adv.dim() == 1:
        adv = adv[:, None].expand_as(logp)
    low, high = cfg.clip_range
    ratio = RATIO_LEVELS[cfg.ratio_level](logp, old_logp, mask)
    per_token = POLICY_LOSSES[cfg.policy_loss](ratio, adv, cfg)
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
