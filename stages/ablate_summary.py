"""Stage ablate_summary: per-arm means and seed spread, late training reward and entropy, the paired
difference from the default arm (seed-averaged per-task rates, task bootstrap), the power table, and the
check that the default arm at the main run's seed reproduces the main run's first steps exactly."""
import statistics

import torch

from agentrl.pipeline import ABLATE_DIR, REPORTS, TRAIN_DIR, StageError, derive_seed, read_json, run_stage, write_json
from agentrl.policy import read_checkpoint
from agentrl.stats import bootstrap_ci, paired_bootstrap_diff, seeds_for_power, tasks_for_power

EFFECTS = (0.10, 0.05, 0.02)
POWER, LEVEL = 0.8, 0.05  # power of the two-sided t-tests, and their significance level


def body(ctx):
    acfg = ctx.params["ablate"]
    results = {(arm, s): read_json(ABLATE_DIR / f"{arm}-{s}" / "result.json") for arm in acfg.arms for s in acfg.seeds}
    tasks = sorted(next(iter(results.values()))["per_task"])

    def task_rates(arm):  # seed-averaged per-task pass rates
        return [statistics.mean(results[(arm, s)]["per_task"][t]["c"] / results[(arm, s)]["per_task"][t]["n"]
                                for s in acfg.seeds) for t in tasks]

    arms = {}
    for arm in acfg.arms:
        passes = [results[(arm, s)]["heldout_pass"] for s in acfg.seeds]
        rates = task_rates(arm)
        mean, lo, hi = bootstrap_ci(rates, acfg.n_boot, acfg.alpha, seed=derive_seed(ctx.seed, "ablate-ci", arm))
        arms[arm] = {"heldout_pass": statistics.mean(passes), "ci_lo": lo, "ci_hi": hi,
                     "seed_sd": statistics.stdev(passes) if len(passes) > 1 else 0.0,
                     "per_seed": {str(s): p for s, p in zip(acfg.seeds, passes)},
                     "late_reward": statistics.mean(results[(arm, s)]["late_reward"] for s in acfg.seeds),
                     "late_entropy": statistics.mean(results[(arm, s)]["late_entropy"] for s in acfg.seeds),
                     "late_hardcode": statistics.mean(results[(arm, s)]["late_hardcode"] for s in acfg.seeds),
                     "per_task": dict(zip(tasks, rates)),
                     "runs": {str(s): {"mlflow_run_id": results[(arm, s)]["mlflow_run_id"],
                                       "fingerprint": results[(arm, s)]["fingerprint"]} for s in acfg.seeds}}
        if arm != "default" and "default" in acfg.arms:
            d, dlo, dhi = paired_bootstrap_diff(task_rates("default"), rates, acfg.n_boot, acfg.alpha,
                                                seed=derive_seed(ctx.seed, "ablate-paired", arm))
            arms[arm]["diff_vs_default"] = {"mean": d, "ci_lo": dlo, "ci_hi": dhi}

    # power: seed SD of the default arm; per-task SD of the default arm's seed-averaged rates
    ref = "default" if "default" in acfg.arms else acfg.arms[0]
    seed_sd = arms[ref]["seed_sd"]
    task_sd = statistics.stdev(task_rates(ref))
    power = [{"effect": e,
              "seeds_per_arm": seeds_for_power(seed_sd, e, POWER, LEVEL) if seed_sd > 0 else None,
              "tasks": tasks_for_power(task_sd, e, POWER, LEVEL) if task_sd > 0 else None} for e in EFFECTS]

    # the default arm at the main run's seed must be the main run's first `steps` steps, bit for bit
    identity = {"seed": ctx.seed, "step": acfg.steps, "checked": False, "equal": None}
    ckpt = TRAIN_DIR / "checkpoints" / f"step_{acfg.steps:04d}.pt"
    if "default" in acfg.arms and ctx.seed in acfg.seeds and ckpt.exists():
        a = read_checkpoint(ABLATE_DIR / f"default-{ctx.seed}" / "policy.pt")["state_dict"]
        b = read_checkpoint(ckpt)["state_dict"]
        equal = a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
        identity.update(checked=True, equal=equal, checkpoint=str(ckpt))
        if not equal:
            raise StageError(f"default arm seed {ctx.seed} differs from the main run at step {acfg.steps}: "
                             "checkpoint evaluation or thread settings perturbed training")
    out = {"provenance": ctx.provenance, "arms": arms, "seeds": acfg.seeds, "steps": acfg.steps,
           "eval_per_task": acfg.eval_per_task, "tasks": tasks, "alpha": acfg.alpha,
           "late_window": results[(acfg.arms[0], acfg.seeds[0])]["late_window"],
           "power": {"reference_arm": ref, "seed_sd": seed_sd, "task_sd": task_sd, "power": POWER, "alpha": LEVEL,
                     "rows": power},
           "default_matches_main_run": identity}
    write_json(REPORTS / "ablation.json", out)
    ctx.run.log_metrics({f"{a}.heldout_pass": v["heldout_pass"] for a, v in arms.items()} | {"seed_sd": seed_sd})
    for arm, v in arms.items():
        diff = v.get("diff_vs_default")
        extra = f"  vs default {diff['mean']:+.3f} [{diff['ci_lo']:+.3f}, {diff['ci_hi']:+.3f}]" if diff else ""
        print(f"ablate: {arm:8s} held-out {v['heldout_pass']:.3f} (seed SD {v['seed_sd']:.3f})  late reward "
              f"{v['late_reward']:.3f}  entropy {v['late_entropy']:.3f}{extra}")
    print("ablate: power " + ", ".join(f"{r['effect']}: {r['seeds_per_arm']} seeds / {r['tasks']} tasks" for r in power))
    print(f"ablate: default arm seed {ctx.seed} == main run step {acfg.steps}: {identity['equal']}")


if __name__ == "__main__":
    run_stage("ablate_summary", ["ablate"], [ABLATE_DIR, TRAIN_DIR / "checkpoints"], body)
