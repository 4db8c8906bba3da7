"""One seeded ablation instance: an arm's config and starting policy (`ablate.arms` in params.yaml), trained, then
evaluated on every held-out task from a stream that depends on the seed only (arms with the same seed share the
evaluation episodes). The summary over instances is agentrl.eval.ablation_summary."""
from __future__ import annotations

from dataclasses import replace

from agentrl.core.artifacts import StageError
from agentrl.core.config import ConfigError, arm_overrides
from agentrl.core.seeding import generator
from agentrl.env.gym.spec import GYM
from agentrl.eval.evaluation import evaluate
from agentrl.rl.trainer import train

LATE_WINDOW = 4            # "late" training statistics: mean of the last this-many steps


def arm_config(arm: str, rl, acfg, seed: int):
    """(RLConfig, starting policy name) of an arm: the rl section with the arm's overrides, at `seed`."""
    if arm not in acfg.arms:
        raise StageError(f"ablate arm: unknown value {arm!r}; allowed: {', '.join(acfg.arms)} (ablate.arms)")
    overrides, start = arm_overrides(arm, acfg.arms[arm])
    try:
        return replace(rl, seed=seed, **overrides), start
    except ConfigError as exc:  # a value that is fine alone but not with the rest of rl:
        field_, rest = str(exc).split(":", 1)
        raise ConfigError(f"ablate.arms: {arm}: rl.{field_.split('.', 1)[-1]}:{rest}") from None


def run_instance(model, arm: str, seed: int, start: str, cfg, acfg, tok, split: dict, hooks=()) -> dict:
    """Train one (arm, seed) instance in place and evaluate it on the held-out tasks."""
    history = train(model, split["train"], tok, cfg, acfg.steps, env=GYM.make(cfg), hooks=hooks)
    res = evaluate(model, split["heldout"], tok, acfg.eval_per_task, cfg.temperature,
                   generator(seed, "ablate-eval"), cfg, env=GYM.make(cfg, evaluation=True))
    late = history[-LATE_WINDOW:]
    return {"arm": arm, "seed": seed, "start": start, "steps": acfg.steps, "config": cfg.to_dict(),
            "heldout_pass": res["pass_rate"], "per_task": res["per_task"], "late_window": len(late),
            "late_reward": sum(r["reward"] for r in late) / len(late),
            "late_entropy": sum(r["entropy"] for r in late) / len(late),
            "late_hardcode": sum(r["hardcode"] for r in late) / len(late), "history": history}
