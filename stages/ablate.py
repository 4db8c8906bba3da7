"""Stage ablate@<arm>-<seed>: one seeded ablation arm, 30 GRPO steps, then all held-out tasks evaluated with a
generator that depends on the seed only (so arms with the same seed share the evaluation stream)."""
import argparse

import torch

from agentrl.diagnostics import train_logged
from agentrl.evaluation import evaluate
from agentrl.pipeline import ABLATE_DIR, MODELS_DIR, TASKS_DIR, StageError, derive_seed, load_split, load_tokenizer, \
    run_stage, write_json
from agentrl.policy import load_for, save_policy
from agentrl.trainer import RLConfig


INSTANCE_PARAMS = ("steps", "eval_per_task", "kl_coef", "kl_kind")  # what an instance reads of `ablate`
LATE_WINDOW = 4  # "late" training statistics: mean of the last this-many steps


def arm_config(arm: str, rl: dict, acfg, seed: int) -> tuple[RLConfig, str]:
    """(RLConfig, starting policy) of an arm: default, kl (k3 to the start), sft (start from SFT), public reward."""
    overrides = {"default": {}, "kl": {"kl_coef": acfg.kl_coef, "kl_kind": acfg.kl_kind}, "sft": {},
                 "public": {"reward": "public"}}
    if arm not in overrides:
        raise StageError(f"ablate arm: unknown value {arm!r}; allowed: {', '.join(overrides)}")
    return RLConfig(**rl | {"seed": seed} | overrides[arm]), ("sft" if arm == "sft" else "base")


def main(arm: str, seed: int):
    def body(ctx):
        acfg = ctx.params["ablate"]
        tok, split = load_tokenizer(), load_split()
        cfg, start = arm_config(arm, ctx.params["rl"].to_dict(), acfg, seed)
        model, _ = load_for(MODELS_DIR / f"{start}.pt", tok, ctx.params["model"])
        history = train_logged(model, split["train"], tok, cfg, acfg.steps)
        g = torch.Generator().manual_seed(derive_seed(seed, "ablate-eval"))
        res = evaluate(model, split["heldout"], tok, acfg.eval_per_task, cfg.temperature, g, cfg)
        out_dir = ABLATE_DIR / f"{arm}-{seed}"
        save_policy(out_dir / "policy.pt", model, tok.hash, extra={"fingerprint": ctx.fingerprint})
        late = history[-LATE_WINDOW:]
        summary = {"arm": arm, "seed": seed, "start": start, "steps": acfg.steps, "fingerprint": ctx.fingerprint,
                   "mlflow_run_id": ctx.run.run_id, "config": cfg.to_dict(), "heldout_pass": res["pass_rate"],
                   "per_task": res["per_task"], "late_window": len(late),
                   "late_reward": sum(r["reward"] for r in late) / len(late),
                   "late_entropy": sum(r["entropy"] for r in late) / len(late),
                   "late_hardcode": sum(r["hardcode"] for r in late) / len(late),
                   "history": history}
        write_json(out_dir / "result.json", summary)
        ctx.run.set_tags({"ablate.arm": arm, "ablate.seed": str(seed)})
        ctx.run.log_history(history)
        ctx.run.log_metrics({"heldout_pass": res["pass_rate"], "late_reward": summary["late_reward"]})
        print(f"ablate {arm}-{seed}: held-out {res['pass_rate']:.3f}, late training reward {summary['late_reward']:.3f}")

    run_stage(f"ablate@{arm}-{seed}", ["model", "rl", "ablate"],
              [TASKS_DIR / "tokenizer.json", TASKS_DIR / "split.json", MODELS_DIR / f"{'sft' if arm == 'sft' else 'base'}.pt"],
              body, only={"ablate": INSTANCE_PARAMS})


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--arm", required=True)
    p.add_argument("--seed", type=int, required=True)
    a = p.parse_args()
    main(a.arm, a.seed)
