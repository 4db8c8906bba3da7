"""Stage test: the starting policy and the chosen checkpoint, once each, on the test tasks: per-task counts,
pass@k, task-bootstrap interval and the paired (same tasks, same sampling stream) difference. When select
reported stopping rules, the checkpoint each rule would have picked too, with its test cost against the chosen."""
from agentrl.backends.registry import load_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import (
    CHECKPOINT_DIR,
    COUNT,
    REPORTS,
    SPLIT,
    TOKENIZER,
    checkpoint_path,
    policy_path,
    read_json,
    write_json,
    write_metrics,
)
from agentrl.core.seeding import generator, stream_seed
from agentrl.env.gym.spec import GYM
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.eval.evaluation import evaluate
from agentrl.eval.stats import counts_summary, paired_bootstrap_diff
from agentrl.pipeline.stage import run_stage

SECTIONS = ["model", "rl", "test"]
USES = (TINYAGENT, GYM)   # the registered entries it uses (imported: its code deps hold their modules)
READS = {"rl": ["max_turns", "max_call_tokens", "rename", "temperature"]}  # the episode rules and the sampler
INPUTS = [TOKENIZER, SPLIT, policy_path("base"), CHECKPOINT_DIR, REPORTS / "selection.json"]
SELECTION_SHAPE = {"chosen": {"step": COUNT}, "stopping?": {str: {"chosen_step": COUNT}}}   # what the stage reads


def body(ctx):
    cfg, rl = ctx.params["test"], ctx.params["rl"]
    tok, split = load_tokenizer(), load_split()
    selection = read_json(REPORTS / "selection.json", SELECTION_SHAPE)
    step = selection["chosen"]["step"]
    def load(path):
        return load_checkpoint(TINYAGENT.name, path, tok, ctx.params["model"])[0]
    models = {"start": load(policy_path("base")), "chosen": load(checkpoint_path(step))}
    rules = {f"stop_{r}": v["chosen_step"] for r, v in selection.get("stopping", {}).items()}
    models.update({name: load(checkpoint_path(s)) for name, s in rules.items()})
    out = {"tasks": [t.name for t in split["test"]], "episodes_per_task": cfg.episodes_per_task, "ks": cfg.ks,
           "alpha": cfg.alpha, "chosen_step": step}
    for name, model in models.items():  # one stream for all: paired comparisons
        res = evaluate(model, split["test"], tok, cfg.episodes_per_task, rl.temperature, generator(ctx.seed, "test"),
                       rl, env=GYM.make(rl, evaluation=True))
        counts = {t: (v["n"], v["c"]) for t, v in res["per_task"].items()}
        out[name] = counts_summary(counts, cfg.ks, cfg.n_boot, cfg.alpha, stream_seed(ctx.seed, "test-ci", name))
    names = list(out["start"]["per_task"])
    a = [out["start"]["per_task"][t]["c"] / out["start"]["per_task"][t]["n"] for t in names]
    b = [out["chosen"]["per_task"][t]["c"] / out["chosen"]["per_task"][t]["n"] for t in names]
    diff, lo, hi = paired_bootstrap_diff(a, b, cfg.n_boot, cfg.alpha, seed=stream_seed(ctx.seed, "test-paired"))
    out["paired_diff"] = {"mean": diff, "ci_lo": lo, "ci_hi": hi}
    for name, s in rules.items():  # test pass rate the rule would have cost: chosen minus the rule's pick
        r = [out[name]["per_task"][t]["c"] / out[name]["per_task"][t]["n"] for t in names]
        cost, clo, chi = paired_bootstrap_diff(r, b, cfg.n_boot, cfg.alpha,
                                               seed=stream_seed(ctx.seed, "test-stop", name))
        out[name].update(step=s, cost={"mean": cost, "ci_lo": clo, "ci_hi": chi})
    write_json(REPORTS / "test.json", out)
    write_metrics("test", {"start_pass_at_1": out["start"]["pass_at_1"], "chosen_pass_at_1": out["chosen"]["pass_at_1"],
                           "chosen_ci_lo": out["chosen"]["ci_lo"], "chosen_ci_hi": out["chosen"]["ci_hi"],
                           "paired_diff": diff, "paired_ci_lo": lo, "paired_ci_hi": hi})
    ctx.run.log_metrics({"start.pass_at_1": out["start"]["pass_at_1"], "chosen.pass_at_1": out["chosen"]["pass_at_1"],
                         "paired_diff": diff})
    ctx.run.log_artifact(REPORTS / "test.json")
    for name in ("start", "chosen"):
        s = out[name]
        print(f"test: {name:6s} pass@1 {s['pass_at_1']:.3f} [{s['ci_lo']:.3f}, {s['ci_hi']:.3f}]  " +
              "  ".join(f"pass@{k} {v:.3f}" for k, v in s["pass_at_k"].items()))
    print(f"test: paired difference {diff:+.3f} [{lo:+.3f}, {hi:+.3f}]")
    for name in rules:
        c = out[name]["cost"]
        print(f"test: {name} (step {out[name]['step']}) pass@1 {out[name]['pass_at_1']:.3f}, cost {c['mean']:+.3f} "
              f"[{c['ci_lo']:+.3f}, {c['ci_hi']:+.3f}]")


if __name__ == "__main__":
    run_stage("test", SECTIONS, INPUTS, body, only=READS)
