"""Stage report: reports/capstone.md with its figures (reports/figures/capstone/), reports/capstone.json (the numbers
the report computes itself) and reports/capstone_sources.json (every number in the markdown with the
`<file>.json:<path>` it was read from). It renders stage outputs only; all logic lives in agentrl.report."""
from agentrl.core.config import SECTIONS as PARAM_SECTIONS
from agentrl.pipeline.stage import run_stage
from agentrl.report.build import build
from agentrl.report.compute import CAPSTONE, FIG_DIR, MARKDOWN, input_paths
from agentrl.rl import variants

SECTIONS = list(PARAM_SECTIONS)   # the pinned configuration: every section (no tensor work: no thread setting)
USES = (variants,)   # every variant a knob can name, registered: this stage validates every section


def body(ctx):
    summary = build(ctx.params, ".")
    ctx.run.log_metrics(summary["metrics"])
    for path, where in ((MARKDOWN, None), (CAPSTONE, None), (FIG_DIR, "figures/capstone")):
        ctx.run.log_artifact(path, where)
    print(f"report: {MARKDOWN} with {summary['numbers']} sourced numbers and {len(summary['figures'])} figures")


if __name__ == "__main__":
    run_stage("report", SECTIONS, input_paths("."), body, numeric=False)
