"""A stage's MLflow run is closed even when its process cannot close it. A watcher process, started the moment the
run exists, waits for the stage to say it closed the run; if the stage's process ends first (SIGKILL, a crash such
as SIGSEGV, the out-of-memory killer), the watcher marks the run KILLED with that reason within a second or two, so
no later command has to run for the MLflow UI to be right (`dvc repro` may skip every stage). The watcher runs in a
session of its own, so a signal to the stage's process group (`kill -- -<pgid>`, a closed terminal) does not reach
it, and it ends when the stage does. A watcher that could not start, or was killed too, leaves the run to the next
opener of the store (agentrl.tracking.orphans).
"""
from __future__ import annotations

import contextlib
import os
import select
import subprocess
import sys
from pathlib import Path

CLOSED = b"closed"
POLL = 1.0   # seconds between looks at the stage's process when its end of the pipe stays open (a forked child)
REASON = "the stage's process ended without closing its run (SIGKILL, a crash or out of memory); closed by its watcher"


class Watcher:
    """The stage's end of a watcher: `closed()` once the run has its final status."""

    def __init__(self, proc: subprocess.Popen, fd: int):
        self.proc, self.fd = proc, fd

    def closed(self) -> None:
        with contextlib.suppress(OSError):
            os.write(self.fd, CLOSED)
        with contextlib.suppress(OSError):
            os.close(self.fd)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(timeout=5)


def start(run_id: str, uri: str) -> Watcher | None:
    """A watcher for the run, or None where none can be started (then agentrl.tracking.orphans closes it later)."""
    from agentrl.tracking.orphans import process_tag
    root = Path(__file__).resolve().parents[2]
    code = f"import sys; sys.path.insert(0, {str(root)!r}); from agentrl.tracking.watch import main; main()"
    read, write = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-c", code, run_id, uri, process_tag()], stdin=read,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    except OSError:
        os.close(write)
        return None
    finally:
        os.close(read)
    return Watcher(proc, write)


def close_run(run_id: str, uri: str, reason: str = REASON) -> None:
    """Mark the run KILLED with `reason`, unless it already has a final status (best effort)."""
    from mlflow.entities import RunTag

    from agentrl.tracking.store import _client, _retry
    with contextlib.suppress(Exception):
        client = _client(uri)
        if _retry(client.get_run, run_id).info.status != "RUNNING":
            return
        _retry(client.log_batch, run_id, tags=[RunTag("killed_reason", reason), RunTag("mlflow.note.content", reason)])
        _retry(client.set_terminated, run_id, "KILLED")


def main(argv: list[str] | None = None) -> None:
    """The watcher: `<run id> <store URI> <the stage's process tag>`, the pipe from the stage on stdin."""
    from agentrl.tracking.orphans import process_alive
    run_id, uri, stage_process = (argv or sys.argv[1:])[:3]
    while True:
        ready, _, _ = select.select([0], [], [], POLL)
        if ready:
            data = os.read(0, 64)
            if data.startswith(CLOSED):
                return
            if not data:   # every holder of the stage's end of the pipe has ended
                break
        elif process_alive(stage_process) is False:
            break
    close_run(run_id, uri)
