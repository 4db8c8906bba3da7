"""Stage sft: the SFT cold start (one oracle demonstration per train task), and both starting policies described."""
import copy

from agentrl.backends.registry import load_checkpoint, save_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import REPORTS, SPLIT, TOKENIZER, policy_path, write_json, write_metrics
from agentrl.core.seeding import generator
from agentrl.env.gym.spec import GYM
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.eval.evaluation import DESCRIBE_GROUP_SIZE, describe
from agentrl.pipeline.stage import run_stage
from agentrl.starting.tinyagent import oracle_demos, train_sft

SECTIONS = ["model", "rl", "sft"]
USES = (TINYAGENT, GYM)   # the registered entries it uses (imported: its code deps hold their modules)
READS = {"rl": ["max_turns", "max_call_tokens", "rename"]}  # the episode rules describe() samples under
INPUTS = [TOKENIZER, SPLIT, policy_path("base")]


def body(ctx):
    cfg, rl = ctx.params["sft"], ctx.params["rl"]
    tok, split = load_tokenizer(), load_split()
    base, _ = load_checkpoint(TINYAGENT.name, policy_path("base"), tok, ctx.params["model"])
    sft = copy.deepcopy(base)
    demos = oracle_demos(split["train"], tok, generator(ctx.seed, "sft-demos"))
    losses = train_sft(sft, demos, tok, cfg.steps, cfg.lr)
    save_checkpoint(sft, policy_path("sft"), tok.hash)
    episodes = GYM.make(rl, evaluation=True)
    described = {name: describe(model, split["train"], tok, cfg.describe_per_task, generator(ctx.seed, "describe"), rl,
                                env=episodes)
                 for name, model in (("base", base), ("sft", sft))}   # the same stream for both: paired
    out = {"sft_demos": len(demos), "sft_tokens": sum(d.n_policy_tokens for d in demos), "sft_steps": cfg.steps,
           "sft_loss_first": losses[0], "sft_loss_last": losses[-1], "group_size": DESCRIBE_GROUP_SIZE, **described}
    write_json(REPORTS / "starting_policy.json", out)
    write_metrics("sft", {f"{name}_{k}": described[name][k] for name in ("base", "sft")
                         for k in ("pass_at_1", "groups_with_gradient")})
    for name, d in described.items():
        ctx.run.log_metrics({f"{name}.{k}": v for k, v in d.items() if isinstance(v, (int, float))})
    print(f"sft: {len(demos)} demonstrations, {out['sft_tokens']} supervised tokens, {cfg.steps} steps")
    for name, d in described.items():
        print(f"  {name:4s} pass@1 {d['pass_at_1']:.3f}  pass@8 {d['pass_at_8']:.3f}  groups with gradient "
              f"{d['groups_with_gradient']:.2f}  entropy {d['entropy']:.3f}  reads {d['reads']:.2f}")


if __name__ == "__main__":
    run_stage("sft", SECTIONS, INPUTS, body, only=READS)
