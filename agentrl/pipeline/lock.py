"""One writer per stage's outputs: `stage_lock(name)` holds a lock file of the working copy's stage for the whole
stage run.

Two `python -m stages.train` started together would otherwise write one set of files: the second resumed from the
first's step-0 record and both renamed the same temporary files. The lock is an advisory `flock` on a file outside
the working copy (<tmp>/agentrl-locks/<hash of the working copy's path>/<stage>.lock: a refused stage writes
nothing in the project), so it is released by the kernel when its holder ends, however it ends (SIGKILL, a crash, a
lost terminal): a stale lock cannot exist. The holder writes who it is (pid, host, command, start time) into the
file; a second process waits up to $AGENTRL_LOCK_WAIT seconds (default 30) for it, then stops with one line naming
the holder (exit code 2), before its MLflow run or any output exists. A matrix instance (`ablate@kl-0`) has its own
lock: instances write disjoint outputs and run side by side.
"""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import socket
import sys
import tempfile
import time
from pathlib import Path

from agentrl.core.knobs import UserError

LOCK_DIR = Path(tempfile.gettempdir()) / "agentrl-locks"
WAIT_ENV = "AGENTRL_LOCK_WAIT"
DEFAULT_WAIT = 30.0
POLL = 0.2


class LockHeld(UserError):
    """Another process holds the stage's outputs."""


def wait_seconds() -> float:
    raw = os.environ.get(WAIT_ENV)
    if raw is None or raw == "":
        return DEFAULT_WAIT
    try:
        value = float(raw)
    except ValueError:
        value = -1.0
    if not 0 <= value <= 7 * 86400:
        raise UserError(f"{WAIT_ENV}={raw!r}: expected seconds between 0 and 604800")
    return value


def lock_path(name: str, root: Path | str = ".") -> Path:
    where = hashlib.sha256(str(Path(root).resolve()).encode()).hexdigest()[:16]
    return LOCK_DIR / where / f"{name.replace('/', '_')}.lock"


def _holder(fd: int) -> str:
    try:
        info = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
    except (OSError, ValueError):
        info = {}
    if not info:
        return "another process"
    started = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info.get("started", 0)))
    return f"pid {info.get('pid')} on {info.get('host')} (`{info.get('command', '?')}`, since {started})"


@contextlib.contextmanager
def stage_lock(name: str, root: Path | str = ".", wait: float | None = None):
    """Hold the lock of stage `name` for the duration (see the module doc)."""
    wait = wait_seconds() if wait is None else wait
    path = lock_path(name, root)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        deadline, told = time.monotonic() + wait, False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise LockHeld(f"{name}: its outputs are being written by {_holder(fd)}; waited {wait:g} s "
                                   f"({WAIT_ENV} sets the wait): let it finish or stop it, then run again") from None
                if not told:
                    print(f"{name}: waiting up to {wait:g} s for {_holder(fd)}, which writes the same outputs",
                          file=sys.stderr, flush=True)
                    told = True
                time.sleep(POLL)
        me = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time(),
              "command": " ".join(getattr(sys, "orig_argv", sys.argv))[:300]}
        os.ftruncate(fd, 0)
        os.pwrite(fd, json.dumps(me).encode(), 0)
        try:
            yield path
        finally:
            with contextlib.suppress(OSError):
                os.ftruncate(fd, 0)
            fcntl.flock(fd, fcntl.LOCK_UN)
    finally:
        os.close(fd)
