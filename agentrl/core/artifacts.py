"""Where the pipeline's artifacts live and how they are read and written.

Every path is relative to the working copy (stages run from the repository root). JSON is written atomically
with sorted keys, so the same content gives the same bytes; a missing or corrupted input is one StageError line
naming the file and what to do.
"""
from __future__ import annotations

import contextlib
import json
import math
import os
import shutil
from pathlib import Path

from agentrl.core import files
from agentrl.core.config import UserError

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
MAX_JSON_BYTES = 256 * files.MiB   # the largest JSON a stage writes is a few MB


class CheckpointError(UserError):
    """A checkpoint that is missing, corrupted, or from a different model config or tokenizer."""


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


def temporary_name(path) -> Path:
    """Where a write of `path` goes before it replaces it: unique to this process (`<name>.<pid>.tmp`), so two
    processes writing the same file never write into each other's half-written temporary."""
    path = Path(path)
    return path.with_name(f"{path.name}.{os.getpid()}.tmp")


def temporary_path(path) -> Path:
    """Where a write of `path` goes when the bytes written depend on the file's name (torch.save names an
    archive's records after it): the same `<name>.tmp` as every process would use, inside a directory of this
    process's own beside it (`.<pid>.tmp/`), so the bytes do not depend on the process and two writers never share
    a temporary file. `finish_temporary` renames it into place and removes the directory."""
    path = Path(path)
    directory = path.parent / f".{os.getpid()}.tmp"
    directory.mkdir(parents=True, exist_ok=True)
    return directory / f"{path.name}.tmp"


def finish_temporary(tmp: Path, path) -> None:
    try:
        os.replace(tmp, path)
    except OSError as exc:
        raise named(exc, path) from None
    with contextlib.suppress(OSError):
        tmp.parent.rmdir()


def named(exc: OSError, path) -> OSError:
    """A write's error as the user should read it: naming `path`, the file they know, not the temporary the bytes
    went through (which no longer exists by the time they read the line)."""
    if exc.errno is None:
        return exc
    return OSError(exc.errno, exc.strerror, str(path))


@contextlib.contextmanager
def replacing(path):
    """Yield the temporary a write of `path` goes to, then rename it over `path`: the file is the old one or the new
    one, never a part; an interrupted or refused write (a full disk, an immutable file, a signal) leaves no
    temporary behind, and its error names `path`."""
    path = Path(path)
    tmp = temporary_name(path)
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise named(exc, path) from None
        raise


def remove_partial(directory) -> list[Path]:
    """Remove what interrupted writes left in `directory` (`*.tmp` files and `.<pid>.tmp/` directories); only a
    process that holds the directory's stage lock may call it. Returns what it removed."""
    removed = []
    for partial in sorted(Path(directory).glob("*.tmp")):
        if partial.is_dir() and not partial.is_symlink():
            shutil.rmtree(partial, ignore_errors=True)
        else:
            partial.unlink(missing_ok=True)
        removed.append(partial)
    return removed


def write_bytes(path, data: bytes) -> None:
    """Atomically (`replacing`): the old file or the new one, never a part, no temporary left, errors naming
    `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with replacing(path) as tmp:
        tmp.write_bytes(data)


def read_json(path, shape=None):
    """A JSON input, checked against `shape` (see `check_shape`) when given: a corrupted file or one of the wrong
    shape is one StageError line naming the file, the place in it and what to do, before anything uses it."""
    path = Path(path)
    if not path.exists():
        raise StageError(f"missing input {path}: run the stage that produces it (dvc repro)")
    try:
        data = json.loads(files.read_text(path, MAX_JSON_BYTES, "a JSON input"))
    except files.InputFileError as exc:
        raise StageError(f"{exc}; re-run the stage that writes it") from None
    except json.JSONDecodeError as exc:
        raise StageError(f"{path}: corrupted JSON ({exc.msg} at line {exc.lineno}); re-run the stage that writes it") \
            from None
    except (UnicodeDecodeError, ValueError, RecursionError):
        raise StageError(f"{path}: not UTF-8 JSON text; re-run the stage that writes it") from None
    if shape is not None:
        problem = shape_problem(data, shape)
        if problem:
            raise StageError(f"{path}: {problem}; re-run the stage that writes it")
    return data


class Leaf:
    """A shape leaf with a condition, e.g. Leaf(int, lambda v: v > 0, "an integer > 0")."""

    def __init__(self, kind, test, text: str):
        self.kind, self.test, self.text = kind, test, text


COUNT = Leaf(int, lambda v: v >= 0, "an integer >= 0")
POSITIVE = Leaf(int, lambda v: v > 0, "an integer > 0")
NUMBER = Leaf(float, lambda v: True, "a number")
RATE = (Leaf(float, lambda v: 0 <= v <= 1, "a number in [0, 1]"), None)   # null: not measured


def shape_problem(value, shape, where: str = "") -> str | None:
    """Why `value` does not have `shape`, or None. A shape is a type (float takes ints too), a Leaf, a tuple of
    alternatives (None in it allows null), a list [item shape] (non-empty), or a dict: {key: shape} requires the
    key ("key?" when optional), {str: shape} is a mapping whose every value has that shape."""
    here = where or "the top level"
    if isinstance(shape, tuple):
        if value is None and None in shape:
            return None
        problems = [shape_problem(value, s, where) for s in shape if s is not None]
        return None if any(p is None for p in problems) else problems[0]
    if isinstance(shape, list):
        if not isinstance(value, list) or not value:
            return f"{here}: expected a non-empty list, got {_short(value)}"
        return next((p for i, v in enumerate(value) if (p := shape_problem(v, shape[0], f"{where}[{i}]"))), None)
    if isinstance(shape, dict):
        if not isinstance(value, dict):
            return f"{here}: expected an object, got {_short(value)}"
        if set(shape) == {str}:
            return next((p for k, v in value.items() if (p := shape_problem(v, shape[str], _join(where, k)))), None)
        for key, sub in shape.items():
            name = key.rstrip("?")
            if name not in value:
                if key.endswith("?"):
                    continue
                return f"{_join(where, name)}: missing"
            if (p := shape_problem(value[name], sub, _join(where, name))):
                return p
        return None
    leaf = shape if isinstance(shape, Leaf) else Leaf(shape, lambda v: True, _TYPE_TEXT.get(shape, str(shape)))
    ok_type = (isinstance(value, (int, float)) and math.isfinite(value) if leaf.kind is float
               else isinstance(value, leaf.kind)) and not (isinstance(value, bool) and leaf.kind is not bool)
    return None if ok_type and leaf.test(value) else f"{here}: expected {leaf.text}, got {_short(value)}"


_TYPE_TEXT = {int: "an integer", float: "a number", str: "a string", bool: "true or false", dict: "an object",
              list: "a list"}


def _join(where: str, key) -> str:
    return f"{where}.{key}" if where else str(key)


def _short(value) -> str:
    text = json.dumps(value)
    return text if len(text) <= 40 else text[:40] + "..."


def write_metrics(name: str, values: dict) -> None:
    """A stage's headline numbers (reports/metrics/<name>.json: what `dvc exp show` and `dvc metrics` list)."""
    write_json(REPORTS / "metrics" / f"{name}.json", values)
