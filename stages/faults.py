"""Stage faults: the fault catalogue (docs/guards.md). A healthy reference and every failure of the debugging
chapter, all with the same seed and from the RL base (the length pair from its own start, stage length_start);
per failure its healthy twin, the metric that exposes it, a signature check and a 2x2 dashboard panel."""
import sys

from agentrl.backends.registry import load_checkpoint
from agentrl.backends.tinyagent import TINYAGENT
from agentrl.core.artifacts import (
    FIGURES,
    REPORTS,
    SPLIT,
    TOKENIZER,
    policy_path,
    write_json,
    write_metrics,
    write_text,
)
from agentrl.env.gym.tokenizer import load_tokenizer
from agentrl.env.tasks import load_split
from agentrl.faults.catalogue import build_catalogue
from agentrl.faults.markdown import figure_specs, mlflow_metrics, render_markdown, report_json, signature_table, verdict
from agentrl.faults.signatures import signature_checks
from agentrl.pipeline.stage import run_stage
from agentrl.report.figures import fault_panel

SECTIONS = ["model", "rl", "faults", "length"]
USES = (TINYAGENT,)   # the registered entries it uses (imported: its code deps hold their modules)
READS = {"length": ["steps", "turns", "kl_coef", "tasks_per_step"]}
INPUTS = [TOKENIZER, SPLIT, policy_path("base"), policy_path("length_start")]
FIG_DIR = FIGURES / "faults"


def body(ctx):
    tok, split = load_tokenizer(), load_split()
    base, _ = load_checkpoint(TINYAGENT.name, policy_path("base"), tok, ctx.params["model"])
    length_start, _ = load_checkpoint(TINYAGENT.name, policy_path("length_start"), tok, ctx.params["model"])
    runs = build_catalogue(base, tok, split["train"], split["heldout"], ctx.params["rl"], ctx.params, ctx.seed,
                           length_start=length_start)
    checks = signature_checks(runs)
    figures = {}
    for spec in figure_specs(runs):
        name = spec.pop("name")
        fault_panel(FIG_DIR / f"{name}.png", name, **spec)
        figures[name] = f"figures/faults/{name}.png"   # relative to reports/
    rows, summary = mlflow_metrics(runs, checks)
    ctx.run.log_history(rows)
    ctx.run.log_metrics(summary)
    write_json(REPORTS / "faults.json", report_json(runs, checks, ctx.params, ctx.params["rl"], split["heldout"],
                                                    ctx.seed, figures))
    write_metrics("faults", {"failures": len(checks),
                             "required_hold": sum(c["required_holds"] is not False for c in checks.values())})
    write_text(REPORTS / "faults.md", render_markdown(runs, checks, ctx.params["faults"], ctx.threads,
                                                      split["heldout"], figures))
    ctx.run.log_artifact(REPORTS / "faults.md")
    ctx.run.log_artifact(FIG_DIR, "figures/faults")
    for line in signature_table(runs, checks):
        print(line)
    print("faults: signatures: " + ", ".join(f"{n} {verdict(r)}" for n, r in checks.items()), file=sys.stderr)


if __name__ == "__main__":
    run_stage("faults", SECTIONS, INPUTS, body, only=READS)
