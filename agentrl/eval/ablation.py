"""One seeded ablation instance: an arm's config and starting policy, trained, then evaluated on every held-out task
from a stream that depends on the seed only (arms with the same seed share the evaluation episodes). The summary
over instances is agentrl.eval.ablation_summary."""
from __future__ import annotations

from dataclasses import replace

from agentrl.artifacts import StageError
from agentrl.eval.evaluation import evaluate
from agentrl.rl.trainer import train
from agentrl.seeding import generator

LATE_WINDOW = 4            # "late" training statistics: mean of the last this-many steps


def arm_config(arm: str, rl, acfg, seed: int):
    """(RLConfig, starting policy name) of an arm: default, kl (KL to the start), sft (start from SFT), public."""
    overrides = {"default": {}, "kl": {"kl_coef": acfg.kl_coef, "kl_kind": acfg.kl_kind}, "sft": {},
                 "public": {"reward": "public"}}
    if arm not in overrides:
        raise StageError(f"ablate arm: unknown value {arm!r}; allowed: {', '.join(overrides)}")
    return replace(rl, seed=seed, **overrides[arm]), ("sft" if arm == "sft" else "base")


def run_instance(model, arm: str, seed: int, start: str, cfg, acfg, tok, split: dict, hooks=()) -> dict:
    """Train one (arm, seed) instance in place and evaluate it on the held-out tasks."""
    history = train(model, split["train"], tok, cfg, acfg.steps, hooks=hooks)
    res = evaluate(model, split["heldout"], tok, acfg.eval_per_task, cfg.temperature,
                   generator(seed, "ablate-eval"), cfg)
    late = history[-LATE_WINDOW:]
    return {"arm": arm, "seed": seed, "start": start, "steps": acfg.steps, "config": cfg.to_dict(),
            "heldout_pass": res["pass_rate"], "per_task": res["per_task"], "late_window": len(late),
            "late_reward": sum(r["reward"] for r in late) / len(late),
            "late_entropy": sum(r["entropy"] for r in late) / len(late),
            "late_hardcode": sum(r["hardcode"] for r in late) / len(late), "history": history}
