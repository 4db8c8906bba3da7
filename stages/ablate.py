"""Stage ablate@<arm>-<seed>: one seeded ablation arm, then every held-out task evaluated with a generator that
depends on the seed only (so arms with the same seed share the evaluation stream)."""

from agentrl.backends.registry import load_checkpoint, save_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import SPLIT, TOKENIZER, ablation_dir, bundle_dir, policy_path, write_json
from agentrl.core.config import STARTS, UserError, read_params_file
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.eval.ablation import arm_config, run_instance
from agentrl.pipeline.instances import StageArguments, ablation_instance, seed_arg
from agentrl.pipeline.stage import entry, run_stage
from agentrl.rl.guards import BundleGuard

SECTIONS = ["model", "rl", "ablate"]
USES = (TINYAGENT,)   # the registered entries it uses (imported: its code deps hold their modules)
# not the instance lists; of ablate.arms only the instance's own arm (dvc.yaml: ablate.arms.${item.arm})
READS = {"run": ["threads", "numerics"], "ablate": ["steps", "eval_per_task", "arms"]}


def declared_start(arm: str) -> str:
    """The arm's starting policy as params.yaml names it ('base' when unreadable: run_stage reports why)."""
    try:
        start = read_params_file()["ablate"]["arms"][arm].get("start", "base")
    except (UserError, KeyError, TypeError, AttributeError):
        return "base"
    return start if start in STARTS else "base"


def main(arm: str | None = None, seed: int | None = None):
    """The instance named by --arm/--seed, else by $DVC_STAGE (dvc.yaml passes nothing through the shell)."""
    arm, seed = ablation_instance(arm, seed)
    start = declared_start(arm)

    def body(ctx):
        acfg = ctx.params["ablate"]
        tok, split = load_tokenizer(), load_split()
        cfg, start_name = arm_config(arm, ctx.params["rl"], acfg, seed)
        model, _ = load_checkpoint(TINYAGENT.name, policy_path(start_name), tok, ctx.params["model"])
        guard = BundleGuard(bundle_dir(ctx.name), cfg)
        result = run_instance(model, arm, seed, start_name, cfg, acfg, tok, split, hooks=[guard])
        out = ablation_dir(arm, seed)
        save_checkpoint(model, out / "policy.pt", tok.hash)
        write_json(out / "result.json", result)
        ctx.run.set_tags({"ablate.arm": arm, "ablate.seed": str(seed)})
        ctx.run.log_history(result["history"])
        ctx.run.log_metrics({"heldout_pass": result["heldout_pass"], "late_reward": result["late_reward"]})
        print(f"ablate {arm}-{seed}: held-out {result['heldout_pass']:.3f}, late training reward "
              f"{result['late_reward']:.3f}")

    only = {**READS, "ablate": ["steps", "eval_per_task", f"arms.{arm}"]}
    run_stage(f"ablate@{arm}-{seed}", SECTIONS, [TOKENIZER, SPLIT, policy_path(start)], body, only=only)


if __name__ == "__main__":
    p = StageArguments(prog="ablate")
    p.add_argument("--arm")
    p.add_argument("--seed", type=seed_arg)
    a = p.parse_args()
    entry("ablate", main, a.arm, a.seed)
