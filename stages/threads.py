"""Stage threads: the main run's first steps again at another thread count. Where do the sampled batches first
differ, how far apart are the parameters at the end, and what does it do to held-out pass rates?"""
import torch

from agentrl.diagnostics import train_logged
from agentrl.evaluation import evaluate
from agentrl.pipeline import (MODELS_DIR, REPORTS, TASKS_DIR, TRAIN_DIR, StageError, derive_seed, load_split,
                              load_tokenizer, read_json, run_stage, write_json)
from agentrl.policy import load_for, read_checkpoint
from agentrl.trainer import RLConfig


def body(ctx):
    tcfg = ctx.params["threads"]
    tok, split = load_tokenizer(), load_split()
    main_rows = read_json(REPORTS / "train_dashboard.json")
    ckpt = TRAIN_DIR / "checkpoints" / f"step_{tcfg.steps:04d}.pt"
    if len(main_rows) < tcfg.steps or not ckpt.exists():
        raise StageError(f"threads.steps: the main run has no checkpoint at step {tcfg.steps} "
                         "(choose a multiple of train.checkpoint_every, at most train.steps)")
    cfg = RLConfig(**ctx.params["rl"].to_dict() | {"seed": ctx.seed})
    model, _ = load_for(MODELS_DIR / "base.pt", tok, ctx.params["model"])
    torch.set_num_threads(tcfg.compare_threads)
    rows = train_logged(model, split["train"], tok, cfg, tcfg.steps)
    torch.set_num_threads(ctx.threads)
    first = next((r["step"] for r, m in zip(rows, main_rows) if r["batch_hash"] != m["batch_hash"]), None)
    main_model, _ = load_for(ckpt, tok, ctx.params["model"])
    a, b = read_checkpoint(ckpt)["state_dict"], model.state_dict()
    max_diff = max(float((a[k] - b[k]).abs().max()) for k in a)
    held = {}
    for label, m in (("main", main_model), ("compare", model)):
        g = torch.Generator().manual_seed(derive_seed(ctx.seed, "threads-eval"))
        held[label] = evaluate(m, split["heldout"], tok, tcfg.eval_per_task, cfg.temperature, g, cfg)["pass_rate"]
    out = {"provenance": ctx.provenance, "steps": tcfg.steps, "main_threads": ctx.threads,
           "compare_threads": tcfg.compare_threads, "eval_per_task": tcfg.eval_per_task, "first_divergent_step": first,
           "identical_batches": first is None, "max_param_diff": max_diff,
           "heldout_main": held["main"], "heldout_compare": held["compare"],
           "reward_main": [r["reward"] for r in main_rows[:tcfg.steps]], "reward_compare": [r["reward"] for r in rows]}
    write_json(REPORTS / "threads.json", out)
    ctx.run.log_metrics({"max_param_diff": max_diff, "heldout_main": held["main"], "heldout_compare": held["compare"],
                         "first_divergent_step": -1 if first is None else first})
    print(f"threads: {ctx.threads} vs {tcfg.compare_threads} threads over {tcfg.steps} steps: first divergent batch "
          f"{'none' if first is None else f'at step {first}'}; max |param diff| {max_diff:.3g}; held-out "
          f"{held['main']:.3f} vs {held['compare']:.3f}")


if __name__ == "__main__":
    run_stage("threads", ["model", "rl", "threads"], [TASKS_DIR / "tokenizer.json", TASKS_DIR / "split.json",
                                                       MODELS_DIR / "base.pt", TRAIN_DIR / "checkpoints",
                                                       REPORTS / "train_dashboard.json"], body)
