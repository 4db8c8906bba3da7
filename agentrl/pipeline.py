"""What every stage script shares: validated params, thread count, input checks, one MLflow run, artifact IO.

A stage script is: `run_stage(name, sections, inputs, body)`. Params and inputs are validated first (one-line
error, exit code 2, nothing written); then torch threads are set from run.threads before any tensor work;
then `body(ctx)` runs inside the stage's MLflow run and writes its outputs.
"""
from __future__ import annotations

import json
import math
import os
import sys
from dataclasses import dataclass, fields
from pathlib import Path

from agentrl.config import UserError

DATA = Path("data")
REPORTS = Path("reports")
FIGURES = REPORTS / "figures"
TASKS_DIR = DATA / "tasks"
MODELS_DIR = DATA / "models"
TRAIN_DIR = DATA / "train"
ABLATE_DIR = DATA / "ablate"


class StageError(UserError):
    """A problem the user can fix (missing/corrupted artifact, bad input): reported in one line."""


def section_values(section: str, obj) -> dict:
    """The values a stage read from one params section (rl.seed is run.seed, not an rl key)."""
    values = config_dict(obj)
    if section == "rl":
        values.pop("seed", None)
    return values


def config_dict(obj) -> dict:
    if hasattr(obj, "to_dict"):
        return obj.to_dict()
    return {f.name: getattr(obj, f.name) for f in fields(obj)}


@dataclass
class StageContext:
    name: str
    params: dict          # section -> validated config object
    run: object           # tracking run: run_id, fingerprint, provenance, log_metrics, log_history

    @property
    def seed(self) -> int:
        return self.params["run"].seed

    @property
    def threads(self) -> int:
        return self.params["run"].threads

    @property
    def provenance(self) -> dict:
        return self.run.provenance

    @property
    def fingerprint(self) -> str:
        return self.run.fingerprint


def _fail(msg: str) -> None:
    print(f"error: {msg}", file=sys.stderr)
    sys.exit(2)


def run_stage(name: str, sections: list[str], inputs: list, body, numeric: bool = True,
              params_path: str = "params.yaml", only: dict | None = None) -> None:
    """Validate params (sections + run) and inputs, set threads, open the stage's MLflow run, call body(ctx).
    `only` restricts which keys of a section count as read (logged and fingerprinted), e.g. an ablation
    instance reads ablate.steps but not the list of seeds that generates the instances."""
    from agentrl.params import load_section, read_params_file
    from agentrl.tracking import ProvenanceError
    user_errors = (UserError, ProvenanceError)
    try:
        raw = read_params_file(params_path)
        wanted = (["run"] if numeric else []) + [s for s in sections if s != "run"]
        params = {s: load_section(s, raw, params_path) for s in wanted}
        missing = [str(p) for p in inputs if not Path(p).exists()]
        if missing:
            raise StageError(f"missing input {missing[0]}: run the stage that produces it (dvc repro)")
    except user_errors as exc:
        _fail(str(exc))
    import torch
    if numeric:
        torch.set_num_threads(params["run"].threads)
    from agentrl.tracking import stage_run
    logged = {s: section_values(s, p) for s, p in params.items()}
    for section, keys in (only or {}).items():
        logged[section] = {k: v for k, v in logged[section].items() if k in keys}
    threads = params["run"].threads if numeric else None  # a stage without tensor work has no thread count
    try:
        with stage_run(name, params=logged, inputs=[str(p) for p in inputs], threads=threads) as run:
            body(StageContext(name, params, run))
    except user_errors as exc:
        _fail(str(exc))


# ---------------------------------------------------------------- artifact IO

def _clean(obj):
    """JSON-safe: NaN/inf -> None, tuples -> lists."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {str(k): _clean(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_clean(v) for v in obj]
    return obj


def write_json(path, obj) -> None:
    """Deterministic JSON (sorted keys), written atomically."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(_clean(obj), indent=2, sort_keys=True) + "\n")
    os.replace(tmp, path)


def read_json(path) -> dict:
    path = Path(path)
    if not path.is_file():
        raise StageError(f"missing input {path}: run the stage that produces it (dvc repro)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StageError(f"{path}: corrupted JSON ({exc.msg} at line {exc.lineno}); re-run the stage that writes it") from None


def load_tokenizer(path=TASKS_DIR / "tokenizer.json"):
    from agentrl.tokenizer import Tokenizer
    data = read_json(path)
    try:
        return Tokenizer(data["vocab"])
    except (KeyError, ValueError) as exc:
        raise StageError(f"{path}: not a tokenizer file ({exc})") from None


def load_split(path=TASKS_DIR / "split.json") -> dict:
    """{'train': [Task], 'validation': [...], 'test': [...], 'heldout': [...]} from the tasks stage's split."""
    from agentrl.tasks import task_by_name
    split = read_json(path)
    try:
        out = {k: [task_by_name(n) for n in split[k]] for k in ("train", "validation", "test")}
    except KeyError as exc:
        raise StageError(f"{path}: unknown task or split {exc}") from None
    out["heldout"] = out["validation"] + out["test"]
    return out


def derive_seed(seed: int, *labels) -> int:
    """An independent, reproducible seed for one random stream (e.g. derive_seed(0, 'validation', 10))."""
    import hashlib
    digest = hashlib.sha256(repr((seed,) + labels).encode()).digest()
    return int.from_bytes(digest[:6], "big")
