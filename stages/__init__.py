"""The stage scripts. `python -m stages.<name>` runs this first, so the CPU numerics params.yaml asks for
(run.numerics) are pinned before any stage module imports torch; `run_stage` then validates the value and checks
what torch dispatched (agentrl.core.numerics)."""
from agentrl.core.numerics import pin_from_params

pin_from_params("params.yaml")
