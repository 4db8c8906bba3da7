"""The ablation summary: per-arm means, the seed spread, the paired difference from the default arm (seed-averaged
per-task rates, task bootstrap) and the seeds and tasks needed to detect smaller effects. Pure statistics over
the instances' results."""
from __future__ import annotations

import statistics

from agentrl.core.seeding import stream_seed
from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff, seeds_for_power, tasks_for_power

EFFECTS = (0.10, 0.05, 0.02)
POWER, LEVEL = 0.8, 0.05   # power of the two-sided t-tests, and their significance level


def summarize(results: dict, acfg, seed: int) -> dict:
    """results {(arm, seed): instance result} -> per-arm summary, paired differences vs default, power table."""
    tasks = sorted(next(iter(results.values()))["per_task"])

    def task_rates(arm):  # seed-averaged per-task pass rates
        return [statistics.mean(results[(arm, s)]["per_task"][t]["c"] / results[(arm, s)]["per_task"][t]["n"]
                                for s in acfg.seeds) for t in tasks]

    arms = {}
    for arm in acfg.arms:
        passes = [results[(arm, s)]["heldout_pass"] for s in acfg.seeds]
        rates = task_rates(arm)
        _, lo, hi = bootstrap_ci(rates, acfg.n_boot, acfg.alpha, seed=stream_seed(seed, "ablate-ci", arm))
        arms[arm] = {"heldout_pass": statistics.mean(passes), "ci_lo": lo, "ci_hi": hi,
                     "seed_sd": statistics.stdev(passes) if len(passes) > 1 else 0.0,
                     "per_seed": {str(s): p for s, p in zip(acfg.seeds, passes)},
                     "late_reward": statistics.mean(results[(arm, s)]["late_reward"] for s in acfg.seeds),
                     "late_entropy": statistics.mean(results[(arm, s)]["late_entropy"] for s in acfg.seeds),
                     "late_hardcode": statistics.mean(results[(arm, s)]["late_hardcode"] for s in acfg.seeds),
                     "per_task": dict(zip(tasks, rates))}
        if arm != "default" and "default" in acfg.arms:
            d, dlo, dhi = paired_bootstrap_diff(task_rates("default"), rates, acfg.n_boot, acfg.alpha,
                                                seed=stream_seed(seed, "ablate-paired", arm))
            arms[arm]["diff_vs_default"] = {"mean": d, "ci_lo": dlo, "ci_hi": dhi}
    first = next(iter(acfg.arms))
    ref = "default" if "default" in acfg.arms else first
    seed_sd = arms[ref]["seed_sd"]
    task_sd = statistics.stdev(task_rates(ref))
    power = [{"effect": e,
              "seeds_per_arm": seeds_for_power(seed_sd, e, POWER, LEVEL) if seed_sd > 0 else None,
              "tasks": tasks_for_power(task_sd, e, POWER, LEVEL) if task_sd > 0 else None} for e in EFFECTS]
    return {"arms": arms, "seeds": acfg.seeds, "steps": acfg.steps, "eval_per_task": acfg.eval_per_task,
            "tasks": tasks, "alpha": acfg.alpha, "late_window": results[(first, acfg.seeds[0])]["late_window"],
            "power": {"reference_arm": ref, "seed_sd": seed_sd, "task_sd": task_sd, "power": POWER, "alpha": LEVEL,
                      "rows": power}}
