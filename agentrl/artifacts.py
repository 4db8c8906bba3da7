"""Where the pipeline's artifacts live and how they are read and written.

Every path is relative to the working copy (stages run from the repository root). JSON is written atomically
with sorted keys, so the same content gives the same bytes; a missing or corrupted input is one StageError line
naming the file and what to do.
"""
from __future__ import annotations

import json
import math
import os
from pathlib import Path

from agentrl.config import UserError

DATA = Path("data")
REPORTS = Path("reports")
FIGURES = REPORTS / "figures"
TASKS_DIR = DATA / "tasks"
MODELS_DIR = DATA / "models"
TRAIN_DIR = DATA / "train"
CHECKPOINT_DIR = TRAIN_DIR / "checkpoints"
ABLATE_DIR = DATA / "ablate"
LENGTH_STUDY_DIR = DATA / "length_study"
TOKENIZER = TASKS_DIR / "tokenizer.json"
SPLIT = TASKS_DIR / "split.json"


class StageError(UserError):
    """A problem the user can fix (missing/corrupted artifact, bad input): reported in one line."""


def policy_path(name: str) -> Path:
    """A starting policy: 'base', 'sft' or 'length_start'."""
    return MODELS_DIR / f"{name}.pt"


def checkpoint_path(step: int, root: Path | str = ".") -> Path:
    """The main run's checkpoint after `step` updates (the only place its name is spelled out)."""
    return Path(root) / CHECKPOINT_DIR / f"step_{step:04d}.pt"


def bundle_dir(stage: str) -> Path:
    """Where a stage's replay bundles go when a guard stops it (outside its outputs)."""
    return DATA / "bundles" / stage


def ablation_dir(arm: str, seed: int) -> Path:
    return ABLATE_DIR / f"{arm}-{seed}"


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
    write_text(path, json.dumps(_clean(obj), indent=2, sort_keys=True) + "\n")


def write_text(path, text: str) -> None:
    write_bytes(path, text.encode())


def write_bytes(path, data: bytes) -> None:
    """Atomically: the file is the old one or the new one, never a part; an interrupted write (a full disk, a
    signal) leaves no temporary file behind."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def read_json(path):
    path = Path(path)
    if not path.is_file():
        raise StageError(f"missing input {path}: run the stage that produces it (dvc repro)")
    try:
        return json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise StageError(f"{path}: corrupted JSON ({exc.msg} at line {exc.lineno}); re-run the stage that writes it") \
            from None
    except UnicodeDecodeError:
        raise StageError(f"{path}: not UTF-8 text; re-run the stage that writes it") from None


def write_metrics(name: str, values: dict) -> None:
    """A stage's headline numbers (reports/metrics/<name>.json: what `dvc exp show` and `dvc metrics` list)."""
    write_json(REPORTS / "metrics" / f"{name}.json", values)
