"""Which training tasks a step samples: uniformly (the default), or weighted by each task's recent pass rate.

A group whose episodes all pass or all fail has zero advantage and teaches nothing, so the `pass_rate` curriculum
gives a task the weight p(1 - p) of its pass rate p over the last `curriculum_window` steps, Laplace-smoothed
((passes + 1) / (episodes + 2)): a task not seen yet weighs as much as one solved half the time, and no task's
weight is ever 0. The estimates come from the dashboard history (each row records its tasks' outcomes under
`task_pass`), so a resumed run weighs tasks exactly as an uninterrupted one.
"""
from __future__ import annotations

from agentrl.core.config import RLConfig
from agentrl.core.variants import CURRICULA


def task_outcomes(trajs: list) -> dict:
    """{task name: [passes, episodes]} of a step's sampled episodes."""
    out: dict[str, list[int]] = {}
    for t in trajs:
        c = out.setdefault(t.record.task, [0, 0])
        c[0] += int(t.reward > 0)
        c[1] += 1
    return out


def recent_pass_counts(history: list[dict], window: int) -> dict:
    """{task name: [passes, episodes]} summed over the last `window` rows of the history."""
    total: dict[str, list[int]] = {}
    for row in history[-window:]:
        for name, (c, n) in row.get("task_pass", {}).items():
            acc = total.setdefault(name, [0, 0])
            acc[0] += c
            acc[1] += n
    return total


@CURRICULA.register("none")
def uniform(tasks: list, history: list[dict], cfg: RLConfig) -> None:
    """No weights: the sampler draws distinct tasks uniformly (agentrl.rl.rollout.choose_tasks)."""
    return None


@CURRICULA.register("pass_rate")
def pass_rate_weights(tasks: list, history: list[dict], cfg: RLConfig) -> list[float]:
    """Per task (in `tasks` order) p(1 - p), p = (passes + 1) / (episodes + 2) over the recent window."""
    counts = recent_pass_counts(history, cfg.curriculum_window)
    weights = []
    for task in tasks:
        c, n = counts.get(task.name, (0, 0))
        p = (c + 1) / (n + 2)
        weights.append(p * (1 - p))
    return weights


def task_weights(cfg: RLConfig, tasks: list, history: list[dict]) -> list[float] | None:
    return CURRICULA[cfg.curriculum](tasks, history, cfg)


def curriculum_row(cfg: RLConfig, sampled: list) -> dict:
    """Dashboard field the curriculum reads back (none without a curriculum)."""
    return {} if cfg.curriculum == "none" else {"task_pass": task_outcomes(sampled)}
