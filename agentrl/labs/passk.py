"""pass@k at every evaluation of a lab, from the same episodes as its pass rate.

A held-out evaluation samples n episodes of each task; pass@k is the chance that k of them, drawn without
replacement, hold a pass: the unbiased estimator 1 - C(n-c, k) / C(n, k) of Chen et al. 2021
(agentrl.eval.stats.pass_at_k), per task, then averaged over tasks with the same task bootstrap as the pass rate
(pass@1 is the pass rate). Between two evaluations of the same tasks the change is the paired bootstrap difference.
RL on verifiable rewards can raise pass@1 while pass@k at large k stays flat or falls (the policy sharpens onto what
it could already do); a task set whose pass@16 is 1 before training can show nothing else.

    k            1, 2, 4, 8, 16, up to the episodes per task
    per column   mean [95% CI] over tasks (the columns of agentrl.labs.report: as it is, after the cold start, after
                 GRPO)
    change       after GRPO - after the cold start, paired over tasks
"""
from __future__ import annotations

import numpy as np

from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff, pass_at_k

KS = (1, 2, 4, 8, 16)


def per_task(counts: dict, k: int) -> list[float]:
    """pass@k of each task of {task: {n, c}}, in task order."""
    return [pass_at_k(v["n"], v["c"], k) for _, v in sorted(counts.items())]


def ks_for(counts: dict) -> list[int]:
    """The k of KS that every task's episodes allow."""
    n = min(v["n"] for v in counts.values())
    return [k for k in KS if k <= n]


def stats(columns: dict, seed: int, n_boot: int) -> dict:
    """{k: {column: {mean, lo, hi}, and "change": after - before when both are there}} from {column: per-task
    counts} (the same tasks in each); k as a string (JSON keys)."""
    first = next(iter(columns.values()))
    out = {}
    for k in ks_for(first):
        rates = {col: per_task(counts, k) for col, counts in columns.items()}
        entry = {col: dict(zip(("mean", "lo", "hi"), bootstrap_ci(v, n_boot, seed=seed))) for col, v in rates.items()}
        if "before" in rates and "after" in rates:
            entry["change"] = dict(zip(("mean", "lo", "hi"),
                                       paired_bootstrap_diff(rates["before"], rates["after"], n_boot, seed=seed)))
        out[str(k)] = entry
    return out


def pooled(records: list[dict], seed: int, n_boot: int) -> dict:
    """pass@k over seeds of one recipe: each task's pass@k averaged over the seeds, then the task bootstrap;
    {k: {before, after, change}}. records: each seed's numbers (its `before` and `after` per-task counts)."""
    out = {}
    for k in ks_for(records[0]["before"]["per_task"]):
        before = np.mean([per_task(r["before"]["per_task"], k) for r in records], axis=0)
        after = np.mean([per_task(r["after"]["per_task"], k) for r in records], axis=0)
        out[str(k)] = {"before": dict(zip(("mean", "lo", "hi"), bootstrap_ci(before, n_boot, seed=seed))),
                       "after": dict(zip(("mean", "lo", "hi"), bootstrap_ci(after, n_boot, seed=seed))),
                       "change": dict(zip(("mean", "lo", "hi"),
                                          paired_bootstrap_diff(before, after, n_boot, seed=seed)))}
    return out


def table(pass_k: dict, columns: list[tuple[str, str]], interval) -> list[str]:
    """Markdown: one row per k, one column per evaluation, then the paired change. `interval(ci, signed)` formats
    an interval (agentrl.labs.report.interval)."""
    change = any("change" in row for row in pass_k.values()) and any(col == "after" for col, _ in columns)
    out = ["| k | " + " | ".join(label for _, label in columns) + (" | change (paired) |" if change else " |"),
           "|---|" + "---|" * (len(columns) + change)]
    for k, row in pass_k.items():
        cells = [interval(row[col]) if col in row else "n/a" for col, _ in columns]
        if change:
            cells.append(interval(row["change"], True) if "change" in row else "n/a")
        out.append(f"| pass@{k} | " + " | ".join(cells) + " |")
    return out
