"""Stage threads: the main run's first steps again at another thread count. Where do the sampled batches first
differ, how far apart are the parameters at the end, and what does it do to held-out pass rates?"""
import torch

from agentrl.backends.registry import load_checkpoint, read_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import (
    CHECKPOINT_DIR,
    REPORTS,
    SPLIT,
    TOKENIZER,
    StageError,
    bundle_dir,
    checkpoint_path,
    policy_path,
    read_json,
    write_json,
    write_metrics,
)
from agentrl.core.seeding import generator
from agentrl.env.gym.spec import GYM
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.eval.evaluation import evaluate
from agentrl.eval.reproducibility import first_divergent_step, max_param_diff
from agentrl.pipeline.stage import run_stage
from agentrl.rl.guards import BundleGuard
from agentrl.rl.trainer import train

SECTIONS = ["model", "rl", "threads"]
USES = (TINYAGENT, GYM)   # the registered entries it uses (imported: its code deps hold their modules)
INPUTS = [TOKENIZER, SPLIT, policy_path("base"), CHECKPOINT_DIR, REPORTS / "train_dashboard.json"]


def body(ctx):
    tcfg, cfg = ctx.params["threads"], ctx.params["rl"]
    tok, split = load_tokenizer(), load_split()
    main_rows = read_json(REPORTS / "train_dashboard.json")
    ckpt = checkpoint_path(tcfg.steps)
    if len(main_rows) < tcfg.steps or not ckpt.exists():
        raise StageError(f"threads.steps: the main run has no checkpoint at step {tcfg.steps} "
                         "(choose a multiple of train.checkpoint_every, at most train.steps)")
    model, _ = load_checkpoint(TINYAGENT.name, policy_path("base"), tok, ctx.params["model"])
    torch.set_num_threads(tcfg.compare_threads)   # the experiment: the same run at another thread count ...
    rows = train(model, split["train"], tok, cfg, tcfg.steps, env=GYM.make(cfg),
                 hooks=[BundleGuard(bundle_dir(ctx.name), cfg)])
    torch.set_num_threads(ctx.threads)            # ... and back to run.threads for everything else
    first = first_divergent_step(rows, main_rows)
    main_model, _ = load_checkpoint(TINYAGENT.name, ckpt, tok, ctx.params["model"])
    max_diff = max_param_diff(read_checkpoint(TINYAGENT.name, ckpt)["state_dict"], model.state_dict())
    held = {label: evaluate(m, split["heldout"], tok, tcfg.eval_per_task, cfg.temperature,
                            generator(ctx.seed, "threads-eval"), cfg, env=GYM.make(cfg, evaluation=True))["pass_rate"]
            for label, m in (("main", main_model), ("compare", model))}
    out = {"steps": tcfg.steps, "main_threads": ctx.threads, "compare_threads": tcfg.compare_threads,
           "eval_per_task": tcfg.eval_per_task, "first_divergent_step": first, "identical_batches": first is None,
           "max_param_diff": max_diff, "heldout_main": held["main"], "heldout_compare": held["compare"],
           "reward_main": [r["reward"] for r in main_rows[:tcfg.steps]], "reward_compare": [r["reward"] for r in rows]}
    write_json(REPORTS / "threads.json", out)
    write_metrics("threads", {"first_divergent_step": first, "max_param_diff": max_diff})
    ctx.run.log_metrics({"max_param_diff": max_diff, "heldout_main": held["main"], "heldout_compare": held["compare"],
                         "first_divergent_step": -1 if first is None else first})
    print(f"threads: {ctx.threads} vs {tcfg.compare_threads} threads over {tcfg.steps} steps: first divergent batch "
          f"{'none' if first is None else f'at step {first}'}; max |param diff| {max_diff:.3g}; held-out "
          f"{held['main']:.3f} vs {held['compare']:.3f}")


if __name__ == "__main__":
    run_stage("threads", SECTIONS, INPUTS, body)
