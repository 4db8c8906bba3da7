"""Stage sft: the SFT cold start (one oracle demonstration per train task), and both starting policies described."""
import copy

import torch

from agentrl.evaluation import describe
from agentrl.pipeline import (MODELS_DIR, REPORTS, TASKS_DIR, derive_seed, load_split, load_tokenizer,
                              run_stage, write_json)
from agentrl.policy import load_for, save_policy
from agentrl.starting_policy import oracle_demos, train_sft
from agentrl.trainer import RLConfig


def body(ctx):
    cfg = ctx.params["sft"]
    tok, split = load_tokenizer(), load_split()
    base, _ = load_for(MODELS_DIR / "base.pt", tok, ctx.params["model"])
    sft = copy.deepcopy(base)
    demos = oracle_demos(split["train"], tok, torch.Generator().manual_seed(derive_seed(ctx.seed, "sft-demos")))
    losses = train_sft(sft, demos, tok, cfg.steps, cfg.lr)
    save_policy(MODELS_DIR / "sft.pt", sft, tok.hash, extra={"fingerprint": ctx.fingerprint})
    rl = RLConfig(seed=ctx.seed)
    described = {}
    for name, model in (("base", base), ("sft", sft)):
        g = torch.Generator().manual_seed(derive_seed(ctx.seed, "describe"))  # same stream for both: paired
        described[name] = describe(model, split["train"], tok, cfg.describe_per_task, g, rl)
    out = {"provenance": ctx.provenance, "sft_demos": len(demos),
           "sft_tokens": sum(d.n_policy_tokens for d in demos), "sft_steps": cfg.steps,
           "sft_loss_first": losses[0], "sft_loss_last": losses[-1], **described}
    write_json(REPORTS / "starting_policy.json", out)
    for name, d in described.items():
        ctx.run.log_metrics({f"{name}.{k}": v for k, v in d.items() if isinstance(v, (int, float))})
    print(f"sft: {len(demos)} demonstrations, {out['sft_tokens']} supervised tokens, {cfg.steps} steps")
    for name, d in described.items():
        print(f"  {name:4s} pass@1 {d['pass_at_1']:.3f}  pass@8 {d['pass_at_8']:.3f}  groups with gradient "
              f"{d['groups_with_gradient']:.2f}  entropy {d['entropy']:.3f}  reads {d['reads']:.2f}")


if __name__ == "__main__":
    run_stage("sft", ["model", "sft"], [TASKS_DIR / "tokenizer.json", TASKS_DIR / "split.json",
                                         MODELS_DIR / "base.pt"], body)
