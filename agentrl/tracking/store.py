"""The MLflow store: where it is, whether it answers, and a client that survives concurrent writers.

Every stage logs into ONE store. Default: `sqlite:///mlflow.db` at the project root (a relative URI, resolved
against the project root: `$DVC_ROOT` when DVC runs the stage, which for queued experiments executing in a copy
under .dvc/tmp/exps/ points at the MAIN repository; treeverse/dvc#9879, #9918). `MLFLOW_TRACKING_URI` overrides.
Artifacts of a sqlite store live in `<store dir>/mlartifacts`, but the experiment records the location as
`mlflow-artifacts:/` (the path `mlflow ui` serves from its `./mlartifacts`), never an absolute path: a moved or
re-cloned checkout still shows them, and an experiment first created from a temporary copy records no path that
later disappears. The stages copy their artifacts there themselves (`log_artifact`); other stores get a file URI.

`probe` checks the store before any work, each problem one line naming the store within seconds (no minutes of
retries): an http store must accept a connection; a `file:` store is refused (MLflow 3 keeps it in maintenance mode
and raises on it); a sqlite store must sit in a directory that exists (a mistyped path is refused, never created), on
a writable filesystem with free space, be a readable database, and not be held by another writer for more than
LOCK_WAIT seconds (said so: a locked store is live, never to be moved aside). A sqlite file that does not exist yet is
created in that directory, said in one warning line. A store that fails later (the disk fills up mid-run) is one
StoreError line from `_retry`.

Concurrency. Parallel queue workers write the same sqlite file. Every store call goes through `_retry` (backoff with
jitter on "database is locked" and friends), writes are batched, and a racing `create_experiment` falls back to
reading the experiment the other process created. First-time store creation runs MLflow's schema migrations, which
must not run twice at once (two concurrent migrations leave `_alembic_tmp_*` tables behind), so it is serialised
with an flock on the store's directory; later openers share that lock and only wait for a migration in progress.

Nothing phones home: MLflow telemetry is switched off before mlflow can be imported; mlflow itself is imported
lazily so importing this module stays cheap.
"""
from __future__ import annotations

import os

# MLflow (>= 3.2) decides at `import mlflow` time whether to start its telemetry client. setdefault: an explicit
# user choice wins. HTTP stores: fail fast instead of retrying for minutes.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")
os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
os.environ.setdefault("MLFLOW_LOGGING_LEVEL", "WARNING")   # its INFO lines (creating a store's tables) stay off stderr

import contextlib
import logging
import random
import socket
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from agentrl.tracking.provenance import ProvenanceError, project_root
from agentrl.tracking.schemes import SUPPORTED, scheme_problem
from agentrl.tracking.store_noise import NOISE, noise_note, opened, vanished

try:  # serialises first-time store creation (POSIX); without it a concurrent creation can fail (ensure_store)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "agentrl"
DEFAULT_URI = "sqlite:///mlflow.db"      # relative to the project root
ARTIFACT_DIR = "mlartifacts"
PROBE_TIMEOUT = 3.0
LOCK_WAIT = 4.0            # seconds a store held by another writer is waited for before saying so
MIN_FREE_BYTES = 1 << 20   # a store on a filesystem with less free space fails on its first write
RETRY_TRIES = 30
RETRY_MAX_SLEEP = 1.0


class StoreError(ProvenanceError):
    """The tracking store is unreachable or unusable; the message names the URI."""


class StoreLost(StoreError):
    """The store went away under an open run (its file deleted or replaced): nothing the user's input did, so the
    boundary's exit 1, in one line; the stage's outputs are kept."""
    exit_code = 1


# ----------------------------------------------------------------------------------------------------------------
# where the store is

def configured_uri() -> str:
    """The tracking URI as configured: $MLFLOW_TRACKING_URI, else the relative default `sqlite:///mlflow.db`."""
    return os.environ.get("MLFLOW_TRACKING_URI", "").strip() or DEFAULT_URI


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///...` URI (None for other schemes or in-memory databases)."""
    if not uri.startswith("sqlite:///"):
        return None
    rest = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def tracking_uri(root: Path | str | None = None) -> str:
    """The configured URI resolved for connecting: a relative sqlite/file path is anchored at the project root."""
    root = Path(root).resolve() if root is not None else project_root()
    uri = configured_uri()
    if uri.startswith("sqlite:///"):
        path, sep, query = uri[len("sqlite:///"):].partition("?")
        if path and path != ":memory:" and not Path(path).is_absolute():
            return f"sqlite:///{(root / path).resolve().as_posix()}{sep}{query}"
        return uri
    if uri.startswith("file:"):
        return uri if uri.startswith("file:///") or uri.startswith("file://localhost/") else \
            (root / uri[len("file:"):]).resolve().as_uri()
    if "://" not in uri and uri.split(":", 1)[0] not in ("databricks", "databricks-uc", "uc"):
        return (root / uri).resolve().as_uri()   # a bare path means a local file store
    return uri




PROXIED = "mlflow-artifacts:/"


def artifact_location(uri: str | None = None, root: Path | str | None = None) -> str:
    """The experiment's artifact root: `mlflow-artifacts:/` for a sqlite store (files in `mlartifacts/` beside it,
    see the module doc), else the file URI of `<root>/mlartifacts`."""
    root = Path(root).resolve() if root is not None else project_root()
    uri = uri or tracking_uri(root)
    if _sqlite_path(uri) is not None:
        return PROXIED
    return (root / ARTIFACT_DIR).resolve().as_uri()


def artifact_dir(artifact_uri: str | None, uri: str) -> Path | None:
    """The directory on disk of a run's `mlflow-artifacts:` URI in a sqlite store (None for other locations)."""
    db = _sqlite_path(uri)
    if db is None or not (artifact_uri or "").startswith("mlflow-artifacts:"):
        return None
    return db.parent / ARTIFACT_DIR / urlparse(artifact_uri).path.lstrip("/")


def log_artifact(client, run_id: str, artifact_uri: str | None, uri: str, path: Path,
                 artifact_path: str | None = None) -> None:
    """A file or directory into a run's artifacts: copied to `artifact_dir` when the store keeps them beside it,
    else through the client."""
    import shutil
    path, dest = Path(path), artifact_dir(artifact_uri, uri)
    if dest is None:
        _retry(client.log_artifacts if path.is_dir() else client.log_artifact, run_id, str(path), artifact_path)
        return
    dest = dest / (artifact_path or "")
    if path.is_dir():
        shutil.copytree(path, dest, dirs_exist_ok=True)   # the directory's contents, as client.log_artifacts
    else:
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy2(path, dest / path.name)


def _write_problem(path: Path) -> str | None:
    """Why a store at `path` (a file, or a directory it would be created in) cannot be written, or None."""
    where = path
    while not where.exists() and where != where.parent:
        where = where.parent
    try:
        fs = os.statvfs(where)
    except OSError:
        return None
    if fs.f_flag & os.ST_RDONLY:
        return f"{where} is on a read-only filesystem"
    if not os.access(where, os.W_OK):
        return f"{where} is not writable by this user"
    if fs.f_bavail * fs.f_frsize < MIN_FREE_BYTES:
        return f"no space left on the filesystem of {where} ({fs.f_bavail * fs.f_frsize:,} bytes free)"
    return None


def _directory_problem(db: Path) -> str | None:
    """Why a sqlite store cannot be at `db`: its directory is missing or a file, or the path is a directory."""
    if db.is_dir():
        return f"{db} is a directory, not a database file"
    if db.parent.is_dir():
        return None
    where = db.parent
    while not os.path.lexists(where) and where != where.parent:
        where = where.parent
    if not where.is_dir():
        return f"{where} is a file, not a directory"
    return f"the directory {db.parent} does not exist (create it if that is where the store belongs)"


def _locked(exc: BaseException) -> bool:
    return any(s in str(exc).lower() for s in ("locked", "busy"))


def probe(uri: str, timeout: float = PROBE_TIMEOUT, write: bool = True) -> None:
    """Raise StoreError (one line naming the URI) unless the store answers (see the module doc); `write=False` for a
    reader (audit), which needs neither a writable disk nor the write lock."""
    problem = scheme_problem(uri)
    if problem:
        raise StoreError(f"MLflow tracking store {uri}: {problem}; supported here: {SUPPORTED}")
    if uri.startswith("file:") and os.environ.get("MLFLOW_ALLOW_FILE_STORE", "").lower() not in ("1", "true"):
        raise StoreError(f"MLflow tracking store {uri}: MLflow 3 refuses the file store (maintenance mode); use a "
                         "database, e.g. MLFLOW_TRACKING_URI=sqlite:///mlflow.db (`mlflow migrate-filestore` moves "
                         "existing runs), or set MLFLOW_ALLOW_FILE_STORE=true")
    if uri.startswith(("http://", "https://")):
        parsed = urlparse(uri)
        port = parsed.port or (443 if parsed.scheme == "https" else 80)
        try:
            with socket.create_connection((parsed.hostname, port), timeout=timeout):
                return
        except OSError as exc:
            raise StoreError(f"MLflow tracking store {uri} unreachable ({exc.strerror or type(exc).__name__}); "
                             "start the server or set MLFLOW_TRACKING_URI to a reachable store") from None
    db = _sqlite_path(uri)
    if db is None:
        return
    problem = _directory_problem(db)
    if problem:
        raise StoreError(f"MLflow tracking store {db}: {problem}; point MLFLOW_TRACKING_URI at a store in an "
                         "existing directory (the default: sqlite:///mlflow.db in the project root)")
    problem = (_write_problem(db.parent) or (db.is_file() and not os.access(db, os.W_OK) and
                                            f"{db} is not writable by this user")) if write else None
    if problem:
        raise StoreError(f"MLflow tracking store {db}: {problem}; point MLFLOW_TRACKING_URI at a store on a "
                         "writable disk with free space (e.g. sqlite:////<dir>/mlflow.db)")
    if not db.exists():
        return
    try:
        con = sqlite3.connect(db.as_uri() + ("" if write else "?mode=ro"), uri=True, timeout=LOCK_WAIT,
                              isolation_level=None)
        try:
            con.execute("SELECT count(*) FROM sqlite_master").fetchone()
            if write:   # the write lock, as a stage will need it: a writer holding it longer is named, not waited on
                con.execute("BEGIN IMMEDIATE")
                con.execute("ROLLBACK")
        finally:
            con.close()
    except sqlite3.Error as exc:
        if _locked(exc):
            raise StoreError(f"MLflow tracking store {db}: locked by another process for more than {LOCK_WAIT:g} s "
                             f"(a stage, `mlflow ui` or a sqlite shell holding a write); wait for it or stop it "
                             f"(`fuser {db}` names it), then run again") from None
        raise StoreError(f"MLflow tracking store {db}: not a readable SQLite database ({exc}); if no process uses "
                         "it, move it aside, or set MLFLOW_TRACKING_URI to another store") from None


# ----------------------------------------------------------------------------------------------------------------
# the store: retries, locking, client and experiment

_TRANSIENT = ("database is locked", "database table is locked", "database schema is locked", "database is busy",
              "sqlite_busy", "temporarily_unavailable")
# symptoms of opening a store while another process is still creating it (without the lock: NFS, Windows)
_INIT_RACE = ("already exists", "out-of-date database schema", "no such table", "unique constraint failed")
# ...and of two migrations having run at once: permanent, retrying cannot help
_CORRUPT = ("_alembic_tmp_", "duplicate column name")


def _exc_text(exc: BaseException) -> str:
    parts, seen = [], set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        parts.append(f"{type(exc).__name__}: {exc} {getattr(exc, 'error_code', '')}")
        exc = exc.__cause__ or exc.__context__
    return " | ".join(parts).lower()


def _is_transient(exc: BaseException, init: bool = False) -> bool:
    text = _exc_text(exc)
    if any(s in text for s in _CORRUPT):
        return False
    return any(s in text for s in _TRANSIENT) or (init and any(s in text for s in _INIT_RACE))


_RNG: dict[int, random.Random] = {}


def _rng() -> random.Random:
    """Per-process jitter source (a fresh one after fork, so workers don't retry in lock-step)."""
    pid = os.getpid()
    if pid not in _RNG:
        _RNG[pid] = random.Random(pid ^ time.time_ns())
    return _RNG[pid]


# permanent store failures a stage meets mid-run: one line naming the store instead of SQLAlchemy's traceback
_FATAL = {"database or disk is full": "the disk is full: free space and run again",
          "readonly database": "the store became read-only: make it writable and run again",
          "unable to open database file": "the database file cannot be opened (deleted, moved or on a lost mount)",
          "disk i/o error": "the disk reported an I/O error"}


def _retry(fn, *args, init: bool = False, tries: int = RETRY_TRIES, wait=time.sleep, **kwargs):
    """Call fn, retrying on a locked/busy database (and, with init=True, on store-creation races) with jittered
    exponential backoff capped at RETRY_MAX_SLEEP seconds (`wait(seconds)` between attempts)."""
    for attempt in range(tries):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            fatal = next((why for s, why in _FATAL.items() if s in _exc_text(exc)), None)
            gone = vanished() if fatal or "no such table" in _exc_text(exc) else None
            if gone:
                raise StoreLost(f"MLflow tracking store: {gone}; the stage's outputs are kept, its run went with "
                                f"the store ({noise_note()})") from exc
            if fatal:
                raise StoreError(f"MLflow tracking store {configured_uri()}: {fatal}") from exc
            if attempt == tries - 1 or not _is_transient(exc, init):
                raise
            delay = min(RETRY_MAX_SLEEP, 0.02 * 2 ** attempt) * (0.5 + 0.5 * _rng().random())
            log.debug("store busy (%s); retry %d/%d in %.2fs", type(exc).__name__, attempt + 1, tries, delay)
            wait(delay)
    raise AssertionError("unreachable")


def _store_initialised(db: Path) -> bool:
    """Has some process already started creating this sqlite store (alembic_version table present)?"""
    if not db.is_file() or db.stat().st_size == 0:
        return False
    try:
        con = sqlite3.connect(f"{db.as_uri()}?mode=ro", uri=True, timeout=20)
        try:
            return con.execute("SELECT 1 FROM sqlite_master WHERE type='table' AND name='alembic_version'"
                               ).fetchone() is not None
        finally:
            con.close()
    except sqlite3.Error:
        return False


@contextlib.contextmanager
def _store_lock(uri: str, shared: bool | None = None):
    """Advisory flock on the sqlite store's directory (no lock file is left behind). Whoever may have to create
    and migrate the store holds it exclusively; once the store exists, openers share it, so they only wait for a
    migration in progress (the creator takes the lock before the file exists). Where flock is unavailable
    (non-POSIX, some network filesystems) this is a no-op and two first-time creations can collide: call
    `ensure_store()` before starting parallel workers there."""
    db = _sqlite_path(uri)
    if db is None or fcntl is None:
        yield
        return
    if shared is None:
        shared = _store_initialised(db)
    try:
        fd = os.open(db.parent, os.O_RDONLY)
    except OSError:
        yield
        return
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH if shared else fcntl.LOCK_EX)
        except OSError:
            pass
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)
        os.close(fd)


_CLIENTS: dict[tuple[int, str], Any] = {}
_EXPERIMENTS: dict[tuple[int, str, str], str] = {}


def _client(uri: str):
    """One MlflowClient per (process, store). Constructing it opens the store, and for a brand-new sqlite file runs
    the schema migrations (seconds): that happens under the store lock, retried on creation races."""
    key = (os.getpid(), uri)
    if key not in _CLIENTS:
        from mlflow.tracking import MlflowClient
        logging.getLogger("mlflow.store.db.utils").addFilter(NOISE)
        db = _sqlite_path(uri)
        problem = _directory_problem(db) if db is not None else None
        if problem:   # refused, never created (a caller that did not probe)
            raise StoreError(f"MLflow tracking store {db}: {problem}")
        new = db is not None and not _store_initialised(db)
        with _store_lock(uri):
            try:
                _CLIENTS[key] = _retry(MlflowClient, tracking_uri=uri, init=True)
            except Exception as exc:
                if any(s in _exc_text(exc) for s in _CORRUPT):
                    raise StoreError(
                        f"MLflow store {uri}: creation collided with another process migrating it at the same "
                        f"time ({type(exc).__name__}: {str(exc).splitlines()[0]}). Run again; if it fails the same "
                        f"way the file was left half-migrated and holds no runs: delete it. Where flock is "
                        f"unavailable, create the store (agentrl.tracking.store.ensure_store) before starting parallel "
                        f"workers") from exc
                raise
        if db is not None:   # what vanished() holds it against
            opened(db)
        if new:
            print(f"warning: MLflow tracking store {db} did not exist: created it, empty", file=sys.stderr)
    return _CLIENTS[key]


def ensure_store(root: Path | str | None = None, experiment: str = DEFAULT_EXPERIMENT) -> str:
    """Create (and migrate) the tracking store and the experiment now; idempotent. Returns the tracking URI.
    Cheap insurance before launching parallel queue workers (`dvc queue start -j N`)."""
    root = Path(root).resolve() if root is not None else project_root()
    uri = tracking_uri(root)
    _ensure_experiment(_client(uri), uri, experiment, artifact_location(uri, root))
    return uri


def _ensure_experiment(client, uri: str, name: str, location: str) -> str:
    """Experiment id for `name`, creating it (with an explicit absolute artifact location) if needed. Runs under
    the store lock; should another process create it first anyway (no flock), read theirs."""
    from mlflow.exceptions import MlflowException
    key = (os.getpid(), uri, name)
    if key in _EXPERIMENTS:
        return _EXPERIMENTS[key]
    with _store_lock(uri, shared=False):  # serialise get-or-create of the experiment
        exp = _retry(client.get_experiment_by_name, name)
        if exp is None:
            try:
                exp_id = _retry(client.create_experiment, name, artifact_location=location, init=False)
            except MlflowException:  # another process created it first
                exp = _retry(client.get_experiment_by_name, name)
                if exp is None:
                    raise
                exp_id = exp.experiment_id
        else:
            exp_id = exp.experiment_id
            if exp.lifecycle_stage == "deleted":
                _retry(client.restore_experiment, exp_id)
    _EXPERIMENTS[key] = exp_id
    return exp_id
