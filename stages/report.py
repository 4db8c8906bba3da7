"""Stage report: reports/capstone.md with its figures (reports/figures/capstone/), reports/capstone.json (the
numbers the report computes itself, with this stage's provenance) and reports/capstone_sources.json (every number
in the markdown with the `<file>.json:<path>` it was read from). All logic lives in agentrl.report."""
from agentrl.pipeline import run_stage
from agentrl.report import SECTIONS, build, input_paths


def body(ctx):
    summary = build(ctx.params, ctx.provenance, ".", require_faults=True)
    ctx.run.log_metrics(summary["metrics"])
    print(f"report: reports/capstone.md with {summary['numbers']} sourced numbers and "
          f"{len(summary['figures'])} figures ({', '.join(summary['figures'])})")


if __name__ == "__main__":
    run_stage("report", SECTIONS, input_paths(".", require_faults=True), body)
