"""Independent references for the invariants (agentrl.rl.invariants).

Each quantity a check compares the trainer against is re-derived here from its definition, by code that calls
nothing in agentrl.rl.objectives or agentrl.rl.trainer: the policy-token mask from the owners the sampler
recorded, advantages from the rewards by the formula, log-probs from a fresh full forward (no cache), the loss
token by token. A bug in one of the trainer's functions therefore cannot move both sides of a check. Plain and
slow on purpose (loops over groups, rows and tokens, float64 after the logits); only the invariants call it.
Every variant of the objective has its re-derivation here, registered together with the trainer's formula in one
registration (agentrl.rl.objectives: `reference=`): a variant without one is refused by the invariants in one line,
never checked against another variant's formula.
Log-probs are derived only at the positions a check reads (the policy's tokens): a backend with a large
vocabulary then never materialises [B, T, V] logits.
"""
from __future__ import annotations

import math

import torch

from agentrl.core.knobs import ConfigError
from agentrl.core.variants import (
    ADV_ESTIMATORS,
    KL_KINDS,
    LOSS_MODES,
    OBJECTIVE,
    POLICY_LOSSES,
    RATIO_LEVELS,
    REWARD_SCALES,
)
from agentrl.rl.rollout import OWNER

LOG2E = 1.0 / math.log(2.0)


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x as 2^(x log2 e) (float64 here): PyTorch's own exp2, the same bits on every CPU, where torch.exp of a
    float64 is MKL's, whose last bits depend on the CPU (docs/numerics.md)."""
    return torch.exp2(x * LOG2E)


NO_GRAD_ELEMENTS = 2**27   # a float64 [positions, vocab] log-softmax of at most 1 GiB per pass without gradient
ADV_EPS = 1e-6   # the advantage formula's epsilon: (r - group mean) / (unbiased group std + eps)

# The re-derivation of each variant, one signature per kind (the registry that holds it with its formula):
#   ADV_ESTIMATORS  (r, mates) -> baseline           REWARD_SCALES  (mates, rewards) -> std or None
#   RATIO_LEVELS    (lps, olds) -> a ratio per token POLICY_LOSSES  (r, a, cfg) -> a token's loss
#   LOSS_MODES      (row sums, counts, cfg) -> loss  KL_KINDS       x -> KL(pi || ref) per token


def reference(registry, name: str):
    """The re-derivation registered with the variant `name` of one of the objective's registries; a one-line
    ConfigError for a variant without one (or an unknown name)."""
    found = registry.meta(name).get("reference")
    if found is None:
        raise ConfigError(f"{registry.field}: {name!r} has no independent re-derivation (the invariants need one: "
                          "register the variant with reference=, a function of agentrl.rl.references)")
    return found


# KL(pi || ref) per sampled token, x = log pi(token) - log ref(token) (Schulman's k1, k2, k3)
def k1(x):
    return x


def k2(x):
    return x * x / 2


def k3(x):
    return exp(-x) - 1 + x


def policy_token_mask(trajs: list, width: int) -> torch.Tensor:
    """[B, width-1]: 1 where target ids[j+1] was sampled by the policy, read off each trajectory's owners."""
    out = torch.zeros(len(trajs), width - 1)
    for i, t in enumerate(trajs):
        for j in range(1, len(t.owner)):
            if t.owner[j] == OWNER["policy"]:
                out[i, j - 1] = 1.0
    return out


def check_derivable(cfg) -> None:
    """A one-line ConfigError unless every variant cfg names has its re-derivation here."""
    for registry, name in zip(OBJECTIVE, (cfg.adv_estimator, cfg.reward_scale, cfg.ratio_level, cfg.policy_loss,
                                          cfg.loss_mode, cfg.kl_kind)):
        reference(registry, name)


def unbiased_std(xs: list[float]) -> float:
    if len(xs) < 2:
        return 0.0
    m = sum(xs) / len(xs)
    return math.sqrt(sum((x - m) ** 2 for x in xs) / (len(xs) - 1))


def group_mean(r: float, mates: list[float]) -> float:
    return sum(mates) / len(mates)


def others_mean(r: float, mates: list[float]) -> float:
    """The mean of the group's other rewards (0 for a group of one)."""
    return (sum(mates) - r) / max(len(mates) - 1, 1)


def unscaled(mates: list[float], rewards: list[float]) -> None:
    return None


def group_std(mates: list[float], rewards: list[float]) -> float:
    return unbiased_std(mates)


def batch_std(mates: list[float], rewards: list[float]) -> float:
    return unbiased_std(rewards)


def group_advantages(rewards: torch.Tensor, group: torch.Tensor, estimator: str = "grpo",
                     scale: str = "none") -> torch.Tensor:
    """Per row: its reward minus the baseline `estimator` of its group's rewards, divided by (std + ADV_EPS) where
    std is the scale `scale` (none: no division; the unbiased std of the group's or of the whole batch's rewards)."""
    rewards, group = [float(r) for r in rewards], [int(g) for g in group]
    baseline, scale_of = reference(ADV_ESTIMATORS, estimator), reference(REWARD_SCALES, scale)
    out = []
    for r, g in zip(rewards, group):
        mates = [x for x, h in zip(rewards, group) if h == g]
        a = r - baseline(r, mates)
        std = scale_of(mates, rewards)
        if std is not None:
            a /= std + ADV_EPS
        out.append(a)
    return torch.tensor(out, dtype=torch.float64)


def positions(ids: torch.Tensor, at: torch.Tensor | None) -> torch.Tensor:
    """The positions j < T-1 (predicting ids[j+1]) to derive, as a [B, T] mask over the full forward's positions:
    those `at` [B, T-1] marks (every one if None), never the last."""
    B, T = ids.shape
    out = torch.zeros(B, T, dtype=torch.bool)
    out[:, :-1] = True if at is None else at > 0
    return out


def log_softmax_at(model, ids: torch.Tensor, at: torch.Tensor | None = None, temperature: float = 1.0):
    """log p(v | ids[:j+1]) for every vocabulary entry v at the positions j that `at` [B, T-1] marks (all if None)
    [N, V], float64, from one full forward (the backend's plain `logits`): the logits minus their log-sum-exp."""
    z = model.logits(ids, positions(ids, at)).double() / temperature
    return z - torch.logsumexp(z, dim=-1, keepdim=True)


def on_grid(values: torch.Tensor, ids: torch.Tensor, at: torch.Tensor | None) -> torch.Tensor:
    """Values at the positions `at` marks [N] -> [B, T-1], zero elsewhere."""
    B, T = ids.shape
    out = values.new_zeros(B, T - 1)
    out[positions(ids, at)[:, :-1]] = values
    return out


def vocab_size(model) -> int:
    return int(model.describe()["config"]["vocab_size"])


def row_chunks(ids: torch.Tensor, at: torch.Tensor | None, vocab: int) -> list[slice]:
    """The whole batch as one slice while its [positions, vocab] float64 log-softmax stays under
    NO_GRAD_ELEMENTS (TinyAgent's always does), else row slices that each do (a large vocabulary's)."""
    per_row = positions(ids, at).sum(1).tolist()
    if sum(per_row) * vocab <= NO_GRAD_ELEMENTS:
        return [slice(None)]
    out, start, size = [], 0, 0
    for i, n in enumerate(per_row):
        if size and (size + n) * vocab > NO_GRAD_ELEMENTS:
            out.append(slice(start, i))
            start, size = i, 0
        size += n
    return out + [slice(start, len(per_row))]


def log_probs(model, ids: torch.Tensor, temperature: float = 1.0, at: torch.Tensor | None = None) -> torch.Tensor:
    """log p(ids[j+1] | ids[:j+1]) [B, T-1], float64, from one full forward without a cache, at the positions `at`
    [B, T-1] marks (every one if None; 0 elsewhere). Without gradient, in row_chunks."""
    if torch.is_grad_enabled():
        chunks = [slice(None)]
    else:
        chunks = row_chunks(ids, at, vocab_size(model))
    parts = []
    for rows in chunks:
        i, a = ids[rows], None if at is None else at[rows]
        targets = i[:, 1:][positions(i, a)[:, :-1]]
        parts.append(on_grid(log_softmax_at(model, i, a, temperature).gather(-1, targets[:, None]).squeeze(-1), i, a))
    return torch.cat(parts)


@torch.no_grad()
def kl_divergence(model, ref, ids: torch.Tensor, mask: torch.Tensor, temperature: float = 1.0) -> float:
    """Mean over the masked positions of the exact KL(model || ref) = sum_v p(v) log(p(v) / q(v)) (no estimator),
    in row_chunks."""
    total = 0.0
    for rows in row_chunks(ids, mask, vocab_size(model)):
        i, m = ids[rows], mask[rows]
        lp, lq = log_softmax_at(model, i, m, temperature), log_softmax_at(ref, i, m, temperature)
        total = total + (on_grid((exp(lp) * (lp - lq)).sum(-1), i, m) * m).sum()
    return float(total / max(float(mask.sum()), 1.0))


def token_ratios(lps: list, olds: list[float]) -> list:
    """r = exp(lp - old) for each token."""
    return [exp(lp - old) for lp, old in zip(lps, olds)]


def sequence_ratios(lps: list, olds: list[float]) -> list:
    """One s = exp(mean over the row of lp - old) (at most exp(10)) for every token, with the gradient s grad lp."""
    if not lps:
        return []
    log_s = min(sum(float(lp.detach()) - old for lp, old in zip(lps, olds)) / len(lps), 10.0)
    return [math.exp(log_s) * exp(lp - lp.detach()) for lp in lps]


def clip_term(r: torch.Tensor, a: float, cfg) -> torch.Tensor:
    """-min(r A, clip(r, 1 - low, 1 + high) A), at most c |A| where A < 0 when cfg.clip_ratio_c (dual clip)."""
    low, high = cfg.clip_range
    lo, hi = 1 - low, 1 + high
    rv = float(r.detach())
    clipped = r if lo <= rv <= hi else torch.tensor(min(max(rv, lo), hi), dtype=r.dtype)
    term = -min(r * a, clipped * a)
    if cfg.clip_ratio_c is not None and a < 0:
        term = torch.minimum(term, torch.tensor(-a * cfg.clip_ratio_c, dtype=term.dtype))
    return term


# a loss aggregation from each row's summed token losses and its count of tokens
def token_mean(sums: list, counts: list[int], cfg):
    return sum(sums) / max(sum(counts), 1)


def seq_mean_token_mean(sums: list, counts: list[int], cfg):
    return sum(s / max(n, 1) for s, n in zip(sums, counts)) / len(sums)


def seq_mean_token_sum(sums: list, counts: list[int], cfg):
    return sum(sums) / len(sums)


def seq_mean_token_sum_norm(sums: list, counts: list[int], cfg):
    return sum(sums) / (len(sums) * cfg.loss_norm_len)


def minibatch_loss(model, mb: dict, old_logp: torch.Tensor, ref_logp: torch.Tensor | None, cfg) -> torch.Tensor:
    """The loss of one minibatch by its definition, token by token (differentiable in the model's weights only).
    For each row i and each position j with mask 1, with lp = log p(ids[i, j+1]) and r its ratio
    (the ratio_level's: exp(lp - old), or the row's s = exp(mean of lp - old) with the gradient s grad lp):
        l = term(r, A_i) - entropy_coef * H_j + kl_coef * k(lp - ref)
    (term: the policy_loss's, e.g. -min(r A_i, clip(r, 1 - low, 1 + high) A_i); the entropy term when
    entropy_coef != 0, the KL term k: the kl_kind's, when ref_logp is given); then the loss_mode's aggregation over
    the rows' sums and counts:
        token_mean: all l / their count;  seq_mean_token_mean: mean over rows of (row's l sum / row's count);
        seq_mean_token_sum: mean over rows of the row's sum;  seq_mean_token_sum_norm: all l / (rows x
        cfg.loss_norm_len). A row or batch with no token counts 1 token. old and ref are read as constants."""
    ids, mask, adv = mb["ids"], mb["action_mask"], mb["advantages"]
    logz = log_softmax_at(model, ids, mask, cfg.temperature)
    row = torch.full(mask.shape, -1, dtype=torch.long)     # [B, T-1] -> row of logz
    row[mask > 0] = torch.arange(logz.shape[0])
    # each token's log-prob and entropy taken out of logz once, as separate scalars: indexing logz per token would
    # give every token a backward of the whole [N, V] (quadratic in the tokens; minutes on a 151,936-token vocabulary)
    token_logp = logz.gather(-1, ids[:, 1:][mask > 0][:, None]).squeeze(-1).unbind(0)
    token_entropy = (-(exp(logz) * logz).sum(-1)).unbind(0) if cfg.entropy_coef else None
    ratios, policy_term = reference(RATIO_LEVELS, cfg.ratio_level), reference(POLICY_LOSSES, cfg.policy_loss)
    kl, aggregate = reference(KL_KINDS, cfg.kl_kind), reference(LOSS_MODES, cfg.loss_mode)
    row_sums, row_counts = [], []
    for i in range(ids.shape[0]):
        at = torch.nonzero(mask[i]).flatten().tolist()
        lps = [token_logp[row[i, j]] for j in at]
        terms = []
        for lp, j, r in zip(lps, at, ratios(lps, [float(old_logp[i, j]) for j in at])):
            term = policy_term(r, float(adv[i] if adv.dim() == 1 else adv[i, j]), cfg)
            if cfg.entropy_coef:
                term = term - cfg.entropy_coef * token_entropy[row[i, j]]
            if ref_logp is not None:
                term = term + cfg.kl_coef * kl(lp - float(ref_logp[i, j]))
            terms.append(term)
        row_sums.append(sum(terms) if terms else logz.new_zeros(()))
        row_counts.append(len(terms))
    return aggregate(row_sums, row_counts, cfg)
