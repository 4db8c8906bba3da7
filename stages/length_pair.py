"""Stage length_pair@<seed>: the length-bias pair (seq_mean_token_mean vs its token_mean twin) at one more seed,
training only, from the length start. A study outside the default pipeline (length.seeds is empty by default):
`dvc exp run -S 'length.seeds=[1,2,3]'` adds instances, `python -m agentrl study length-bias` summarizes them."""

from agentrl.backends.registry import load_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import LENGTH_STUDY_DIR, SPLIT, TOKENIZER, bundle_dir, policy_path, write_json
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.faults.length import length_pair_row
from agentrl.pipeline.instances import StageArguments, length_pair_instance, seed_arg
from agentrl.pipeline.stage import entry, run_stage
from agentrl.rl.guards import BundleGuard

SECTIONS = ["model", "rl", "length"]
USES = (TINYAGENT,)   # the registered entries it uses (imported: its code deps hold their modules)
READS = {"run": ["threads", "numerics"], "length": ["steps", "turns", "kl_coef", "tasks_per_step"]}
INPUTS = [TOKENIZER, SPLIT, policy_path("length_start")]


def main(seed: int | None = None):
    """The instance named by --seed, else by $DVC_STAGE (dvc.yaml passes nothing through the shell)."""
    seed = length_pair_instance(seed)

    def body(ctx):
        tok, split = load_tokenizer(), load_split()
        start, _ = load_checkpoint(TINYAGENT.name, policy_path("length_start"), tok, ctx.params["model"])
        row = length_pair_row(start, tok, split["train"], ctx.params["rl"], ctx.params, seed,
                              hooks_for=lambda cfg: [BundleGuard(bundle_dir(ctx.name), cfg)])
        write_json(LENGTH_STUDY_DIR / f"seed-{seed}.json", row)
        ctx.run.log_metrics({k: v for k, v in row.items() if isinstance(v, (int, float))})
        print(f"length_pair {seed}: length_fail change {row['faulty_fail_change']:+.2f} vs twin "
              f"{row['twin_fail_change']:+.2f}; signature holds: {row['holds']}")

    run_stage(f"length_pair@{seed}", SECTIONS, INPUTS, body, only=READS)


if __name__ == "__main__":
    p = StageArguments(prog="length_pair")
    p.add_argument("--seed", type=seed_arg)
    entry("length_pair", main, p.parse_args().seed)
