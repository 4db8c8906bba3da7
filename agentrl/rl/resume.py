"""Checkpoints of a training run and resuming from them.

`CheckpointHook` (a trainer hook) validates the policy at step 0, every `every` updates and after the last one (the
`validate` callable it is given: the main run's evaluates the validation tasks, always from the same stream, so
checkpoints differ only because the policies do), and saves a checkpoint holding everything needed to continue
bit-identically: weights, optimizer and generator
state, the dashboard history and the validation results so far. `resume_point` finds the newest readable
checkpoint of the same configuration; checkpoints of another configuration are cleared only by `clear_checkpoints`,
which the stage calls after its inputs and params have been validated.
"""
from __future__ import annotations

import json
import time

from agentrl.backends.registry import read_checkpoint, save_checkpoint
from agentrl.core import files
from agentrl.core.artifacts import (
    CHECKPOINT_DIR,
    DATA,
    CheckpointError,
    checkpoint_path,
    remove_partial,
    replacing,
)
from agentrl.rl.trainer import Hook, TrainState

RESUME_FILE = DATA / "resume" / "train.json"   # outside the stage's outputs: the key of the saved checkpoints


class CheckpointHook(Hook):
    """validate(model) -> {"pass_rate", "per_task"}; checkpoints are written for the format's tokenizer hash."""

    def __init__(self, tok, validate, steps: int, every: int, validation: list | None = None, log_metric=None):
        self.tok, self.validate, self.steps, self.every = tok, validate, steps, every
        self.validation = validation if validation is not None else []
        self.log_metric = log_metric

    def _checkpoint(self, updates: int, state: TrainState) -> None:
        if updates % self.every and updates != self.steps:
            return
        if any(v["step"] == updates for v in self.validation):
            return   # resumed from this very checkpoint (a run restarted from step 0 starts there again)
        res = self.validate(state.model)
        self.validation.append({"step": updates, "pass_rate": res["pass_rate"], "per_task": res["per_task"]})
        if self.log_metric is not None:
            self.log_metric({"validation_pass": res["pass_rate"]}, updates)
        save_checkpoint(state.model, checkpoint_path(updates), self.tok.hash, extra=_unshared({
            "step": updates, "optimizer": state.optimizer.state_dict(), "generator": state.generator.get_state(),
            "history": state.history, "validation": self.validation}))

    def on_start(self, state: TrainState) -> None:
        self._checkpoint(0, state)

    def after_step(self, updates: int, state: TrainState) -> None:
        self._checkpoint(updates, state)


def _unshared(obj):
    """A copy in which no string or container is shared (tensors and numbers kept). Pickle writes an object met
    twice as a reference to the first, so the same values held by a fresh run (where strings and rows share
    objects) and by a run resumed from a checkpoint (whose loaded objects share differently) would be saved as
    different bytes; copied like this they are saved the same."""
    if isinstance(obj, str):
        return obj.encode("utf-8", "surrogatepass").decode("utf-8", "surrogatepass")
    if isinstance(obj, dict):
        return {_unshared(k): _unshared(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return type(obj)(_unshared(v) for v in obj)
    return obj


def read_resume(key: str) -> dict:
    """The resume record if it belongs to configuration `key` ({'seconds': wall time so far, 'runs': MLflow runs})."""
    try:
        rec = json.loads(files.read_text(RESUME_FILE, files.MAX_RECORD_BYTES, "the resume record"))
    except (OSError, ValueError, files.InputFileError):   # a damaged record resumes nothing
        return {}
    return rec if isinstance(rec, dict) and rec.get("key") == key else {}


def write_resume(key: str, seconds: float, runs: list[str]) -> None:
    RESUME_FILE.parent.mkdir(parents=True, exist_ok=True)
    with replacing(RESUME_FILE) as tmp:
        tmp.write_text(json.dumps({"key": key, "seconds": seconds, "runs": runs}, indent=1) + "\n")


def resume_point(key: str, kind: str) -> dict | None:
    """The newest readable checkpoint ({"state_dict", "extra"}) backend `kind` wrote under configuration `key`
    (None if there is none). A checkpoint cut off mid-write is skipped and the one before it used."""
    if not read_resume(key):
        return None
    remove_partial(CHECKPOINT_DIR)   # checkpoint writes a kill cut short: never an output (this stage holds the lock)
    for path in sorted(CHECKPOINT_DIR.glob("step_*.pt"), reverse=True):
        try:
            return read_checkpoint(kind, path)
        except CheckpointError:
            continue
    return None


def clear_checkpoints() -> None:
    CHECKPOINT_DIR.mkdir(parents=True, exist_ok=True)
    for path in CHECKPOINT_DIR.glob("*"):
        path.unlink()


class ResumeClock(Hook):
    """Keeps the resume record's wall time current after every step, so a kill loses no accounted time."""

    def __init__(self, key: str, seconds: float, runs: list[str]):
        self.key, self.seconds, self.runs, self.t0 = key, seconds, runs, time.time()

    def elapsed(self) -> float:
        return self.seconds + time.time() - self.t0

    def on_start(self, state):
        write_resume(self.key, self.elapsed(), self.runs)

    def after_step(self, updates, state):
        write_resume(self.key, self.elapsed(), self.runs)
