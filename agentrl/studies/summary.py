"""The research studies' statistics (docs/research.md), pure functions over finished runs.

Each run is one (arm, seed): its dashboard history, its held-out counts per task and the starting policy's
held-out counts on the same evaluation stream. Per arm: the mean over seeds, the seed spread, a task-bootstrap
interval of the seed-averaged per-task rates; per arm other than the reference: the paired task-bootstrap
difference from it and the seeds a two-sample t-test would need to settle the observed difference (80% power,
5% level, the two arms' pooled seed SD), with the power the study's own seed count had.
"""
from __future__ import annotations

import math
import statistics

from agentrl.core.config import FAMILIES
from agentrl.core.seeding import stream_seed
from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff, seeds_for_power, two_sample_power

POWER, LEVEL = 0.8, 0.05
ENTROPY_STEPS = (10, 30, 60)     # entropy "at step s": the dashboard row after s updates (the last row for s = steps)
UNSOLVED_BELOW = 0.5             # a family is unsolved by a run when its held-out pass rate is below this


def rates(per_task: dict, tasks: list[str]) -> list[float]:
    return [per_task[t]["c"] / per_task[t]["n"] for t in tasks]


def family_rates(per_task: dict) -> dict:
    """Held-out pass rate per family (task names are family/variant)."""
    out = {}
    for fam in FAMILIES:
        rows = [v for t, v in per_task.items() if t.split("/")[0] == fam]
        if rows:
            out[fam] = sum(v["c"] for v in rows) / sum(v["n"] for v in rows)
    return out


def entropy_at(history: list[dict], step: int) -> float | None:
    """Mean token entropy of the batch sampled after `step` updates (the last batch when step = len(history))."""
    rows = [r for r in history if "entropy" in r and r["step"] <= step]
    return rows[-1]["entropy"] if rows else None


def run_metrics(run: dict) -> dict:
    """The numbers of one run both questions use."""
    h = run["history"]
    rollouts = sum(r["rollouts"] for r in h)
    fams = family_rates(run["per_task"])
    cut = [round(i * len(h) / 3) for i in range(4)]
    return {"heldout_pass": run["heldout_pass"], "start_pass": run["start_pass"], "rollouts": rollouts,
            "gain_per_1k": (run["heldout_pass"] - run["start_pass"]) * 1000 / rollouts,
            "entropy": {str(s): entropy_at(h, s) for s in ENTROPY_STEPS if s <= len(h)},
            "families": fams, "unsolved": sorted(f for f, p in fams.items() if p < UNSOLVED_BELOW),
            "zero_adv_mean": statistics.mean(r["zero_adv_frac"] for r in h),
            "zero_adv_thirds": [statistics.mean(r["zero_adv_frac"] for r in h[a:b]) if b > a else None
                                for a, b in zip(cut, cut[1:])],
            "trained_episodes": sum(r["trained"] for r in h)}


def _sd(xs: list[float]) -> float:
    return statistics.stdev(xs) if len(xs) > 1 else 0.0


def power_statement(ref: list[float], arm: list[float], effect: float) -> dict:
    """Seeds per arm for 80% power at the observed effect, and the power the study had with its seeds."""
    sd = math.sqrt((_sd(ref) ** 2 + _sd(arm) ** 2) / 2)
    n = len(arm)
    if sd == 0 or effect == 0:
        return {"pooled_seed_sd": sd, "seeds_needed": None, "power_now": None}
    try:
        needed = seeds_for_power(sd, effect, POWER, LEVEL)
    except ValueError:  # beyond max_n: unsettleable at this scale
        needed = None
    return {"pooled_seed_sd": sd, "seeds_needed": needed,
            "power_now": float(two_sample_power(sd, effect, n, LEVEL)) if n >= 2 else None}


def compare_arms(runs: dict, arms: list[str], seeds: list[int], value, n_boot: int, alpha: float, seed: int,
                 label: str, ref: str = "default") -> dict:
    """One metric across arms. `value(run)` -> (per-task values {task: float}, per-seed scalar). Returns per arm
    the mean over seeds, seed SD, per seed, task-bootstrap interval and (not the reference) the paired difference
    from `ref` with its power statement."""
    tasks = sorted(runs[(arms[0], seeds[0])]["per_task"])

    def task_means(arm):
        per = [value(runs[(arm, s)])[0] for s in seeds]
        return [statistics.mean(p[t] for p in per) for t in tasks]

    def seed_values(arm):
        return [value(runs[(arm, s)])[1] for s in seeds]

    out = {}
    for arm in arms:
        vals = seed_values(arm)
        _, lo, hi = bootstrap_ci(task_means(arm), n_boot, alpha, seed=stream_seed(seed, "research-ci", label, arm))
        out[arm] = {"mean": statistics.mean(vals), "seed_sd": _sd(vals), "per_seed": dict(zip(map(str, seeds), vals)),
                    "ci_lo": lo, "ci_hi": hi}
        if arm != ref:
            d, dlo, dhi = paired_bootstrap_diff(task_means(ref), task_means(arm), n_boot, alpha,
                                                seed=stream_seed(seed, "research-paired", label, arm))
            out[arm]["diff_vs_" + ref] = {"mean": d, "ci_lo": dlo, "ci_hi": dhi,
                                          **power_statement(seed_values(ref), vals, d)}
    return out


def heldout_value(run: dict):
    return {t: v["c"] / v["n"] for t, v in run["per_task"].items()}, run["heldout_pass"]


def gain_per_1k_value(run: dict):
    """Held-out pass-rate gain over the start per 1,000 training rollouts, per task and for the run."""
    k = 1000 / sum(r["rollouts"] for r in run["history"])
    per = {t: (v["c"] / v["n"] - run["start_per_task"][t]["c"] / run["start_per_task"][t]["n"]) * k
           for t, v in run["per_task"].items()}
    return per, (run["heldout_pass"] - run["start_pass"]) * k


def per_arm_means(metrics: dict, arms: list[str], seeds: list[int], key) -> dict:
    """{arm: mean over seeds of key(run metrics)} for descriptive columns (no interval)."""
    out = {}
    for arm in arms:
        vals = [key(metrics[(arm, s)]) for s in seeds]
        vals = [v for v in vals if v is not None]
        out[arm] = statistics.mean(vals) if vals else None
    return out
