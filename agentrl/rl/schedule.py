"""What changes from step to step: the learning-rate schedule and the adaptive entropy coefficient.

`step_config(cfg, step, steps, history)` is the config step `step` trains with. It is a pure function of the run's
config, the step and the dashboard history so far, so a resumed run (which restores the history from its
checkpoint) continues exactly where it stopped; at the defaults it returns `cfg` itself.
"""
from __future__ import annotations

import math
from dataclasses import replace

from agentrl.core.config import RLConfig
from agentrl.core.variants import LR_SCHEDULES


@LR_SCHEDULES.register("constant")
def constant_decay(progress: float) -> float:
    return 1.0


@LR_SCHEDULES.register("linear")
def linear_decay(progress: float) -> float:
    """1 at the first step after warmup, falling linearly to 0 one step after the last."""
    return 1.0 - progress


@LR_SCHEDULES.register("cosine")
def cosine_decay(progress: float) -> float:
    """Half a cosine from 1 at the first step after warmup towards 0 one step after the last."""
    return 0.5 * (1.0 + math.cos(math.pi * progress))


def lr_factor(cfg: RLConfig, step: int, steps: int) -> float:
    """The multiple of cfg.lr at step `step` (0-based) of `steps`: warmup (step + 1) / lr_warmup for the first
    lr_warmup steps, then cfg.lr_schedule over the remaining steps."""
    if step < cfg.lr_warmup:
        return (step + 1) / cfg.lr_warmup
    return LR_SCHEDULES[cfg.lr_schedule]((step - cfg.lr_warmup) / max(steps - cfg.lr_warmup, 1))


def scheduled(cfg: RLConfig) -> bool:
    return cfg.lr_warmup > 0 or cfg.lr_schedule != "constant"


def entropy_coef_at(cfg: RLConfig, history: list[dict]) -> float:
    """The adaptive entropy coefficient: cfg.entropy_coef at the first step, then after each step
    coef + entropy_coef_lr * (entropy_target - that step's mean token entropy), never below 0. Each row records the
    coefficient it used, so the next one follows from the last row alone."""
    if not history:
        return max(cfg.entropy_coef, 0.0)
    last = history[-1]
    coef = last.get("entropy_coef", max(cfg.entropy_coef, 0.0))
    if "entropy" not in last:  # a step with nothing to train on measured no entropy
        return coef
    return max(coef + cfg.entropy_coef_lr * (cfg.entropy_target - last["entropy"]), 0.0)


def step_config(cfg: RLConfig, step: int, steps: int, history: list[dict]) -> RLConfig:
    """The config step `step` trains with (`cfg` itself unless a schedule or an entropy target is set)."""
    changes = {}
    if scheduled(cfg):
        changes["lr"] = cfg.lr * lr_factor(cfg, step, steps)
    if cfg.entropy_target is not None:
        changes["entropy_coef"] = entropy_coef_at(cfg, history)
    return replace(cfg, **changes) if changes else cfg


def set_lr(optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def schedule_row(cfg: RLConfig, step_cfg: RLConfig) -> dict:
    """Dashboard fields of what the schedule chose (none at the defaults)."""
    row = {}
    if scheduled(cfg):
        row["lr"] = step_cfg.lr
    if cfg.entropy_target is not None:
        row["entropy_coef"] = step_cfg.entropy_coef
    return row
