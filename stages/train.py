"""Stage train: the main GRPO run from the base, with a checkpoint hook (frozen copy + validation) every N steps.

Resumable: a killed run restarts from its last checkpoint (model, optimizer and generator state, history) and
finishes bit-identical to an uninterrupted run. Checkpoints of another configuration are cleared, but only after
this run's params and inputs have been validated and loaded.
"""
import sys
import time

from agentrl.backends.registry import load_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import DATA, REPORTS, SPLIT, TOKENIZER, TRAIN_DIR, policy_path, write_json, write_metrics
from agentrl.core.seeding import generator
from agentrl.env.gym.spec import GYM
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.eval.evaluation import validator
from agentrl.pipeline.stage import run_stage
from agentrl.rl.guards import BundleGuard
from agentrl.rl.resume import CheckpointHook, ResumeClock, clear_checkpoints, read_resume, resume_point
from agentrl.rl.trainer import Hook, make_optimizer, train

SECTIONS = ["model", "rl", "train"]
USES = (TINYAGENT, GYM)   # the registered entries it uses (imported: its code deps hold their modules)
INPUTS = [TOKENIZER, SPLIT, policy_path("base"), DATA / "preflight" / "gate.json"]
WINDOW = 4  # first/last-steps means in train.json


class Progress(Hook):
    def __init__(self, steps: int, episodes: int):
        self.steps, self.episodes, self.last = steps, episodes, time.time()

    def on_row(self, step, state, row):
        now = time.time()
        eps = self.episodes / max(now - self.last, 1e-9)
        self.last = now
        print(f"train step {step + 1}/{self.steps}  reward {row['reward']:.3f}  reads {row['reads']:.2f}  "
              f"entropy {row['entropy']:.3f}  {eps:.0f} episodes/s", file=sys.stderr, flush=True)


def body(ctx):
    tcfg, cfg = ctx.params["train"], ctx.params["rl"]
    tok, split = load_tokenizer(), load_split()
    model, _ = load_checkpoint(TINYAGENT.name, policy_path("base"), tok, ctx.params["model"])
    optimizer = make_optimizer(model, cfg)
    gen = generator(ctx.seed)  # the root stream: training
    key = ctx.run.fingerprint
    resumed = resume_point(key, TINYAGENT.name)
    history, validation, start = [], [], 0
    if resumed is None:
        clear_checkpoints()
    else:
        model.load_state_dict(resumed["state_dict"])
        extra = resumed["extra"]
        optimizer.load_state_dict(extra["optimizer"])
        gen.set_state(extra["generator"])
        history, validation, start = list(extra["history"]), list(extra["validation"]), extra["step"]
        print(f"train: resuming from checkpoint step {start}", file=sys.stderr)
        for v in validation:   # this run holds every validation point, not only those after the resume
            ctx.run.log_metrics({"validation_pass": v["pass_rate"]}, v["step"])
    before = read_resume(key)
    clock = ResumeClock(key, before.get("seconds", 0.0), before.get("runs", []) + [ctx.run.run_id])
    ctx.run.previous_seconds = clock.seconds
    ctx.run.previous_runs = sorted(set(ctx.run.previous_runs) | set(before.get("runs", [])))
    hooks = [Progress(tcfg.steps, cfg.group_size * cfg.tasks_per_step), BundleGuard(TRAIN_DIR / "bundles", cfg),
             CheckpointHook(tok, validator(split["validation"], tok, cfg, tcfg.eval_per_task, ctx.seed,
                                           env=GYM.make(cfg, evaluation=True)),
                            tcfg.steps, tcfg.checkpoint_every, validation, ctx.run.log_metrics), clock]
    if start < tcfg.steps:
        history = train(model, split["train"], tok, cfg, tcfg.steps, env=GYM.make(cfg), hooks=hooks, generator=gen,
                        optimizer=optimizer, history=history, start_step=start)
    ctx.run.previous_seconds = clock.seconds  # this run's own time is added by stage_run
    ctx.run.log_history(history)
    write_json(REPORTS / "train_dashboard.json", history)
    n = min(WINDOW, len(history))
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)
    write_json(REPORTS / "train.json", {
        "steps": tcfg.steps, "checkpoint_every": tcfg.checkpoint_every,
        "validation_tasks": [t.name for t in split["validation"]], "eval_per_task": tcfg.eval_per_task,
        "checkpoints": validation, "window": n,
        "first4": {k: mean(history[:n], k) for k in ("reward", "reads", "entropy")},
        "last4": {k: mean(history[-n:], k) for k in ("reward", "reads", "entropy")}})
    write_metrics("train", {"reward_first4": mean(history[:n], "reward"), "reward_last4": mean(history[-n:], "reward"),
                            "validation_last": validation[-1]["pass_rate"]})
    ctx.run.log_artifact(REPORTS / "train_dashboard.json")
    ctx.run.log_artifact(REPORTS / "train.json")
    print(f"train: {tcfg.steps} steps; reward {mean(history[:n], 'reward'):.3f} -> {mean(history[-n:], 'reward'):.3f};"
          " validation " + ", ".join(f"{v['step']}: {v['pass_rate']:.2f}" for v in validation))


if __name__ == "__main__":
    run_stage("train", SECTIONS, INPUTS, body)
