"""Stage ablate_summary: per-arm means and seed spread, late training reward and entropy, the paired difference
from the default arm (seed-averaged per-task rates, task bootstrap), the power table, and the check that the
default arm at the main run's seed reproduces the main run's first steps exactly."""
import torch

from agentrl.backends.registry import read_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import (
    ABLATE_DIR,
    CHECKPOINT_DIR,
    REPORTS,
    StageError,
    ablation_dir,
    checkpoint_path,
    read_json,
    write_json,
    write_metrics,
)
from agentrl.eval.ablation_summary import summarize
from agentrl.pipeline.stage import run_stage
from agentrl.rl import variants

SECTIONS = ["ablate"]
USES = (TINYAGENT, variants)   # what it uses by name (imported: its code deps hold their modules); the
                               # variants: each arm's rl overrides are validated
INPUTS = [ABLATE_DIR, CHECKPOINT_DIR]


def same_weights(a_path, b_path) -> bool:
    a, b = read_checkpoint(TINYAGENT.name, a_path)["state_dict"], read_checkpoint(TINYAGENT.name, b_path)["state_dict"]
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def body(ctx):
    acfg = ctx.params["ablate"]
    results = {(arm, s): read_json(ablation_dir(arm, s) / "result.json") for arm in acfg.arms for s in acfg.seeds}
    out = summarize(results, acfg, ctx.seed)
    # the default arm at the main run's seed must be the main run's first `steps` steps, bit for bit
    identity = {"seed": ctx.seed, "step": acfg.steps, "checked": False, "equal": None}
    ckpt = checkpoint_path(acfg.steps)
    if "default" in acfg.arms and ctx.seed in acfg.seeds and ckpt.exists():
        equal = same_weights(ablation_dir("default", ctx.seed) / "policy.pt", ckpt)
        identity.update(checked=True, equal=equal, checkpoint=ckpt.as_posix())
        if not equal:
            raise StageError(f"default arm seed {ctx.seed} differs from the main run at step {acfg.steps}: "
                             "checkpoint evaluation or thread settings perturbed training")
    out["default_matches_main_run"] = identity
    write_json(REPORTS / "ablation.json", out)
    write_json(REPORTS / "plots" / "heldout_per_arm.json",
               [{"run": f"{arm}-{s}", "arm": arm, "seed": int(s), "heldout_pass": p}
                for arm, v in out["arms"].items() for s, p in v["per_seed"].items()])
    write_metrics("ablation", {**{f"{arm}_heldout": v["heldout_pass"] for arm, v in out["arms"].items()},
                               "seed_sd": out["power"]["seed_sd"]})
    arms = out["arms"]
    ctx.run.log_metrics({f"{a}.heldout_pass": v["heldout_pass"] for a, v in arms.items()}
                        | {"seed_sd": out["power"]["seed_sd"]})
    for arm, v in arms.items():
        diff = v.get("diff_vs_default")
        extra = f"  vs default {diff['mean']:+.3f} [{diff['ci_lo']:+.3f}, {diff['ci_hi']:+.3f}]" if diff else ""
        print(f"ablate: {arm:8s} held-out {v['heldout_pass']:.3f} (seed SD {v['seed_sd']:.3f})  late reward "
              f"{v['late_reward']:.3f}  entropy {v['late_entropy']:.3f}{extra}")
    print("ablate: power " + ", ".join(f"{r['effect']}: {r['seeds_per_arm']} seeds / {r['tasks']} tasks"
                                       for r in out["power"]["rows"]))
    print(f"ablate: default arm seed {ctx.seed} == main run step {acfg.steps}: {identity['equal']}")


if __name__ == "__main__":
    run_stage("ablate_summary", SECTIONS, INPUTS, body)
