"""One stage instance, run on whichever node Ray picks: a scratch directory laid out like the repository (the
shipped code and params from the task's working directory, the inputs as bytes from the driver), the stage's
command run there exactly as `dvc repro` runs it, and everything it wrote returned as bytes. The MLflow run is
recorded, not logged (agentrl.tracking.deferred): the driver replays it into the project's store.

Nothing here imports Ray, torch or agentrl's stage code: the stage runs in its own interpreter, as under DVC, and a
worker process that dies (a lost node, a cancelled task) takes that interpreter with it.
"""
from __future__ import annotations

import ctypes
import os
import shlex
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from agentrl.tracking.orphans import process_alive, process_tag

CODE = ("agentrl", "stages", "dvc.yaml", "params.yaml")   # what the working_dir ships (agentrl.pipeline.sweep.plan)
RECORD = ".sweep-run"          # the deferred MLflow run, inside the scratch directory
SKIP = ("__pycache__", ".pytest_cache")
LOG_TAIL = 20_000
SCRATCH_PREFIX = "agentrl-sweep-"   # + the worker's pid and start time: see scratch_prefix


def read_tree(root: Path, rel: str) -> dict[str, bytes]:
    """{relative path: bytes} of a file, or of every file under a directory."""
    path = root / rel
    if path.is_file():
        return {rel: path.read_bytes()}
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(path.rglob("*"))
            if p.is_file() and not set(p.relative_to(root).parts) & set(SKIP)}


def write_tree(root: Path, files: dict[str, bytes]) -> None:
    for rel, data in files.items():
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)


try:  # resolved before any fork: the child only calls it
    _PRCTL = ctypes.CDLL(None, use_errno=True).prctl
except (OSError, AttributeError):  # pragma: no cover - not Linux
    _PRCTL = None


def _die_with_parent() -> None:
    """In the child, before exec: SIGKILL when the worker process that started it dies (PR_SET_PDEATHSIG)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)


def _argv(cmd: str) -> list[str]:
    argv = shlex.split(cmd)
    if argv and argv[0] in ("python", "python3"):   # the interpreter of this node's environment, as DVC's PATH
        argv[0] = sys.executable
    return argv


def _env(record_dir: Path, sweep_id: str, stage: str) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in ("PYTHONPATH", "MLFLOW_TRACKING_URI", "DVC_ROOT") and not k.startswith("DVC_EXP")}
    env.update(AGENTRL_TRACKING_DEFER=str(record_dir), AGENTRL_SWEEP=sweep_id, AGENTRL_PIPELINE_RUN=sweep_id,
               DVC_STAGE=stage)   # as DVC sets it: a matrix stage finds its instance by name (pipeline.instances)
    return env


def _where() -> str:
    """The Ray node this runs on (Ray is already loaded in a worker process), and the host."""
    ray = sys.modules.get("ray")
    try:
        return f"node {ray.get_runtime_context().get_node_id()[:8]} on {socket.gethostname()}"
    except Exception:
        return socket.gethostname()


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1] if lines else ""


def _side_files(work: Path, shipped: set[str], outs: list[str]) -> dict[str, bytes]:
    """Files the stage wrote besides its outputs (replay bundles), which `dvc repro` would leave in the work tree;
    not the provenance record (the driver writes it) nor the recorded run."""
    def side(rel: str) -> bool:
        parts = rel.split("/")
        return (rel not in shipped and parts[0] != RECORD and not set(parts) & set(SKIP)
                and parts[:2] != ["reports", "provenance"]
                and not any(rel == out or rel.startswith(out.rstrip("/") + "/") for out in outs))
    written = (p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file())
    return {rel: (work / rel).read_bytes() for rel in written if side(rel)}


def scratch_prefix() -> str:
    """This worker's scratch directories: SCRATCH_PREFIX + pid + start time (agentrl.tracking.orphans.process_tag), so
    a directory is matched to its process even after the pid is reused."""
    _, pid, start = process_tag().rsplit(":", 2)
    return f"{SCRATCH_PREFIX}{pid}-{start}-"


def reap_orphans(tmp: Path | None = None) -> list[Path]:
    """Remove the scratch directories of workers that died without cleaning up (SIGKILL, a lost node) on this
    host: those whose owner process no longer runs. Returns what was removed."""
    removed = []
    for path in Path(tmp or tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}*-*-*"):
        pid, start = path.name[len(SCRATCH_PREFIX):].split("-")[:2]
        owner = f"{socket.gethostname()}:{pid}:{start}"
        if path.is_dir() and pid.isdigit() and start.isdigit() and process_alive(owner) is False:
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def run_instance(spec: dict, *inputs: dict[str, bytes]) -> dict:
    """Run `spec["cmd"]` (the instance `spec["name"]`) with `inputs` in place; return {"ok", "error", "outs",
    "side", "record", "log", "host", "seconds"}: the declared outputs, other files it wrote (replay bundles), the
    recorded MLflow run, and the stage's output (a tail)."""
    started, code = time.time(), Path.cwd()
    reap_orphans()
    with tempfile.TemporaryDirectory(prefix=scratch_prefix()) as tmp:
        work = Path(tmp)
        for name in CODE:
            src = code / name
            if src.is_dir():
                shutil.copytree(src, work / name, ignore=shutil.ignore_patterns(*SKIP))
            elif src.is_file():
                shutil.copy2(src, work / name)
        shipped = {p.relative_to(work).as_posix() for p in work.rglob("*") if p.is_file()}
        for files in inputs:
            write_tree(work, files)
            shipped |= set(files)
        proc = subprocess.run(_argv(spec["cmd"]), cwd=work, env=_env(work / RECORD, spec["sweep"], spec["name"]),
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace",
                              preexec_fn=_die_with_parent)
        log = proc.stdout[-LOG_TAIL:]
        result = {"ok": proc.returncode == 0, "error": None, "log": log, "host": _where(),
                  "outs": {}, "side": {}, "record": {}, "seconds": 0.0}
        missing = [out for out in spec["outs"] if not (work / out).exists()]
        if proc.returncode != 0:
            result["error"] = f"exit code {proc.returncode}: {_last_line(log) or 'no output'}"
        elif missing:
            result.update(ok=False, error=f"the stage did not write its output {missing[0]}")
        if result["ok"]:
            for out in spec["outs"]:
                result["outs"].update(read_tree(work, out))
        if (work / RECORD).is_dir():
            result["record"] = read_tree(work / RECORD, ".")
        result["side"] = _side_files(work, shipped, spec["outs"])
    result["seconds"] = round(time.time() - started, 3)
    return result
