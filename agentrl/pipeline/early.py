"""What a stage process checks before its own module is imported: `python -m stages.<name>` runs stages/__init__.py
first, which calls `check_stage()`.

A stage module imports torch at its top (4 s quiet, 15-30 s on a loaded machine), so a bad param found by
`run_stage` would be refused only after that. Here, inside the error boundary and without torch, the params file is
read within its bounds (agentrl.core.config.read_params_file: size, encoding, depth, integer digits), the sections
the stage reads are validated but for the names of registered variants (the modules that register them import
torch; `run_stage` checks those), and the CPU numerics the stage runs under are pinned and checked against the CPU
(agentrl.core.numerics). A problem is the same one line and exit code 2 that `run_stage` would give, in a fraction
of a second. The sections come from the stage script's own `SECTIONS` literal and `numeric=False` argument, read
from its source (tests/test_dvc_yaml.py checks the reading against every imported stage module). A lab's model
directory is checked here too (agentrl.backends.model_dir: a second, never the weights), and the tracking store is
probed (agentrl.tracking.store). On a refusal or a signal, the outputs DVC removed before running the stage are put
back (agentrl.pipeline.restore).
"""
from __future__ import annotations

import ast
import importlib
import os
import re
import sys
from pathlib import Path

from agentrl.core.boundary import end_quietly_on_signals, guard
from agentrl.core.config import SECTIONS, load_params, read_params_file
from agentrl.core.knobs import registries_deferred
from agentrl.core.lab_config import instance_spec, stage_mode
from agentrl.core.numerics import NUMERICS_MODES, pin, running_stage
from agentrl.pipeline.restore import restore_outputs
from agentrl.tracking.deferred import DEFER_ENV
from agentrl.tracking.store import probe, tracking_uri

STAGES = Path(__file__).resolve().parents[2] / "stages"


def stage_declaration(stage: str, stages_dir: Path = STAGES) -> tuple[list[str], bool] | None:
    """(the params sections, whether the stage does tensor work) of stages/<stage>.py, from its source: the
    `SECTIONS = [...]` literal (any other expression: every section) and a `run_stage(..., numeric=False)` call.
    None when there is no such script."""
    path = stages_dir / f"{stage}.py"
    if not path.is_file():
        return None
    tree = ast.parse(path.read_text())
    sections: list[str] = list(SECTIONS)
    numeric = True
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SECTIONS" for t in node.targets):
            try:
                sections = list(ast.literal_eval(node.value))
            except ValueError:
                sections = list(SECTIONS)
        elif isinstance(node, ast.Call) and getattr(node.func, "id", None) == "run_stage":
            for kw in node.keywords:
                if kw.arg == "numeric" and isinstance(kw.value, ast.Constant) and kw.value.value is False:
                    numeric = False
    return sections, numeric


def _check(stage: str, instance: str | None, path: str) -> None:
    declared = stage_declaration(stage)
    if declared is None:
        return
    sections, numeric = declared
    wanted = list(dict.fromkeys((["run"] if numeric else []) + sections))
    raw = read_params_file(path)
    with registries_deferred():
        load_params([s for s in ("run", "lab") if s in wanted], path)   # what decides the mode, validated first
        mode = stage_mode(raw, stage, instance)
        if mode in NUMERICS_MODES:   # a stage without tensor work may leave run invalid: it does not read it
            pin(mode)
        load_params(wanted, path)
    spec = instance_spec(raw.get("lab"), instance) if stage == "lab" else None
    if isinstance(spec, dict) and isinstance(spec.get("model"), str):   # a lab's model directory, before torch
        # imported by name: only the lab stage runs this, and its code deps hold the module (through the hf backend)
        model_dir = importlib.import_module("agentrl.backends.model_dir")
        where = instance[len("file:"):] if instance.startswith("file:") else \
            f"lab.configs.{re.sub(r'-[0-9]+$', '', instance)}"
        model_dir.check_model_dir(spec["model"], f"{where}.model")
    if not os.environ.get(DEFER_ENV):   # the tracking store, as run_stage will probe it (no MLflow import)
        probe(tracking_uri())


def check_stage(path: str = "params.yaml") -> None:
    """For a stage process only (`python -m stages.<name>`; anything else imports stages/ freely): validate and
    pin as the module doc says; on a problem print its one line and exit with the boundary's code."""
    stage, instance = running_stage()
    if stage is None:
        return
    code = guard(stage if instance is None else f"{stage}@{instance}", _check, stage, instance, path)
    if code:
        restore_outputs()   # what DVC removed before running the stage (agentrl.pipeline.restore)
        sys.exit(code)
    end_quietly_on_signals(stage if instance is None else f"{stage}@{instance}",   # while the stage imports torch
                           on_end=restore_outputs)
