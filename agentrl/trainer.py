"""The GRPO trainer.

Read top to bottom: RLConfig -> prepare the batch (collate + group advantages) -> rl_update (frozen old
log-probs, clipped surrogate per minibatch, optional KL to a frozen reference and entropy bonus) -> train_rl.
"""
from __future__ import annotations

import copy

import torch

from agentrl.config import ConfigError, RLConfig  # noqa: F401 (re-export)
from agentrl.gym import make_env_factory
from agentrl.objectives import (aggregate_loss, compute_advantages, entropy_bonus,
                                entropy_from_logits, kl_penalty, masked_mean, policy_loss, selected_log_probs)
from agentrl.rollout import Trajectory, collate, sample_step


def env_factory_for(cfg: RLConfig):
    return make_env_factory(cfg.max_turns, cfg.reward, cfg.rename)


def make_optimizer(model, cfg: RLConfig) -> torch.optim.Optimizer:
    return torch.optim.Adam(model.parameters(), lr=cfg.lr)


def make_ref(model) -> torch.nn.Module:
    """A frozen copy of the policy: the KL reference."""
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


# ---------------------------------------------------------------- the update

def prepare_batch(trajs: list[Trajectory], tok, cfg: RLConfig) -> dict:
    """Collate and attach group-relative advantages [B]."""
    batch = collate(trajs, tok.pad_id)
    batch["advantages"] = compute_advantages(batch["rewards"], batch["group"], cfg.adv_std_scale)
    return batch


def minibatch_slices(n_rows: int, n: int) -> list[slice]:
    """Contiguous, near-equal row ranges (rows of a group stay together when n divides the group count)."""
    bounds = [round(i * n_rows / n) for i in range(n + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def forward_logp(model, ids: torch.Tensor):
    """Trainer forward: ids [B, T] -> (log p(ids[1:]) [B, T-1], logits [B, T-1, V])."""
    logits = model(ids)[:, :-1]
    return selected_log_probs(logits, ids[:, 1:]), logits


def mb_view(batch: dict, sl: slice) -> dict:
    return {k: (v[sl] if torch.is_tensor(v) and v.dim() >= 1 else v) for k, v in batch.items()}


def token_weights(mask: torch.Tensor, total_mask: torch.Tensor, mode: str) -> float:
    """Factor that turns a microbatch's own aggregate into its share of the whole minibatch's aggregate."""
    if mode == "token_mean":
        return float(mask.sum() / total_mask.sum().clamp(min=1))
    return mask.shape[0] / total_mask.shape[0]  # the seq_mean modes average over rows


def minibatch_loss(model, mb: dict, old_logp, ref_logp, cfg: RLConfig):
    """Loss of one (micro)batch under its own aggregation, and its policy-loss stats."""
    mask = mb["action_mask"]
    logp, logits = forward_logp(model, mb["ids"])
    loss, stats = policy_loss(logp, old_logp, mb["advantages"], mask, cfg)
    if cfg.entropy_coef:
        loss = loss + entropy_bonus(entropy_from_logits(logits), mask, cfg.entropy_coef, cfg.loss_mode)
    if ref_logp is not None:
        loss = loss + cfg.kl_coef * aggregate_loss(kl_penalty(logp, ref_logp, cfg.kl_kind), mask, cfg.loss_mode)
    return loss, stats


def pre_update_pass(model, mbs: list[dict]):
    """No-grad pass with the weights that sampled the batch: the frozen old log-probs per minibatch, plus the
    step's entropy and sampler-trainer gap over policy tokens."""
    with torch.no_grad():
        old, entropies, gaps = [], [], []
        for mb in mbs:
            logp, logits = forward_logp(model, mb["ids"])
            old.append(logp)
            entropies.append(entropy_from_logits(logits))
            gaps.append((logp - mb["sample_logp"]).abs())
    mask = torch.cat([mb["action_mask"] for mb in mbs])
    gap = torch.cat(gaps)  # minibatches share the batch width, so rows concatenate exactly
    stats = {"entropy": float(masked_mean(torch.cat(entropies), mask)),
             "logp_gap": float(masked_mean(gap, mask)), "logp_gap_max": float((gap * mask).max())}
    return old, stats


def ref_log_probs(ref, mb: dict, cfg: RLConfig):
    """Reference log-probs for one minibatch, computed when the minibatch is processed (a frozen reference
    gives the same numbers at any time; a reference that is the live policy gives exactly logp)."""
    if ref is None or cfg.kl_coef <= 0:
        return None
    with torch.no_grad():
        return forward_logp(ref, mb["ids"])[0]


def rl_update(model, optimizer, batch: dict, cfg: RLConfig, ref=None) -> dict:
    """One GRPO update on a prepared batch. Old log-probs are computed once, from the weights that sampled
    the batch, and stay frozen for every minibatch and epoch. Returns per-update statistics."""
    mbs = [mb_view(batch, sl) for sl in minibatch_slices(batch["ids"].shape[0], cfg.minibatches)]
    old, stats = pre_update_pass(model, mbs)
    per_mb: list[dict] = []
    for _ in range(cfg.epochs):
        for mb, old_logp in zip(mbs, old):
            ref_logp = ref_log_probs(ref, mb, cfg)
            optimizer.zero_grad(set_to_none=True)
            loss, st = accumulate_backward(model, mb, old_logp, ref_logp, cfg)
            st["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
            optimizer.step()
            st["loss"] = loss
            per_mb.append(st)
    stats.update(summarize_minibatches(per_mb))
    if ref is not None and cfg.kl_coef > 0:
        stats["kl_ref"] = kl_to_ref(model, ref, batch, cfg)
    return stats


def accumulate_backward(model, mb: dict, old_logp, ref_logp, cfg: RLConfig) -> tuple[float, dict]:
    """Backward of one minibatch's loss, in cfg.microbatches exact (token-weighted) pieces."""
    pieces = minibatch_slices(mb["ids"].shape[0], cfg.microbatches)
    total, all_stats = 0.0, []
    for sl in pieces:
        micro = mb_view(mb, sl)
        loss, st = minibatch_loss(model, micro, old_logp[sl], None if ref_logp is None else ref_logp[sl], cfg)
        w = token_weights(micro["action_mask"], mb["action_mask"], cfg.loss_mode) if len(pieces) > 1 else 1.0
        (loss * w).backward()
        total += float(loss.detach()) * w
        all_stats.append(st)
    if len(all_stats) == 1:
        return total, all_stats[0]
    return total, {"clip_frac": sum(s["clip_frac"] for s in all_stats) / len(all_stats),
                   "approx_kl": sum(s["approx_kl"] for s in all_stats) / len(all_stats),
                   "ratio_max": max(s["ratio_max"] for s in all_stats),
                   "ratio_min": min(s["ratio_min"] for s in all_stats)}


def summarize_minibatches(per_mb: list[dict]) -> dict:
    """Means over the update's optimizer steps, plus per-step maxima where a spike matters."""
    n = len(per_mb)
    mean = lambda k: sum(s[k] for s in per_mb) / n  # noqa: E731
    return {"loss": mean("loss"), "clip_frac": mean("clip_frac"), "clip_frac_max": max(s["clip_frac"] for s in per_mb),
            "approx_kl": mean("approx_kl"), "approx_kl_max": max(s["approx_kl"] for s in per_mb),
            "ratio_max": max(s["ratio_max"] for s in per_mb), "ratio_min": min(s["ratio_min"] for s in per_mb),
            "grad_norm": mean("grad_norm"), "grad_norm_max": max(s["grad_norm"] for s in per_mb)}


@torch.no_grad()
def kl_to_ref(model, ref, batch: dict, cfg: RLConfig) -> float:
    """Mean per-token KL estimate (cfg.kl_kind) of the current policy to the reference on the batch's policy tokens."""
    logp, _ = forward_logp(model, batch["ids"])
    ref_logp, _ = forward_logp(ref, batch["ids"])
    return float(masked_mean(kl_penalty(logp, ref_logp, cfg.kl_kind), batch["action_mask"]))


# ---------------------------------------------------------------- the loop

def zero_adv_share(sampled: list[Trajectory]) -> float:
    """Share of groups whose rewards are all equal (no gradient from the group)."""
    groups: dict[int, set] = {}
    for t in sampled:
        groups.setdefault(t.group, set()).add(t.reward)
    return sum(len(r) == 1 for r in groups.values()) / max(len(groups), 1)


def step_row(step: int, sampled: list[Trajectory], update: dict) -> dict:
    """The trainer's own per-step record (the dashboard adds more in diagnostics.log_metrics)."""
    n = len(sampled)
    return {"step": step,
            "reward": sum(t.reward for t in sampled) / n,
            "pass_rate": sum(t.info["hidden_pass"] and t.info["submitted"] for t in sampled) / n,
            "reads": sum(t.info["reads"] for t in sampled) / n,
            "malformed": sum(t.info["n_invalid"] for t in sampled) / n,
            "hardcode": sum("hardcode_tests" in t.info["ops"] for t in sampled) / n,
            "zero_adv_frac": zero_adv_share(sampled),
            **update}


def train_rl(model, tasks: list, tok, cfg: RLConfig, steps: int, generator: torch.Generator | None = None,
             optimizer=None, ref=None, history: list | None = None, start_step: int = 0,
             hook=None, progress=None) -> list[dict]:
    """GRPO for `steps` steps (continuing from start_step with the given optimizer/generator/history when
    resuming). hook(step, model, optimizer, generator, history) runs at start_step and after every step.
    Returns the history: one dict per step."""
    if not isinstance(steps, int) or steps <= 0:
        raise ConfigError(f"steps: expected an integer > 0, got {steps!r}")
    generator = generator if generator is not None else torch.Generator().manual_seed(cfg.seed)
    optimizer = optimizer if optimizer is not None else make_optimizer(model, cfg)
    if ref is None and cfg.kl_coef > 0:
        ref = make_ref(model)
    history = history if history is not None else []
    env_factory = env_factory_for(cfg)
    if hook is not None and start_step == 0:
        hook(0, model, optimizer, generator, history)
    for step in range(start_step, steps):
        kept, sampled = sample_step(model, env_factory, tasks, tok, cfg, generator)
        batch = prepare_batch(kept, tok, cfg)
        update = rl_update(model, optimizer, batch, cfg, ref) if kept else {}
        history.append(step_row(step, sampled, update))
        if progress is not None:
            progress(history[-1])
        if hook is not None:
            hook(step + 1, model, optimizer, generator, history)
    return history
