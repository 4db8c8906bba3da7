"""One lab config at several seeds (labs whose configs differ only in `seed`), each seed's held-out numbers and the
gain pooled over the seeds, for `python -m agentrl study labs`.

The pooled numbers average each held-out task's pass rate over the seeds (the seeds are more episodes of the same
tasks), then take the same task bootstrap as one lab's report (agentrl.labs.report): the interval is over tasks, the
unit the held-out set samples. The spread of the seeds' own gains is shown beside it, not folded into it.
"""
from __future__ import annotations

import json

import numpy as np

from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff
from agentrl.labs.report import N_BOOT, fmt, interval, per_task_rates


def config_key(numbers: dict) -> str:
    """A lab's config without its seed, and its device: labs with the same key are one config at several seeds."""
    config = {k: v for k, v in numbers["config"].items() if k != "seed"}
    return json.dumps({"config": config, "device": numbers.get("device", "cpu")}, sort_keys=True)


def seed_groups(labs: dict) -> list[list[str]]:
    """Names of the labs that share a config and device at two or more different seeds, each group ordered by seed.

    A seed run twice is not another seed: it keeps one name, the group's first name (`x`) or its `x_seed<N>` where
    one ran (so `smollm2`, `smollm2_seed1`, `smollm2_seed2` stay together beside an earlier name for the same config),
    else the first in name order."""
    groups: dict[str, list[str]] = {}
    for name, numbers in sorted(labs.items()):
        if "config" in numbers and "seed" in numbers:   # reports older than the config record stay out
            groups.setdefault(config_key(numbers), []).append(name)
    out = []
    for names in groups.values():
        first_of_seed = {}
        for name in sorted(names, key=lambda n: (n not in (names[0], f"{names[0]}_seed{labs[n]['seed']}"), n)):
            first_of_seed.setdefault(labs[name]["seed"], name)
        if len(first_of_seed) > 1:
            out.append([first_of_seed[s] for s in sorted(first_of_seed)])
    return out


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


def seeds_tables(labs: dict) -> tuple[dict, list[str]]:
    """({first lab's name: pooled numbers}, markdown): one table per config run at several seeds."""
    out, md = {}, []
    for names in seed_groups(labs):
        runs = [labs[n] for n in names]
        if not all("after" in r and "gain" in r["held_out"] and r["weights_changed"] for r in runs):
            md += ["", f"Seeds of `{names[0]}`: {', '.join(f'`{n}`' for n in names)}; not pooled (a seed's GRPO "
                       "did not run or changed no weight)."]
            continue
        p = pooled(runs, min(r["seed"] for r in runs))
        out[names[0]] = {"labs": names, **p}
        md += ["", f"### `{names[0]}` at {len(names)} seeds", "",
               "| lab | seed | after the cold start | after GRPO | GRPO's paired gain | steps that updated |",
               "|---|---|---|---|---|---|"]
        for name, r in zip(names, runs):
            h, t = r["held_out"], r["training"]
            md.append(f"| `{name}` | {r['seed']} | {interval(h['before'])} | {interval(h['after'])} | "
                      f"{interval(h['gain'], True)} | {t['steps_updated']} of {t['steps']} |")
        md.append(f"| pooled ({p['tasks']} tasks, each the mean of its seeds) | {', '.join(map(str, p['seeds']))} | "
                  f"{interval(p['before'])} | {interval(p['after'])} | **{interval(p['gain'], True)}** | |")
        s = p["seed_gains"]
        md += ["", f"The seeds' own gains range {fmt(s['min'])} to {fmt(s['max'])} (sd {fmt(s['sd'])}). The pooled "
                   f"gain {'excludes' if p['gain']['lo'] > 0 or p['gain']['hi'] < 0 else 'includes'} 0."]
    return out, md
