"""The fault registry: each fault of the debugging chapter is the set of trainer seams it breaks.

A fault never touches the loop: `seams_for(name)` returns the trainer's `Seams` with the fault's overrides, and
the loop, the update and the invariants run them as they run the correct ones. EXPECTED_FAILURES is the book's
fault matrix: the invariants (1-based) each fault must fail, and no others.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace

import torch

from agentrl.core.config import FAULT_NAMES, ConfigError
from agentrl.rl.rollout import OWNER
from agentrl.rl.trainer import SEAMS, Seams, forward_logp, group_advantages, mb_view, mean_stats, minibatch_loss

SAMPLER_TEMP = 0.7
WRONG_ENTROPY_COEF = -0.3


def mask_aligned_to_ids(batch: dict) -> torch.Tensor:
    """mask_shift: the policy-token mask read off ids instead of ids[1:] (shifted by one position)."""
    return (batch["owner"][:, :-1] == OWNER["policy"]).float()


def negated_advantages(batch: dict, cfg) -> torch.Tensor:
    return -group_advantages(batch, cfg)


def recomputed_per_minibatch(model, mb: dict, old_logp: torch.Tensor) -> torch.Tensor:
    """stale_old_logp: 'old' log-probs recomputed from the current weights before every minibatch."""
    with torch.no_grad():
        return forward_logp(model, mb["ids"])[0]


def sampler_log_probs(mbs: list[dict], recomputed: list) -> list:
    """sampler_temp: the sampler's log-probs (at T=0.7) used as the old log-probs."""
    return [mb["sample_logp"] for mb in mbs]


def wrong_entropy_sign(cfg):
    return replace(cfg, entropy_coef=WRONG_ENTROPY_COEF)


def local_token_means(model, mb: dict, old_logp, ref_logp, cfg) -> tuple[float, dict]:
    """accum_local: the minibatch split into 4 length-sorted microbatches, each reduced by its own token mean and
    divided by 4 (wrong unless every microbatch has the same number of tokens)."""
    order = torch.argsort(mb["attention_mask"].sum(1), stable=True)
    pieces = [order[k * len(order) // 4:(k + 1) * len(order) // 4] for k in range(4)]
    total, stats = 0.0, []
    for idx in pieces:
        if idx.numel() == 0:
            continue
        loss, st = minibatch_loss(model, mb_view(mb, idx), old_logp[idx], None if ref_logp is None else ref_logp[idx],
                                  cfg)
        (loss / 4).backward()
        total += float(loss.detach()) / 4
        stats.append(st)
    return total, mean_stats(stats)


def live_policy(model):
    """ref_is_policy: the KL reference is the live policy object itself."""
    return model


@dataclass(frozen=True)
class Fault:
    description: str
    overrides: dict = field(default_factory=dict)   # Seams field -> replacement
    expected: frozenset = frozenset()               # invariants (1-based) it must fail


FAULTS = {
    "mask_shift": Fault("action mask aligned to ids instead of ids[1:]", {"action_mask": mask_aligned_to_ids},
                        frozenset({1, 2, 5})),
    "stale_old_logp": Fault("old log-probs recomputed from the current weights before every minibatch",
                            {"minibatch_old_log_probs": recomputed_per_minibatch}, frozenset({7})),
    "entropy_sign": Fault("entropy bonus with the wrong sign (coef 0.3): entropy is minimised",
                          {"loss_config": wrong_entropy_sign}),
    "sign_flip": Fault("advantages negated", {"advantages": negated_advantages}, frozenset({8})),
    "accum_local": Fault("minibatch split into 4 length-sorted microbatches, each token-meaned and divided by 4",
                         {"backward": local_token_means}, frozenset({6})),
    "sampler_temp": Fault("sampler at T=0.7, its log-probs used as old log-probs, trainer at T=1",
                          {"sampler_temperature": lambda cfg: SAMPLER_TEMP, "old_log_probs": sampler_log_probs},
                          frozenset({2, 3})),
    "ref_is_policy": Fault("the KL reference is the live policy object", {"reference": live_policy},
                           frozenset({9})),
}
assert tuple(FAULTS) == FAULT_NAMES
BUGS = {name: f.description for name, f in FAULTS.items()}
EXPECTED_FAILURES = {None: set(), **{name: set(f.expected) for name, f in FAULTS.items()}}


def check_fault(name: str | None) -> None:
    if name is not None and name not in FAULTS:
        raise ConfigError(f"bug: unknown value {name!r}; allowed: {', '.join(FAULTS)}")


def seams_for(name: str | None) -> Seams:
    """The trainer with fault `name` injected (None: the correct trainer)."""
    check_fault(name)
    return SEAMS if name is None else replace(SEAMS, **FAULTS[name].overrides)
