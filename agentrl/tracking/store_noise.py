"""What a store failure looks like to the user of a stage: the library's own noise kept off the terminal, and a store
that vanished under an open run told apart from one that is read-only.

MLflow logs a full traceback for every database error before re-raising it (a deleted store gave 505 lines on
stderr). `NOISE` drops a locked store's (they are retried) and sends every other one to a log file of this process;
the one line the user reads comes from the error itself (agentrl.tracking.store._retry). SQLite answers a write to a
database file deleted or replaced under an open connection with "attempt to write a readonly database": `vanished`
checks the file this process opened, so the line says what happened to it.
"""
from __future__ import annotations

import logging
import os
from pathlib import Path

_OPENED: dict[Path, int] = {}   # the sqlite file this process last opened a client on, and its inode then


def opened(db: Path) -> None:
    """Remember the sqlite file a client was just opened on (and forget the one before)."""
    _OPENED.clear()
    if db.exists():
        _OPENED[db.resolve()] = os.stat(db).st_ino


def vanished() -> str | None:
    """What happened to the sqlite store this process opened last, if it is no longer there: deleted (its path gone)
    or replaced (another file at its path); None while it is the file it opened. SQLite then reports "attempt to
    write a readonly database", which is not what happened."""
    for db, inode in _OPENED.items():
        try:
            now = os.stat(db).st_ino
        except OSError:
            return f"its database file {db} was deleted while the run was open"
        if now != inode:
            return f"its database file {db} was replaced while the run was open"
    return None


class StoreNoise(logging.Filter):
    """MLflow logs a full traceback for every OperationalError before re-raising it, and the error it raises is what
    the user reads (in one line, from _retry's mapping): a locked store's are dropped (retried), every other one goes
    to a log file instead of stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            if "database is locked" in record.getMessage():
                return False
            if record.levelno >= logging.ERROR:
                path = noise_log()
                path.parent.mkdir(parents=True, exist_ok=True)
                with open(path, "a") as f:
                    f.write(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s").format(record) + "\n")
                return False
        except Exception:
            return True
        return True


def noise_log() -> Path:
    from agentrl.core.boundary import log_dir
    return log_dir() / f"store-{os.getpid()}.log"


def noise_note() -> str:
    return f"the store's errors: {noise_log()}" if noise_log().is_file() else "no store errors were logged"


NOISE = StoreNoise()
