"""Stage train: the main GRPO run from the base, with a checkpoint hook (frozen copy + validation) every N steps.

Resumable: a killed run restarts from its last checkpoint (model, optimizer and generator state, history) and
finishes bit-identical to an uninterrupted run. Checkpoints from different params/inputs/code are discarded.
"""
import time

import torch

from agentrl.diagnostics import train_logged
from agentrl.evaluation import evaluate
from agentrl.pipeline import (MODELS_DIR, REPORTS, TASKS_DIR, TRAIN_DIR, derive_seed, load_split,
                              load_tokenizer, run_stage, write_json)
from agentrl.policy import CheckpointError, load_for, read_checkpoint, save_policy
from agentrl.trainer import RLConfig, make_optimizer
from agentrl.tracking import resume_key

CKPT_DIR = TRAIN_DIR / "checkpoints"
WINDOW = 4  # first/last-steps means in train.json


def checkpoint_path(step: int):
    return CKPT_DIR / f"step_{step:04d}.pt"


def latest_checkpoint(key: str):
    """The newest checkpoint written by this exact configuration; clears checkpoints of any other."""
    found = sorted(CKPT_DIR.glob("step_*.pt"))
    for path in reversed(found):
        try:
            payload = read_checkpoint(path)
        except CheckpointError:
            continue  # a checkpoint cut off mid-write is skipped; the previous one is used
        if payload["extra"].get("resume_key") == key:
            return payload
        break
    for path in CKPT_DIR.glob("*"):
        path.unlink()
    return None


def body(ctx):
    tok, split = load_tokenizer(), load_split()
    tcfg = ctx.params["train"]
    cfg = RLConfig(**ctx.params["rl"].to_dict() | {"seed": ctx.seed})
    model, _ = load_for(MODELS_DIR / "base.pt", tok, ctx.params["model"])
    optimizer = make_optimizer(model, cfg)
    generator = torch.Generator().manual_seed(cfg.seed)
    history, validation, start = [], [], 0
    key = resume_key(ctx.provenance)
    CKPT_DIR.mkdir(parents=True, exist_ok=True)
    resumed = latest_checkpoint(key)
    if resumed is not None:
        model.load_state_dict(resumed["state_dict"])
        extra = resumed["extra"]
        optimizer.load_state_dict(extra["optimizer"])
        generator.set_state(extra["generator"])
        history, validation, start = list(extra["history"]), list(extra["validation"]), extra["step"]
        print(f"train: resuming from checkpoint step {start}")

    def hook(step, model, optimizer, generator, history):
        if step % tcfg.checkpoint_every and step != tcfg.steps:
            return
        g = torch.Generator().manual_seed(derive_seed(ctx.seed, "validation"))  # same stream at every checkpoint
        res = evaluate(model, split["validation"], tok, tcfg.eval_per_task, cfg.temperature, g, cfg)
        validation.append({"step": step, "pass_rate": res["pass_rate"], "per_task": res["per_task"]})
        ctx.run.log_metrics({"validation_pass": res["pass_rate"]}, step=step)
        save_policy(checkpoint_path(step), model, tok.hash, extra={
            "step": step, "optimizer": optimizer.state_dict(), "generator": generator.get_state(),
            "history": history, "validation": validation, "resume_key": key, "fingerprint": ctx.fingerprint})

    t0, last = time.time(), [time.time()]

    def progress(row):
        now = time.time()
        eps = cfg.group_size * cfg.tasks_per_step / max(now - last[0], 1e-9)
        last[0] = now
        print(f"train step {row['step'] + 1}/{tcfg.steps}  reward {row['reward']:.3f}  reads {row['reads']:.2f}  "
              f"entropy {row['entropy']:.3f}  {eps:.0f} episodes/s", file=__import__('sys').stderr, flush=True)

    if start < tcfg.steps:
        history = train_logged(model, split["train"], tok, cfg, tcfg.steps, generator=generator, optimizer=optimizer,
                               history=history, start_step=start, hook=hook, progress=progress,
                               bundle_dir=TRAIN_DIR / "bundles")
    ctx.run.log_history(history)
    write_json(REPORTS / "train_dashboard.json", history)
    n = min(WINDOW, len(history))
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)  # noqa: E731
    write_json(REPORTS / "train.json", {
        "provenance": ctx.provenance, "steps": tcfg.steps, "checkpoint_every": tcfg.checkpoint_every,
        "validation_tasks": [t.name for t in split["validation"]], "eval_per_task": tcfg.eval_per_task,
        "checkpoints": validation, "window": n,
        "first4": {k: mean(history[:n], k) for k in ("reward", "reads", "entropy")},
        "last4": {k: mean(history[-n:], k) for k in ("reward", "reads", "entropy")},
        "wall_seconds": time.time() - t0})
    print(f"train: {tcfg.steps} steps; reward {mean(history[:n], 'reward'):.3f} -> {mean(history[-n:], 'reward'):.3f}; "
          "validation " + ", ".join(f"{v['step']}: {v['pass_rate']:.2f}" for v in validation))


if __name__ == "__main__":
    run_stage("train", ["model", "rl", "train"], [TASKS_DIR / "tokenizer.json", TASKS_DIR / "split.json",
                                                   MODELS_DIR / "base.pt"], body)
