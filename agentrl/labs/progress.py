"""A lab's finished work kept on disk, so that a lab killed part-way resumes where it stopped (the pipeline's train
stage does the same with agentrl.rl.resume): each phase's result (the evaluations, the cold start, the signal check,
the preflight) when it finishes, and after every GRPO step the policy, Adam's state, the sampling generator and the
dashboard history. A resumed lab's record equals an uninterrupted one's but for its timings, which add up every
attempt, and `attempts`, which says where each one started.

    data/labs/<name>/progress/
        progress.json    {"key", "phases": {phase: {"result", "seconds"}}, "wall_s", "cpu_s", "attempts"}
        grpo_step_NNN/   the policy after NNN GRPO steps (save_pretrained) and its training_state.pt

The key is the stage's fingerprint (params, code, threads) with the loaded model's weights digest: progress made by
another config, other code or other weights is cleared, never resumed. Phase results pass through JSON whether or not
they are kept, so a fresh lab and a resumed one hand the report the same values.
"""
from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import torch

from agentrl.core import files
from agentrl.core.artifacts import remove_partial, replacing
from agentrl.rl.trainer import Hook

PROGRESS_FILE = "progress.json"
GRPO_PREFIX = "grpo_step_"


class LabProgress:
    """The progress of one lab in `directory` under configuration `key` (None: nothing is kept or resumed)."""

    def __init__(self, directory, key: str | None):
        self.directory, self.key = Path(directory), key
        self.t0, self.cpu0 = time.time(), time.process_time()
        self.state = {"key": key, "phases": {}, "wall_s": 0.0, "cpu_s": 0.0, "attempts": []}
        if key is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        remove_partial(self.directory)   # writes a kill cut short (the caller holds the stage's lock)
        found = self._read()
        if found is not None and found.get("key") == key:
            self.state = found
        else:
            self.clear()
            self.directory.mkdir(parents=True, exist_ok=True)
        self.previous = (self.state["wall_s"], self.state["cpu_s"])

    def _read(self) -> dict | None:
        try:
            found = json.loads(files.read_text(self.directory / PROGRESS_FILE, 64 * files.MAX_RECORD_BYTES,
                                               "a lab's progress"))
        except (OSError, ValueError, files.InputFileError):   # missing or damaged: nothing to resume
            return None
        return found if isinstance(found, dict) and isinstance(found.get("phases"), dict) else None

    def _write(self) -> None:
        if self.key is None:
            return
        self.state["wall_s"] = round(self.previous[0] + time.time() - self.t0, 1)
        self.state["cpu_s"] = round(self.previous[1] + time.process_time() - self.cpu0, 1)
        with replacing(self.directory / PROGRESS_FILE) as tmp:
            tmp.write_text(json.dumps(self.state, sort_keys=True) + "\n")

    def clear(self) -> None:
        if self.key is not None and self.directory.exists():
            shutil.rmtree(self.directory)

    def begin(self, started_at: str) -> None:
        """Note where this attempt starts ("the start", "GRPO step 12", ...)."""
        self.state["attempts"].append(started_at)
        self._write()

    def done(self, phase: str) -> bool:
        return phase in self.state["phases"]

    def phase(self, phase: str, compute, restore=None) -> tuple[object, float]:
        """(result, seconds) of `phase`: kept from an earlier attempt (then restore(result) puts back its effect on
        the model), else compute() now, kept once it has returned."""
        if phase in self.state["phases"]:
            kept = self.state["phases"][phase]
            if restore is not None:
                restore(kept["result"])
            return kept["result"], kept["seconds"]
        t0 = time.time()
        result = json.loads(json.dumps(compute()))
        seconds = round(time.time() - t0, 1)
        if self.key is not None:
            self.state["phases"][phase] = {"result": result, "seconds": seconds}
            self._write()
        return result, seconds

    def first_phase_left(self, phases: list[str]) -> str | None:
        return next((p for p in phases if p not in self.state["phases"]), None)

    def elapsed(self) -> tuple[float, float]:
        """(wall, CPU) seconds of every attempt so far."""
        prev = self.previous if self.key is not None else (0.0, 0.0)
        return prev[0] + time.time() - self.t0, prev[1] + time.process_time() - self.cpu0

    # ------------------------------------------------------------ GRPO steps

    def grpo_checkpoint(self) -> tuple[Path, dict] | None:
        """(directory, training state) of the newest readable GRPO checkpoint, or None."""
        if self.key is None:
            return None
        for path in sorted(self.directory.glob(f"{GRPO_PREFIX}*"), reverse=True):
            try:
                extra = torch.load(path / "training_state.pt", map_location="cpu", weights_only=True)
            except Exception:   # cut off or damaged (torch raises its own kinds): the one before it is used
                continue
            return path, extra
        return None

    def save_grpo_step(self, model, tokenizer_hash: str, extra: dict) -> None:
        """The policy and its training state after extra["step"] GRPO steps, written whole or not at all; the
        older steps' checkpoints are removed once it is in place."""
        if self.key is None:
            return
        from agentrl.backends.registry import save_checkpoint
        path = self.directory / f"{GRPO_PREFIX}{extra['step']:03d}"
        save_checkpoint(model, path, tokenizer_hash, extra)   # whole or not at all (agentrl.core.writer)
        for old in self.directory.glob(f"{GRPO_PREFIX}*"):
            if old != path:
                shutil.rmtree(old, ignore_errors=True)
        self._write()


class GRPOCheckpoint(Hook):
    """After every GRPO step: the policy, Adam's state, the generator, the history and the GRPO time so far."""

    def __init__(self, progress: LabProgress, tokenizer_hash: str, seconds_before: float = 0.0):
        self.progress, self.tokenizer_hash = progress, tokenizer_hash
        self.seconds_before, self.t0 = seconds_before, time.time()

    def seconds(self) -> float:
        return self.seconds_before + time.time() - self.t0

    def after_step(self, updates: int, state) -> None:
        self.progress.save_grpo_step(state.model, self.tokenizer_hash, {
            "step": updates, "optimizer": state.optimizer.state_dict(), "generator": state.generator.get_state(),
            "history": state.history, "seconds": self.seconds()})


def clear_progress(out_dir) -> None:
    """Forget a lab's kept progress (its caller, once the report is written)."""
    shutil.rmtree(Path(out_dir) / "progress", ignore_errors=True)


def load_weights(model, directory) -> None:
    """Copy the weights save_model wrote to `directory` into `model` (its sampler's copy follows: the weights'
    versions change)."""
    from agentrl.backends.offline import transformers
    saved = transformers().AutoModelForCausalLM.from_pretrained(directory, local_files_only=True, dtype=torch.float32)
    with torch.no_grad():
        model.lm.load_state_dict(saved.state_dict())
