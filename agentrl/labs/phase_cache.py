"""A lab's phases that are pure functions of their inputs, computed once and reused by every lab that asks for the
same inputs: the pretrained model's as-is evaluation (a function of the model's bytes, the held-out tasks, the
evaluation's settings, the seed and the numerics) and the cold start (of the model's bytes, the training tasks, the
demonstrations' and the cloning's settings, the seed and the numerics). A sweep over GRPO's knobs, or the same
pretrained model under several recipes, pays for each once.

    data/lab_cache/<phase>/<key>/
        entry.json    {"phase", "key", "inputs", "result", "seconds", "computed_by", "files": {name: sha256}}
        model/        the phase's weights (the cold start's), save_model's directory

The key is the sha256 of the canonical JSON of the phase's inputs, which include the lab stage's code hash, the
library versions, the threads and the part of the machine class that decides bits (agentrl.core.numerics.
bits_identity): an edit of any code the lab runs, another thread count or another CPU under native numerics is
another key, never a reuse. An entry is written whole or not at all (a temporary renamed in); one whose files are
not the bytes it recorded is not used (the phase is computed again and the entry replaced). The cache lives in the
main repository (agentrl.tracking.provenance.project_root), so a queued DVC experiment's temporary copy shares it.
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import shutil
import time
from dataclasses import asdict, is_dataclass
from pathlib import Path

from agentrl.backends.pretrained import sha256_file
from agentrl.core import files
from agentrl.core.artifacts import finish_temporary, temporary_path

CACHE_DIR = "data/lab_cache"   # under the main repository, beside the labs' outputs (never one of them)
ENTRY_FILE = "entry.json"
MODEL_DIR = "model"


def task_digest(tasks: list) -> str:
    """sha256 (16 hex) of the tasks as the environment gets them (every field of each task, in order)."""
    rows = [asdict(t) if is_dataclass(t) else repr(t) for t in tasks]
    return hashlib.sha256(json.dumps(rows, sort_keys=True, default=repr).encode()).hexdigest()[:16]


def stage_context(record: dict) -> dict:
    """The inputs every cached phase shares, from a stage's provenance record: its code, the libraries, the threads
    and the machine's bits-deciding class."""
    return {k: record.get(k) for k in ("code_hash", "versions", "threads", "numerics")}


def _hash_files(directory: Path) -> dict:
    return {p.relative_to(directory).as_posix(): sha256_file(p) for p in sorted(directory.rglob("*")) if p.is_file()}


class PhaseCache:
    """Phases kept under `root` for the stage context `context` (stage_context); `label` names who computed an
    entry (e.g. "lab@smollm2-3, MLflow run <id>")."""

    def __init__(self, root, context: dict, label: str, log=print):
        self.root, self.context, self.label, self.log = Path(root), dict(context), label, log

    def key(self, phase: str, inputs: dict) -> str:
        content = {"phase": phase, "context": self.context, "inputs": inputs}
        return hashlib.sha256(json.dumps(content, sort_keys=True, default=repr).encode()).hexdigest()[:24]

    def path(self, phase: str, inputs: dict) -> Path:
        return self.root / phase / self.key(phase, inputs)

    def lookup(self, phase: str, inputs: dict) -> dict | None:
        """The entry for these inputs, its files checked against the hashes it recorded; None if there is none or
        it is damaged (said in one log line)."""
        where = self.path(phase, inputs)
        try:
            entry = json.loads(files.read_text(where / ENTRY_FILE, files.MAX_RECORD_BYTES, "a cached lab phase"))
        except (OSError, ValueError, files.InputFileError):
            return None
        if not isinstance(entry, dict) or entry.get("key") != where.name or "result" not in entry:
            self.log(f"cache: {where} is not an entry for these inputs; computing {phase} again")
            return None
        recorded = entry.get("files") or {}
        now = _hash_files(where / MODEL_DIR) if (where / MODEL_DIR).is_dir() else {}
        if now != recorded:
            changed = sorted(set(now.items()) ^ set(recorded.items()))
            self.log(f"cache: {where / MODEL_DIR} is not the bytes its entry recorded ({changed[0][0]} differs); "
                     f"computing {phase} again")
            return None
        entry["path"] = str(where)
        return entry

    def store(self, phase: str, inputs: dict, result, seconds: float, model_dir: Path | None = None) -> Path:
        """Keep `result` (JSON) and a copy of `model_dir` as the entry for these inputs, written whole or not at
        all; an entry already there (another lab's, same inputs) is replaced by this one."""
        where = self.path(phase, inputs)
        tmp = temporary_path(where)
        try:
            tmp.mkdir(parents=True)
            if model_dir is not None:
                shutil.copytree(model_dir, tmp / MODEL_DIR)
            entry = {"phase": phase, "key": where.name, "inputs": inputs, "context": self.context,
                     "result": result, "seconds": seconds, "computed_by": self.label,
                     "computed_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
                     "files": _hash_files(tmp / MODEL_DIR) if model_dir is not None else {}}
            (tmp / ENTRY_FILE).write_text(json.dumps(entry, sort_keys=True, indent=1) + "\n")
            if where.exists():
                shutil.rmtree(where)
            finish_temporary(tmp, where)
        finally:
            _discard(tmp)
        return where

    def phase(self, phase: str, inputs: dict, compute, reuse=None, model_dir: Path | None = None):
        """(result, reused): the kept entry's result for these inputs (then reuse(entry_path) puts its effect in
        place, e.g. copies its weights), else compute() now, kept with a copy of model_dir once it returned.
        `reused` is None when computed, else {"from", "computed_by", "computed_at", "seconds"}."""
        entry = self.lookup(phase, inputs)
        if entry is not None:
            if reuse is not None:
                reuse(Path(entry["path"]))
            self.log(f"cache: {phase} reused from {entry['path']} (computed by {entry['computed_by']} in "
                     f"{entry['seconds']} s)")
            return entry["result"], {"from": entry["path"], "computed_by": entry["computed_by"],
                                     "computed_at": entry.get("computed_at"), "seconds": entry["seconds"]}
        t0 = time.time()
        result = json.loads(json.dumps(compute()))
        self.store(phase, inputs, result, round(time.time() - t0, 1), model_dir)
        return result, None


def copy_model(entry_path: Path, destination: Path) -> None:
    """The cached weights into `destination` (a checkpoint directory a later verb reads), whole or not at all."""
    tmp = temporary_path(destination)
    try:
        shutil.copytree(entry_path / MODEL_DIR, tmp)
        if destination.exists():
            shutil.rmtree(destination)
        finish_temporary(tmp, destination)
    finally:
        _discard(tmp)


def _discard(tmp: Path) -> None:
    """A temporary a failed write left, and its process's directory (agentrl.core.artifacts.temporary_path)."""
    if tmp.exists():
        shutil.rmtree(tmp, ignore_errors=True)
    with contextlib.suppress(OSError):
        tmp.parent.rmdir()
