"""Runs whose process is gone: a process is named by host, pid and start time (`process_tag`, a run's `process`
tag), so a RUNNING run whose process no longer exists is found and closed KILLED (`close_orphans`) by whoever opens
the store next: any stage run, `audit`, the sweep's replay. Each stage run also has a watcher that closes its run
the moment its process ends without closing it (agentrl.tracking.watch); this is the net under both (a machine that
went down, a watcher killed with its stage).
"""
from __future__ import annotations

import os
import socket
from pathlib import Path

from agentrl.tracking.store import _retry


def _proc_start(pid: int) -> str | None:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return None


def process_tag(pid: int | None = None) -> str:
    """host:pid:start-time of a process: identifies it even after its pid is reused."""
    pid = pid or os.getpid()
    return f"{socket.gethostname()}:{pid}:{_proc_start(pid) or '?'}"


def process_alive(tag: str) -> bool | None:
    """Is the process a process_tag names still running? None when it ran on another host (cannot tell)."""
    try:
        host, pid, start = tag.rsplit(":", 2)
    except ValueError:
        return None
    if host != socket.gethostname():
        return None
    return _proc_start(int(pid)) == start and start != "?"


def close_orphans(client, exp_ids: list[str], found_by: str, stage: str | None = None) -> list[str]:
    """Mark every RUNNING run of the experiments whose process is gone (SIGKILL, a crash such as SIGSEGV or SIGILL,
    a lost node), of any stage, as KILLED, with the reason. Returns the ids of those of `stage` (the runs a stage
    run takes over)."""
    runs = _retry(client.search_runs, list(exp_ids), filter_string="attributes.status = 'RUNNING'")
    mine = []
    for run in runs:
        if process_alive(run.data.tags.get("process", "")) is False:
            _retry(client.set_tag, run.info.run_id, "killed_reason", f"process gone (found by {found_by})")
            _retry(client.set_terminated, run.info.run_id, "KILLED")
            if stage is not None and run.data.tags.get("stage.instance") == stage:
                mine.append(run.info.run_id)
    return mine


def close_all_orphans(client, found_by: str) -> None:
    """close_orphans over every experiment of the store, best effort: a store this process cannot write (a reader
    on a read-only copy) closes nothing and says nothing."""
    try:
        ids = [e.experiment_id for e in _retry(client.search_experiments)]
        if ids:
            close_orphans(client, ids, found_by)
    except Exception:
        pass
