"""A stage whose params or inputs changed while it ran does not finish.

DVC hashes a stage's params and deps when its command ends, not when it starts: a params.yaml edited while `train`
runs would make dvc.lock describe outputs trained under other values, and `dvc status` call them current. So a stage
reads what it read once more when its body is done: the params it logged (agentrl.pipeline.stage) and the bytes of
every input it hashed at the start (its provenance record's `inputs`). On a difference it stops with one line naming
what moved (exit 2), before its provenance record is written, so DVC records nothing, and the outputs it rewrote are
put back: its uncached outputs (reports) from the bytes kept when it started (`OutputSnapshot`), its cached ones
removed so that the boundary restores them from the DVC cache as for any refused run (agentrl.pipeline.restore).
Outside DVC the cached outputs are left as the stage wrote them, and the line says so.
"""
from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path

from agentrl.core import files
from agentrl.core.knobs import UserError

MAX_KEPT_BYTES = 64 * files.MiB   # an uncached output kept to be put back (reports are KBs to a few MBs)


class ChangedWhileRunning(UserError):
    """params.yaml or an input changed between the start and the end of a stage run (one line naming them)."""


ABSENT = object()


def _short(value) -> str:
    if value is ABSENT:
        return "(absent)"
    text = json.dumps(value, sort_keys=True, default=str)
    return text if len(text) <= 40 else text[:37] + "..."


def moved_keys(before: dict, after: dict) -> list[str]:
    """'key old -> new' for each flattened key whose value differs (or that one side lacks), in key order."""
    out = []
    for key in sorted(set(before) | set(after)):
        a, b = before.get(key, ABSENT), after.get(key, ABSENT)
        if a is ABSENT or b is ABSENT or \
                json.dumps(a, sort_keys=True, default=str) != json.dumps(b, sort_keys=True, default=str):
            out.append(f"{key} {_short(a)} -> {_short(b)}")
    return out


def changed_inputs(inputs: dict, root: Path) -> list[str]:
    """The inputs (path -> sha256 at the start) whose bytes are not what they were."""
    from agentrl.tracking.provenance import changed_inputs as changed
    return [f"{rel} {'is gone' if gone else 'changed'}" for rel, gone in changed(inputs, root)]


# ---------------------------------------------------------------- the stage's outputs, as dvc.yaml declares them

def declared_outputs(stage: str, root: Path) -> list[tuple[str, bool]]:
    """(path, cached) of each output dvc.yaml declares for `stage` (a matrix instance `name@a-b` resolved by its
    items, which never contain '-'); [] where dvc.yaml or the stage is not there."""
    import yaml
    name, _, instance = stage.partition("@")
    try:
        graph = yaml.load(files.read_text(root / "dvc.yaml", files.MAX_TEXT_BYTES, "dvc.yaml"),
                          Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}
        entry = (graph.get("stages") or {}).get(name)
    except (OSError, ValueError, yaml.YAMLError):
        return []
    if not isinstance(entry, dict):
        return []
    keys = list(entry.get("matrix") or {})
    items = dict(zip(keys, instance.split("-"))) if instance and len(instance.split("-")) == len(keys) else {}
    out = []
    for spec in [*(entry.get("outs") or []), *(entry.get("metrics") or []), *(entry.get("plots") or [])]:
        path, opts = (spec, {}) if isinstance(spec, str) else next(iter(spec.items()))
        path = re.sub(r"\$\{item\.([A-Za-z_]+)\}", lambda m: items.get(m.group(1), m.group(0)), str(path))
        if "${" not in path:
            out.append((path, (opts or {}).get("cache", True) is not False))
    return out


class OutputSnapshot:
    """The bytes of a stage's uncached output files as they were when it started (None: the file did not exist)."""

    def __init__(self, stage: str, root: Path | str):
        self.stage, self.root = stage, Path(root)
        self.outputs = declared_outputs(stage, self.root)
        self.kept: dict[str, bytes | None] = {}
        for path, cached in self.outputs:
            full = self.root / path
            if cached or full.is_dir():
                continue
            try:
                self.kept[path] = files.read_bytes(full, MAX_KEPT_BYTES, "an output") if full.exists() else None
            except (OSError, files.InputFileError):
                pass   # too large or unreadable: left as the stage leaves it

    def put_back(self, under_dvc: bool) -> list[str]:
        """Each kept file as it was; under DVC each cached output removed, for the boundary to restore from the
        cache (agentrl.pipeline.restore). Returns what it put back or removed."""
        from agentrl.core.artifacts import write_bytes
        done = []
        for path, data in self.kept.items():
            full = self.root / path
            if data is None:
                if full.exists():
                    full.unlink()
                    done.append(path)
            elif not full.is_file() or full.read_bytes() != data:
                write_bytes(full, data)
                done.append(path)
        if under_dvc:
            for path, cached in self.outputs:
                full = self.root / path
                if cached and os.path.lexists(full):
                    shutil.rmtree(full) if full.is_dir() and not full.is_symlink() else full.unlink()
                    done.append(path)
        return done


def check_unchanged(stage: str, logged: dict, logged_now, inputs: dict, root: Path,
                    snapshot: OutputSnapshot | None) -> None:
    """Raise ChangedWhileRunning (after putting the outputs back) when the params the stage logged at its start
    differ from `logged_now()` (the same reading of params.yaml now) or an input's bytes changed."""
    from agentrl.tracking.provenance import flatten_params
    try:
        moved = moved_keys(flatten_params(logged), flatten_params(logged_now()))
    except UserError as exc:
        moved = [f"params.yaml no longer validates ({str(exc).splitlines()[0][:160]})"]
    moved += changed_inputs(inputs, root)
    if not moved:
        return
    under_dvc = bool(os.environ.get("DVC_STAGE") and os.environ.get("DVC_ROOT"))
    if snapshot is not None:
        snapshot.put_back(under_dvc)
    kept = "its outputs put back as they were" if under_dvc else \
        "its reports put back; its data outputs are as it wrote them, under the values it read at the start"
    more = f" (and {len(moved) - 3} more)" if len(moved) > 3 else ""
    raise ChangedWhileRunning(f"{stage}: what it read changed while it ran: {'; '.join(moved[:3])}{more}; nothing "
                              f"recorded, {kept}: run it again")
