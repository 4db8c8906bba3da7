"""The stage scripts. `python -m stages.<name>` runs this first: before any stage module imports torch, the params
file is read within its bounds, the sections the stage reads are validated and the CPU numerics params.yaml asks
for (run.numerics) are pinned (agentrl.pipeline.early); a problem is one line and exit code 2 in a fraction of a
second. `run_stage` then validates again and checks what torch dispatched (agentrl.core.numerics)."""
from agentrl.pipeline.early import check_stage

check_stage("params.yaml")
