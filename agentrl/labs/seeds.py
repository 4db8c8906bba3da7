"""One recipe at several seeds (reports/labs/<recipe>/seed<N>.json: the recipe by name, the seed by file), each seed's
held-out numbers and the gain pooled over the seeds, for `python -m agentrl study labs`.

The pooled numbers average each held-out task's pass rate over the seeds (the seeds are more episodes of the same
tasks), then take the same task bootstrap as one lab's report (agentrl.labs.report): the interval is over tasks, the
unit the held-out set samples. The spread of the seeds' own gains is shown beside it, not folded into it.
"""
from __future__ import annotations

import numpy as np

from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff
from agentrl.labs import passk
from agentrl.labs.report import N_BOOT, fmt, interval, per_task_rates


def pooled(records: list[dict], seed: int) -> dict:
    """Before (after the cold start), after GRPO and GRPO's paired gain, each task's rate averaged over the seeds.

    records: each lab's numbers with its `before` and `after` per-task counts over the same held-out tasks."""
    tasks = [sorted(r["before"]["per_task"]) for r in records] + [sorted(r["after"]["per_task"]) for r in records]
    if any(t != tasks[0] for t in tasks):
        raise ValueError("pooled: the seeds' held-out task sets differ; they are not one config")
    before = np.mean([per_task_rates(r["before"]["per_task"]) for r in records], axis=0)
    after = np.mean([per_task_rates(r["after"]["per_task"]) for r in records], axis=0)
    gains = [r["held_out"]["gain"]["mean"] for r in records]
    return {"seeds": [r["seed"] for r in records], "tasks": len(tasks[0]),
            "before": dict(zip(("mean", "lo", "hi"), bootstrap_ci(before, N_BOOT, seed=seed))),
            "after": dict(zip(("mean", "lo", "hi"), bootstrap_ci(after, N_BOOT, seed=seed))),
            "gain": dict(zip(("mean", "lo", "hi"), paired_bootstrap_diff(before, after, N_BOOT, seed=seed))),
            "seed_gains": {"min": min(gains), "max": max(gains), "sd": float(np.std(gains, ddof=1))}}


def seeds_tables(recipes: dict, where: str = "reports/labs") -> tuple[dict, list[str]]:
    """({recipe: pooled numbers}, markdown): one table per recipe run at two or more seeds.

    recipes: {recipe: {seed: its report's numbers}}."""
    out, md = {}, []
    for name, by_seed in sorted(recipes.items()):
        if len(by_seed) < 2:
            continue
        seeds = sorted(by_seed)
        runs = [by_seed[s] for s in seeds]
        if not all("after" in r and "gain" in r["held_out"] and r["weights_changed"] for r in runs):
            md += ["", f"Seeds of `{name}`: {', '.join(map(str, seeds))}; not pooled (a seed's GRPO did not run or "
                       "changed no weight)."]
            continue
        p = pooled(runs, min(seeds))
        pass_k = passk.pooled(runs, min(seeds), N_BOOT)
        out[name] = {"reports": [f"{where}/{name}/seed{s}.json" for s in seeds], **p, "pass_at_k": pass_k}
        md += ["", f"### `{name}` at {len(seeds)} seeds", "",
               "| seed | after the cold start | after GRPO | GRPO's paired gain | steps that updated |",
               "|---|---|---|---|---|"]
        for seed, r in zip(seeds, runs):
            h, t = r["held_out"], r["training"]
            md.append(f"| {seed} | {interval(h['before'])} | {interval(h['after'])} | {interval(h['gain'], True)} | "
                      f"{t['steps_updated']} of {t['steps']} |")
        md.append(f"| pooled ({p['tasks']} tasks, each the mean of its seeds) | {interval(p['before'])} | "
                  f"{interval(p['after'])} | **{interval(p['gain'], True)}** | |")
        s = p["seed_gains"]
        md += ["", f"The seeds' own gains range {fmt(s['min'])} to {fmt(s['max'])} (sd {fmt(s['sd'])}). The pooled "
                   f"gain {'excludes' if p['gain']['lo'] > 0 or p['gain']['hi'] < 0 else 'includes'} 0.", "",
               f"pass@k from the same episodes, each task's pass@k averaged over the {len(seeds)} seeds, then the task "
               "bootstrap (agentrl/labs/passk.py):", "",
               *passk.table(pass_k, [("before", "after the cold start"), ("after", "after GRPO")], interval)]
    return out, md
