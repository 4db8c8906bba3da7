"""Stage test: the starting policy and the chosen checkpoint, once each, on the test tasks: per-task counts,
pass@k, task-bootstrap interval and the paired (same tasks, same sampling stream) difference."""
import torch

from agentrl.evaluation import evaluate
from agentrl.policy import load_for
from agentrl.pipeline import (MODELS_DIR, REPORTS, TASKS_DIR, TRAIN_DIR, derive_seed, load_split,
                              load_tokenizer, read_json, run_stage, write_json)
from agentrl.stats import bootstrap_ci, mean_pass_at_k, paired_bootstrap_diff, pass_at_k
from agentrl.trainer import RLConfig


def summarize(res: dict, ks: list, cfg, seed: int) -> dict:
    counts = {name: (v["n"], v["c"]) for name, v in res["per_task"].items()}
    rates = [c / n for n, c in counts.values()]
    mean, lo, hi = bootstrap_ci(rates, cfg.n_boot, cfg.alpha, seed=seed)
    return {"pass_at_1": mean_pass_at_k(list(counts.values()), 1), "ci_lo": lo, "ci_hi": hi,
            "pass_at_k": {str(k): mean_pass_at_k(list(counts.values()), k) for k in ks},
            "per_task": {name: {"n": n, "c": c, **{f"pass_at_{k}": pass_at_k(n, c, k) for k in ks}}
                         for name, (n, c) in counts.items()}}


def body(ctx):
    cfg = ctx.params["test"]
    tok, split = load_tokenizer(), load_split()
    selection = read_json(REPORTS / "selection.json")
    step = selection["chosen"]["step"]
    rl = RLConfig(**ctx.params["rl"].to_dict() | {"seed": ctx.seed})
    start, _ = load_for(MODELS_DIR / "base.pt", tok, ctx.params["model"])
    chosen, _ = load_for(TRAIN_DIR / "checkpoints" / f"step_{step:04d}.pt", tok, ctx.params["model"])
    out = {"provenance": ctx.provenance, "tasks": [t.name for t in split["test"]],
           "episodes_per_task": cfg.episodes_per_task, "ks": cfg.ks, "alpha": cfg.alpha, "chosen_step": step}
    for name, model in (("start", start), ("chosen", chosen)):
        g = torch.Generator().manual_seed(derive_seed(ctx.seed, "test"))  # one stream for both: a paired comparison
        res = evaluate(model, split["test"], tok, cfg.episodes_per_task, rl.temperature, g, rl)
        out[name] = summarize(res, cfg.ks, cfg, derive_seed(ctx.seed, "test-ci", name))
    names = list(out["start"]["per_task"])
    a = [out["start"]["per_task"][t]["c"] / out["start"]["per_task"][t]["n"] for t in names]
    b = [out["chosen"]["per_task"][t]["c"] / out["chosen"]["per_task"][t]["n"] for t in names]
    diff, lo, hi = paired_bootstrap_diff(a, b, cfg.n_boot, cfg.alpha, seed=derive_seed(ctx.seed, "test-paired"))
    out["paired_diff"] = {"mean": diff, "ci_lo": lo, "ci_hi": hi}
    write_json(REPORTS / "test.json", out)
    ctx.run.log_metrics({"start.pass_at_1": out["start"]["pass_at_1"], "chosen.pass_at_1": out["chosen"]["pass_at_1"],
                         "paired_diff": diff})
    for name in ("start", "chosen"):
        s = out[name]
        print(f"test: {name:6s} pass@1 {s['pass_at_1']:.3f} [{s['ci_lo']:.3f}, {s['ci_hi']:.3f}]  " +
              "  ".join(f"pass@{k} {v:.3f}" for k, v in s["pass_at_k"].items()))
    print(f"test: paired difference {diff:+.3f} [{lo:+.3f}, {hi:+.3f}]")


if __name__ == "__main__":
    run_stage("test", ["model", "rl", "test"], [TASKS_DIR / "tokenizer.json", TASKS_DIR / "split.json",
                                                 MODELS_DIR / "base.pt", TRAIN_DIR / "checkpoints",
                                                 REPORTS / "selection.json"], body)
