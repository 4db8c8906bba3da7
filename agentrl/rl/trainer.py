"""The GRPO trainer: one loop, read top to bottom.

    train(model, tasks, fmt, cfg, steps, env=factory)
      for each step:
        step_cfg = step_config(...)                    learning-rate schedule, adaptive entropy coefficient
        kept, sampled = sample_step(...)               sampling (the rollout generator is the root stream), tasks
                                                       weighted by the curriculum, groups kept per cfg.keep
        batch = prepare_batch(kept, ...)               collate + action mask + group advantages
        update = rl_update(model, optimizer, batch)    old log-probs frozen before the first minibatch, then per
                                                       minibatch: reference log-probs, clipped surrogate (+ KL to
                                                       the reference, + entropy bonus), backward, clip, step
        row = dashboard_row(...)                       outcome, behaviour, optimizer, consistency
        hooks                                          held-out evaluation, guards, checkpoints, progress

Every point a fault can break is a named seam (`Seams`); the defaults are the correct implementations and a fault
(agentrl.faults.registry) replaces exactly the seams it breaks. The loop never asks which fault is active, so a
run "with no fault" and a plain run are the same code path.
"""
from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from agentrl.core.config import ConfigError, Diverged, RLConfig
from agentrl.core.seeding import generator as stream_generator
from agentrl.core.variants import LOSS_MODES
from agentrl.rl.curriculum import curriculum_row, task_weights
from agentrl.rl.dashboard import batch_hash, dashboard_row
from agentrl.rl.objectives import (
    aggregate_loss,
    compute_advantages,
    entropy_bonus,
    kl_penalty,
    masked_mean,
    policy_loss,
)
from agentrl.rl.optim import Adam
from agentrl.rl.rollout import Trajectory, collate, sample_step
from agentrl.rl.schedule import schedule_row, scheduled, set_lr, step_config


class NonFiniteError(Diverged):
    """A non-finite loss or gradient: raised before the optimizer steps. Carries the update statistics up to the
    failure and (once a guard has written it) the replay bundle's path."""

    def __init__(self, message: str, stats: dict, bundle: str | None = None):
        super().__init__(message)
        self.stats, self.bundle = stats, bundle


def make_optimizer(model, cfg: RLConfig) -> torch.optim.Optimizer:
    return Adam(model.parameters(), lr=cfg.lr)


def frozen_copy(model) -> torch.nn.Module:
    """A frozen copy of the policy: the KL reference."""
    ref = copy.deepcopy(model)
    for p in ref.parameters():
        p.requires_grad_(False)
    return ref


# ---------------------------------------------------------------- seams (the correct implementations)

def sampler_temperature(cfg: RLConfig) -> float:
    return cfg.temperature


def trajectory_mask(batch: dict) -> torch.Tensor:
    """The action mask as the trajectories recorded it: aligned to ids[1:] [B, T-1]."""
    return batch["action_mask"]


def group_advantages(batch: dict, cfg: RLConfig) -> torch.Tensor:
    return compute_advantages(batch["rewards"], batch["group"], estimator=cfg.adv_estimator, scale=cfg.reward_scale)


def recomputed_old_log_probs(mbs: list[dict], recomputed: list[torch.Tensor]) -> list[torch.Tensor]:
    """Old log-probs: the trainer's own, computed once from the weights that sampled the batch."""
    return recomputed


def frozen_old_log_probs(model, mb: dict, old_logp: torch.Tensor) -> torch.Tensor:
    """Per minibatch: the old log-probs stay as they were before the first optimizer step."""
    return old_logp


def same_config(cfg: RLConfig) -> RLConfig:
    return cfg


@dataclass(frozen=True)
class Seams:
    """The named points of the loop a fault may replace (see agentrl.faults.registry)."""
    sampler_temperature: Callable = sampler_temperature          # cfg -> temperature the sampler uses
    action_mask: Callable = trajectory_mask                      # batch -> [B, T-1] mask of trained tokens
    advantages: Callable = group_advantages                      # (batch, cfg) -> [B]
    old_log_probs: Callable = recomputed_old_log_probs           # (minibatches, recomputed) -> old per minibatch
    minibatch_old_log_probs: Callable = frozen_old_log_probs     # (model, mb, old) -> old used by this minibatch
    reference: Callable = frozen_copy                            # model -> KL reference
    loss_config: Callable = same_config                          # cfg -> cfg of the loss terms
    backward: Callable | None = None                             # (model, mb, old, ref_logp, cfg) -> (loss, stats)


SEAMS = Seams()


# ---------------------------------------------------------------- the batch

def prepare_batch(trajs: list[Trajectory], tok, cfg: RLConfig, seams: Seams = SEAMS, width: int | None = None) -> dict:
    """Collate (right-padded to `width` or the longest row), then the action mask and group advantages [B]."""
    batch = collate(trajs, tok.pad_id, width)
    batch["action_mask"] = seams.action_mask(batch)
    batch["advantages"] = seams.advantages(batch, cfg)
    return batch


def minibatch_slices(n_rows: int, n: int) -> list[slice]:
    """Contiguous, near-equal row ranges (rows of a group stay together when n divides the group count)."""
    bounds = [round(i * n_rows / n) for i in range(n + 1)]
    return [slice(a, b) for a, b in zip(bounds[:-1], bounds[1:]) if b > a]


def mb_view(batch: dict, sl) -> dict:
    """Rows `sl` (a slice or an index tensor) of every per-row tensor of a batch."""
    return {k: (v[sl] if torch.is_tensor(v) and v.dim() >= 1 else v) for k, v in batch.items()}


def forward_logp(model, ids: torch.Tensor, at: torch.Tensor | None = None, temperature: float = 1.0,
                 entropy: bool = False):
    """Trainer forward through the policy backend: ids [B, T] -> (log p(ids[1:]) [B, T-1] under
    softmax(logits / temperature), the entropy [B, T-1] if asked, else None). `at` [B, T-1]: the positions that
    are read (the backend may compute only those)."""
    return model.log_probs(ids, at=at, temperature=temperature, entropy=entropy)


@torch.no_grad()
def real_log_probs(model, batch: dict, entropy: bool = False, temperature: float = 1.0):
    """No-grad forward_logp from the real tokens only (the backend's frozen_log_probs), needed at the batch's
    action mask: log p(ids[1:]) [B, T-1] and, if asked, the entropy [B, T-1]."""
    logp, ent = model.frozen_log_probs(batch["ids"], batch["attention_mask"].sum(1), at=batch["action_mask"] > 0,
                                       temperature=temperature, entropy=entropy)
    return (logp, ent) if entropy else logp


# ---------------------------------------------------------------- the loss of one (micro)batch

def minibatch_loss(model, mb: dict, old_logp, ref_logp, cfg: RLConfig):
    """Loss of one (micro)batch under its own aggregation, and its policy-loss stats."""
    mask = mb["action_mask"]
    logp, entropy = forward_logp(model, mb["ids"], mask > 0, cfg.temperature, entropy=bool(cfg.entropy_coef))
    loss, stats = policy_loss(logp, old_logp, mb["advantages"], mask, cfg)
    if cfg.entropy_coef:
        loss = loss + entropy_bonus(entropy, mask, cfg.entropy_coef, cfg.loss_mode, cfg.loss_norm_len)
    if ref_logp is not None:
        loss = loss + cfg.kl_coef * aggregate_loss(kl_penalty(logp, ref_logp, cfg.kl_kind), mask, cfg.loss_mode,
                                                   cfg.loss_norm_len)
    return loss, stats


def token_weights(mask: torch.Tensor, total_mask: torch.Tensor, mode: str) -> float:
    """Factor that turns a microbatch's own aggregate into its share of the whole minibatch's aggregate: its share
    of the tokens for an aggregation that averages tokens, of the rows for one that averages rows."""
    if LOSS_MODES.meta(mode)["weight"] == "tokens":
        return float(mask.sum() / total_mask.sum().clamp(min=1))
    return mask.shape[0] / total_mask.shape[0]


def mean_stats(stats: list[dict]) -> dict:
    """Policy-loss stats of several microbatches: means of clip_frac and approx_kl, extremes of the ratio."""
    if len(stats) == 1:
        return stats[0]
    return {"clip_frac": sum(s["clip_frac"] for s in stats) / len(stats),
            "approx_kl": sum(s["approx_kl"] for s in stats) / len(stats),
            "ratio_max": max(s["ratio_max"] for s in stats), "ratio_min": min(s["ratio_min"] for s in stats)}


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
    return total, mean_stats(all_stats)


# ---------------------------------------------------------------- the update

def whole_batch(mbs: list[dict]) -> dict:
    """The batch the minibatches were cut from (they share its width, so rows concatenate exactly)."""
    if len(mbs) == 1:
        return mbs[0]
    return {k: torch.cat([mb[k] for mb in mbs]) for k in ("ids", "attention_mask", "action_mask", "sample_logp")}


def pre_update_pass(model, mbs: list[dict], temperature: float = 1.0):
    """One no-grad pass over the whole batch's real tokens, with the weights that sampled it: log-probs per
    minibatch, plus the step's entropy and sampler-trainer gap over policy tokens (at the sampling temperature)."""
    batch = whole_batch(mbs)
    logp, entropy = real_log_probs(model, batch, entropy=True, temperature=temperature)
    mask = batch["action_mask"]
    gap = (logp - batch["sample_logp"]).abs()
    stats = {"entropy": float(masked_mean(entropy, mask)),
             "logp_gap": float(masked_mean(gap, mask)), "logp_gap_max": float((gap * mask).max())}
    return list(logp.split([mb["ids"].shape[0] for mb in mbs])), stats


def ref_log_probs(ref, mb: dict, cfg: RLConfig):
    """Reference log-probs for one minibatch, computed when the minibatch is processed (a frozen reference
    gives the same numbers at any time; a reference that is the live policy gives exactly logp)."""
    if ref is None or cfg.kl_coef <= 0:
        return None
    with torch.no_grad():
        return forward_logp(ref, mb["ids"], mb["action_mask"] > 0, cfg.temperature)[0]


def frozen_ref_log_probs(model, ref, mbs: list[dict], cfg: RLConfig) -> list | None:
    """A frozen reference's log-probs for every minibatch, from one pass over the whole batch before the update
    (the same numbers ref_log_probs would give each minibatch later). None when there is no KL term, or when the
    reference is the live policy itself: that one changes with every step, so it is read per minibatch."""
    if ref is None or cfg.kl_coef <= 0 or ref is model:
        return None
    batch = whole_batch(mbs)
    with torch.no_grad():
        logp = forward_logp(ref, batch["ids"], batch["action_mask"] > 0, cfg.temperature)[0]
    return list(logp.split([mb["ids"].shape[0] for mb in mbs]))


def summarize_minibatches(per_mb: list[dict]) -> dict:
    """Means over the update's optimizer steps, plus per-step maxima where a spike matters."""
    n = len(per_mb)
    mean = lambda k: sum(s[k] for s in per_mb) / n
    return {"loss": mean("loss"), "clip_frac": mean("clip_frac"), "clip_frac_max": max(s["clip_frac"] for s in per_mb),
            "approx_kl": mean("approx_kl"), "approx_kl_max": max(s["approx_kl"] for s in per_mb),
            "ratio_max": max(s["ratio_max"] for s in per_mb), "ratio_min": min(s["ratio_min"] for s in per_mb),
            "grad_norm": mean("grad_norm"), "grad_norm_max": max(s["grad_norm"] for s in per_mb)}


@torch.no_grad()
def kl_to_ref(model, ref, batch: dict, cfg: RLConfig, ref_logp: torch.Tensor | None = None) -> float:
    """Mean per-token KL estimate (cfg.kl_kind) of the current policy to the reference on the batch's policy tokens
    (ref_logp: the reference's log-probs on this batch, if already computed)."""
    logp = real_log_probs(model, batch, temperature=cfg.temperature)
    if ref_logp is None:
        ref_logp = real_log_probs(ref, batch, temperature=cfg.temperature)
    return float(masked_mean(kl_penalty(logp, ref_logp, cfg.kl_kind), batch["action_mask"]))


def carries_gradient(batch: dict, cfg: RLConfig) -> bool:
    """Whether the loss of a prepared batch can have a non-zero gradient: some advantage is non-zero, or a KL or
    entropy term is on."""
    return bool(batch["advantages"].abs().sum() > 0) or cfg.kl_coef > 0 or bool(cfg.entropy_coef)


def _finite(x: float) -> bool:
    return x == x and x not in (float("inf"), float("-inf"))


def rl_update(model, optimizer, batch: dict, cfg: RLConfig, ref=None, seams: Seams = SEAMS,
              max_kl: float | None = None) -> dict:
    """One GRPO update on a prepared batch. Old log-probs are computed once, from the weights that sampled the
    batch, and stay frozen for every minibatch and epoch. Raises NonFiniteError on a non-finite loss or gradient
    norm, before that optimizer step. With `max_kl`, a minibatch whose approximate KL to the sampling policy (measured
    before its step) exceeds it is not stepped and the update ends there (`kl_stopped` 1). Returns per-update
    statistics."""
    mbs = [mb_view(batch, sl) for sl in minibatch_slices(batch["ids"].shape[0], cfg.minibatches)]
    recomputed, stats = pre_update_pass(model, mbs, cfg.temperature)
    old = seams.old_log_probs(mbs, recomputed)
    loss_cfg = seams.loss_config(cfg)
    frozen_ref = frozen_ref_log_probs(model, ref, mbs, loss_cfg)
    backward = seams.backward or accumulate_backward
    per_mb: list[dict] = []
    if max_kl is not None:
        stats.update(kl_stopped=0, optimizer_steps=0)
    for _ in range(cfg.epochs):
        for i, (mb, old_logp) in enumerate(zip(mbs, old)):
            ref_logp = frozen_ref[i] if frozen_ref is not None else ref_log_probs(ref, mb, loss_cfg)
            old_logp = seams.minibatch_old_log_probs(model, mb, old_logp)
            optimizer.zero_grad(set_to_none=True)
            loss, st = backward(model, mb, old_logp, ref_logp, loss_cfg)
            st["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
            st["loss"] = loss
            per_mb.append(st)
            if not (_finite(loss) and _finite(st["grad_norm"])):
                stats.update(summarize_minibatches(per_mb))
                what = "loss" if not _finite(loss) else "gradient"
                raise NonFiniteError(f"non-finite {what} in minibatch {len(per_mb) - 1} (loss={loss}, "
                                     f"grad_norm={st['grad_norm']})", stats)
            if max_kl is not None and st["approx_kl"] > max_kl:
                stats["kl_stopped"] = 1
                break
            optimizer.step()
            if max_kl is not None:
                stats["optimizer_steps"] += 1
        if stats.get("kl_stopped"):
            break
    stats.update(summarize_minibatches(per_mb))
    if ref is not None and cfg.kl_coef > 0:
        stats["kl_ref"] = kl_to_ref(model, ref, batch, loss_cfg,
                                    None if frozen_ref is None else torch.cat(frozen_ref))
    return stats


# ---------------------------------------------------------------- the loop

@dataclass
class TrainState:
    """What the loop carries from step to step (a hook may read it; checkpoints save it)."""
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    generator: torch.Generator
    ref: torch.nn.Module | None
    history: list = field(default_factory=list)
    start_step: int = 0
    batch: dict | None = None          # the current step's prepared batch (for guards' replay bundles)
    update: dict | None = None         # the current step's update statistics
    cfg: RLConfig | None = None        # the current step's config (agentrl.rl.schedule.step_config)
    sampled: list | None = None        # every episode the current step played (kept or not)


class Hook:
    """Callbacks of the loop; override what you need. on_row may add fields to the step's dashboard row."""

    def on_start(self, state: TrainState) -> None:
        """Before the first step of a fresh run (not on resume)."""

    def before_step(self, step: int, state: TrainState) -> None:
        """Before step `step` samples (the generator is still where the previous step left it)."""

    def before_update(self, step: int, state: TrainState) -> None:
        """After sampling and preparing step `step`'s batch (state.batch), before the update."""

    def on_failure(self, step: int, state: TrainState, exc: NonFiniteError) -> None:
        """The update of step `step` raised NonFiniteError (the loop re-raises it)."""

    def on_row(self, step: int, state: TrainState, row: dict) -> None:
        """Step `step` is done and its dashboard row built; the row is appended to the history next."""

    def after_step(self, updates: int, state: TrainState) -> None:
        """`updates` updates are done and recorded in state.history."""


def train(model, tasks: list, tok, cfg: RLConfig, steps: int, *, env, seams: Seams = SEAMS, hooks=(),
          generator: torch.Generator | None = None, optimizer=None, ref=None, history: list | None = None,
          start_step: int = 0, max_kl: float | None = None, skip_empty: bool = False) -> list[dict]:
    """GRPO for `steps` steps of the policy backend `model` (continuing from start_step with the given
    optimizer/generator/history when resuming), in the conversation format `tok` (agentrl.env.formats; the gym's
    word-level tokenizer is one) on the episodes `env(task, generator)` makes (an environment's factory,
    agentrl.env.base.EnvironmentSpec.make). `max_kl` bounds each update (rl_update); with `skip_empty` a step whose
    kept episodes carry no gradient (every advantage 0, no KL or entropy term) makes no update, so Adam does not
    step on its momentum alone. Returns the history: one dashboard row per step."""
    if isinstance(steps, bool) or not isinstance(steps, int) or steps <= 0:
        raise ConfigError(f"steps: expected an integer > 0, got {steps!r}")
    if not tasks:
        raise ConfigError("tasks: expected at least one training task, got none")
    generator = generator if generator is not None else stream_generator(cfg.seed)
    optimizer = optimizer if optimizer is not None else make_optimizer(model, cfg)
    if ref is None and cfg.kl_coef > 0:
        ref = seams.reference(model)
    state = TrainState(model, optimizer, generator, ref, history if history is not None else [], start_step)
    temperature = seams.sampler_temperature(cfg)
    if start_step == 0:
        for hook in hooks:
            hook.on_start(state)
    for step in range(start_step, steps):
        state.cfg = step_cfg = step_config(cfg, step, steps, state.history)
        if scheduled(cfg):
            set_lr(optimizer, step_cfg.lr)
        for hook in hooks:
            hook.before_step(step, state)
        kept, sampled = sample_step(model, env, tasks, tok, step_cfg, generator, temperature,
                                    task_weights(cfg, tasks, state.history))
        state.sampled = sampled
        state.batch = prepare_batch(kept, tok, step_cfg, seams) if kept else None   # no informative group: no update
        if skip_empty and state.batch is not None and not carries_gradient(state.batch, step_cfg):
            state.batch, kept = None, []
        for hook in hooks:
            hook.before_update(step, state)
        try:
            update = rl_update(model, optimizer, state.batch, step_cfg, ref, seams, max_kl) if kept else {}
        except NonFiniteError as exc:
            for hook in hooks:
                hook.on_failure(step, state, exc)
            raise NonFiniteError(f"step {step}: {exc} — stopped" + (f"; replay bundle: {exc.bundle}" if exc.bundle
                                                                   else ""), exc.stats, exc.bundle) from None
        state.update = update
        row = {"step": step, **dashboard_row(sampled, update), "batch_hash": batch_hash(sampled),
               "rollouts": len(sampled), "trained": len(kept), **schedule_row(cfg, step_cfg),
               **curriculum_row(cfg, sampled)}
        for hook in hooks:
            hook.on_row(step, state, row)
        state.history.append(row)
        for hook in hooks:
            hook.after_step(step + 1, state)
    state.batch = state.update = state.cfg = state.sampled = None
    return state.history
