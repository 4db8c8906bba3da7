"""Provenance: one MLflow run per pipeline stage, content fingerprints, and the `audit` query.

Read top to bottom:
  where things live   project_root / work_root / tracking_uri / artifact_location
  what produced it    git_info, code_hash, file_hash, versions, flatten_params, fingerprint
  the stage run       stage_run(...) -> StageRun (run_id, fingerprint, provenance, log_metrics, log_history)
  the question        audit("reports/x.json:a.b.0.c") -> dict, format_audit(dict) -> text

Where the store lives. Every stage logs into ONE store, `sqlite:///<root>/mlflow.db`, with the experiment's artifact
location pinned to `<root>/mlartifacts` (no artifacts are logged; the location is pinned so an experiment first
created from a temporary copy never records a path that later disappears). <root> is `DVC_ROOT` when DVC runs the
stage: DVC sets it for every stage command and, for queued/--temp experiments that execute in a copy under
`.dvc/tmp/exps/<tmp>/`, deliberately points it at the MAIN repository (dvc/repo/experiments/queue/base.py:
"Override DVC_ROOT env var to point to the parent DVC repo root (and not an executor tempdir root)"; PRs
treeverse/dvc#9879 and #9918). As a belt-and-braces measure any root inside `.dvc/tmp/exps/` is mapped back to the
repository that contains it. The code that actually ran (code hash, git commit, input paths) is read from the
*working copy* (`work_root`), which for a queued experiment is the temporary copy.

Concurrency. Parallel queue workers write the same sqlite file. Every store call goes through `_retry` (backoff with
jitter on "database is locked" and friends), writes are batched (`log_batch`, <= 1000 metrics a transaction), and a
racing `create_experiment` falls back to reading the experiment the other process created. First-time store
creation runs MLflow's schema migrations, which must not run twice at once (tried: two concurrent migrations leave
`_alembic_tmp_*` tables behind and the file is unusable; no retry fixes that), so it is serialised with an flock on
the store's directory; later openers share that lock and only wait for a migration in progress.

Nothing phones home: MLflow telemetry is switched off (MLFLOW_DISABLE_TELEMETRY, DO_NOT_TRACK) before mlflow can be
imported; mlflow itself is imported lazily so `import agentrl.tracking` stays cheap.
"""
from __future__ import annotations

import os

# MLflow (>= 3.2) decides at `import mlflow` time whether to start its telemetry client
# (mlflow.telemetry.utils.is_telemetry_disabled). setdefault: an explicit user choice wins.
os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
os.environ.setdefault("DO_NOT_TRACK", "true")

import contextlib
import hashlib
import json
import logging
import math
import numbers
import platform
import random
import re
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

try:  # serialises first-time store creation (POSIX); without it a concurrent creation can fail (ensure_store)
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None

log = logging.getLogger(__name__)

DEFAULT_EXPERIMENT = "agentrl"
STORE_FILE = "mlflow.db"
ARTIFACT_DIR = "mlartifacts"
CODE_DIRS = ("agentrl", "stages")
# A working-tree change to any of these makes the code version "dirty". Pipeline outputs (reports/, data/,
# dvc.lock) are deliberately not listed: they change during a run.
DIRTY_PATHS = ("agentrl", "stages", "params.yaml", "dvc.yaml", "pyproject.toml")
FINGERPRINT_FIELDS = ("stage", "params", "threads", "versions", "git_commit", "dirty", "code_hash", "inputs")
PROVENANCE_KEYS = ("stage", "mlflow_run_id", "experiment", "tracking_uri", "fingerprint", "params", "threads",
                   "git_commit", "dirty", "code_hash", "versions", "inputs")
_DVC_TMP = (".dvc", "tmp", "exps")

MAX_METRICS_PER_BATCH = 1000   # mlflow.utils.validation.MAX_METRICS_PER_BATCH / MAX_ENTITIES_PER_BATCH
MAX_PARAMS_TAGS_PER_BATCH = 100  # mlflow.utils.validation.MAX_PARAMS_TAGS_PER_BATCH
MAX_PARAM_VALUE = 6000
MAX_TAG_VALUE = 8000
MAX_KEY = 250
RETRY_TRIES = 30
RETRY_MAX_SLEEP = 1.0


class ProvenanceError(ValueError):
    """A missing or unreadable artifact, or a bad argument to the provenance layer."""


class AuditError(ValueError):
    """`audit` could not answer: bad spec, missing file/key, or no provenance block."""


# ----------------------------------------------------------------------------------------------------------------
# where things live

def _git(args: list[str], cwd: Path | str) -> str | None:
    """stdout of a git command (stripped), or None if git is missing / fails / `cwd` is not a repository."""
    try:
        out = subprocess.run(["git", "--no-optional-locks", *args], cwd=str(cwd), capture_output=True, text=True,
                             timeout=30, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    return out.stdout.strip() if out.returncode == 0 else None


def _outside_dvc_tmp(path: Path) -> Path:
    """Map `<repo>/.dvc/tmp/exps/<tmp...>` (a DVC experiment executor copy) back to `<repo>`."""
    parts = path.parts
    for i in range(len(parts) - len(_DVC_TMP) + 1):
        if parts[i:i + len(_DVC_TMP)] == _DVC_TMP:
            return Path(*parts[:i])
    return path


def work_root(cwd: Path | str | None = None) -> Path:
    """The checkout the code is running in: git toplevel of `cwd`, else `cwd`. For a queued DVC experiment this
    is the temporary copy under .dvc/tmp/exps/ (it is its own git repository)."""
    cwd = Path(cwd or os.getcwd()).resolve()
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    return Path(top).resolve() if top else cwd


def project_root(cwd: Path | str | None = None) -> Path:
    """The MAIN repository, home of the one MLflow store: $DVC_ROOT if set, else the git toplevel of the cwd,
    else the cwd; a path inside a DVC experiment temp copy is mapped back to the repository owning it."""
    env = os.environ.get("DVC_ROOT")
    if env:
        base = Path(cwd or os.getcwd())
        return _outside_dvc_tmp((base / Path(env).expanduser()).resolve())
    return _outside_dvc_tmp(work_root(cwd))


def _sqlite_path(uri: str) -> Path | None:
    """The database file of a `sqlite:///...` URI (None for other schemes or in-memory databases)."""
    if not uri.startswith("sqlite:///"):
        return None
    rest = uri[len("sqlite:///"):].split("?", 1)[0]
    return Path(rest) if rest and rest != ":memory:" else None


def tracking_uri(root: Path | str | None = None) -> str:
    """$MLFLOW_TRACKING_URI if set (a relative sqlite/file path is anchored at the project root), else
    `sqlite:///<absolute project root>/mlflow.db`. Always absolute."""
    root = Path(root).resolve() if root is not None else project_root()
    env = os.environ.get("MLFLOW_TRACKING_URI", "").strip()
    if not env:
        return f"sqlite:///{(root / STORE_FILE).as_posix()}"
    if env.startswith("sqlite:///"):
        rest = env[len("sqlite:///"):]
        path, sep, query = rest.partition("?")
        if path and path != ":memory:" and not Path(path).is_absolute():
            return f"sqlite:///{(root / path).resolve().as_posix()}{sep}{query}"
        return env
    if env.startswith("file:"):
        return env if env.startswith("file:///") or env.startswith("file://localhost/") else \
            (root / env[len("file:"):]).resolve().as_uri()
    if "://" not in env:  # a bare path means a local file store
        return (root / env).resolve().as_uri()
    return env


def artifact_location(uri: str | None = None, root: Path | str | None = None) -> str:
    """file URI of the experiment artifact root: `mlartifacts/` beside the sqlite store (i.e. `<root>/mlartifacts`
    for the default store), else `<root>/mlartifacts`."""
    root = Path(root).resolve() if root is not None else project_root()
    uri = uri or tracking_uri(root)
    db = _sqlite_path(uri)
    base = db.parent if db is not None else root
    return (base / ARTIFACT_DIR).resolve().as_uri()


# ----------------------------------------------------------------------------------------------------------------
# what produced it

def git_info(root: Path | str | None = None) -> dict:
    """{"commit": HEAD sha or "unknown", "dirty": bool}. Dirty = uncommitted (staged, unstaged or untracked
    non-ignored) changes under agentrl/, stages/, params.yaml, dvc.yaml, pyproject.toml; outputs don't count.
    Outside a git repository the code version cannot be vouched for: commit "unknown", dirty True."""
    root = Path(root) if root is not None else work_root()
    commit = _git(["rev-parse", "--verify", "-q", "HEAD"], root)
    status = _git(["status", "--porcelain", "--untracked-files=all", "--", *DIRTY_PATHS], root)
    return {"commit": commit or "unknown", "dirty": True if status is None else bool(status)}


def _code_files(root: Path, package_dir: Path | None = None) -> list[tuple[str, Path]]:
    files = []
    for name in CODE_DIRS:
        base = package_dir if (name == "agentrl" and package_dir is not None) else root / name
        if base.is_dir():
            files += [(f"{name}/{p.relative_to(base).as_posix()}", p) for p in base.rglob("*.py") if p.is_file()]
    return sorted(files)


def code_hash(root: Path | str | None = None, package_dir: Path | str | None = None) -> str:
    """sha256 (16 hex) over the sorted relative paths + bytes of agentrl/**/*.py and stages/**/*.py.
    `package_dir` replaces `<root>/agentrl` (to hash the agentrl that was actually imported)."""
    root = Path(root) if root is not None else work_root()
    h = hashlib.sha256()
    for rel, path in _code_files(root, Path(package_dir) if package_dir is not None else None):
        data = path.read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hash(path: Path | str) -> str:
    """sha256 (hex) of a file; for a directory, sha256 over its sorted (relative path, file sha256) pairs."""
    path = Path(path)
    if path.is_file():
        return _sha256_file(path)
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(q for q in path.rglob("*") if q.is_file()):
            h.update(f"{p.relative_to(path).as_posix()}\0{_sha256_file(p)}\n".encode())
        return h.hexdigest()
    raise ProvenanceError(f"input artifact not found: {path} (run the stage that produces it first)")


def _dist_version(*names: str) -> str:
    for name in names:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            continue
    return "not installed"


def versions() -> dict:
    """python / torch / dvc / mlflow / agentrl versions (from package metadata: nothing heavy is imported)."""
    agentrl_version = _dist_version("agentrl")
    if agentrl_version == "not installed":
        from agentrl import __version__ as agentrl_version
    return {"python": platform.python_version(), "torch": _dist_version("torch"), "dvc": _dist_version("dvc"),
            "mlflow": _dist_version("mlflow", "mlflow-skinny"), "agentrl": agentrl_version}


def _plain(value: Any) -> Any:
    """JSON-native copy (numpy/torch scalars -> Python numbers, tuples -> lists, Paths -> str)."""
    def default(o):
        if hasattr(o, "item"):
            try:
                return o.item()
            except (TypeError, ValueError):
                pass
        if isinstance(o, (set, frozenset)):
            return sorted(o, key=repr)
        return str(o)
    return json.loads(json.dumps(value, default=default))


def flatten_params(params: Mapping, prefix: str = "") -> dict:
    """{"rl": {"lr": 0.01}} -> {"rl.lr": 0.01}. Lists and scalars are leaves; an empty mapping is a leaf {}."""
    out: dict[str, Any] = {}
    for key, value in params.items():
        name = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.update(flatten_params(value, name))
        else:
            out[name] = value
    return out


def canonical_json(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=True, allow_nan=True)


def fingerprint(record: Mapping) -> str:
    """sha256 (16 hex) of the canonical JSON of the record's content fields (stage, params, threads, versions,
    git commit, dirty, code hash, input hashes) -- never run ids, URIs or timestamps."""
    content = {k: record.get(k) for k in FINGERPRINT_FIELDS}
    return hashlib.sha256(canonical_json(_plain(content)).encode()).hexdigest()[:16]


def _input_name(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def _imported_agentrl_dir() -> Path:
    import agentrl
    return Path(agentrl.__file__).resolve().parent


def running_code_hash(root: Path | str) -> str:
    """code_hash of the code a stage started from `root` actually runs: `<root>/stages` plus the agentrl package
    Python imports. They differ from `<root>/agentrl` when an editable install points elsewhere, e.g. a queued
    DVC experiment in .dvc/tmp/exps/ running `python stages/x.py` imports the main workspace's agentrl."""
    root = Path(root).resolve()
    package_dir = _imported_agentrl_dir()
    return code_hash(root, None if package_dir == root / "agentrl" else package_dir)


def resume_key(provenance: Mapping) -> str:
    """Fingerprint of what determines a stage's numbers (params, threads, versions, code, inputs), without the
    git commit and dirty flag: work saved under one key may be resumed by any run with the same key."""
    return fingerprint({k: provenance[k] for k in FINGERPRINT_FIELDS if k not in ("git_commit", "dirty")})


def build_provenance(stage: str, params: Mapping, inputs: Iterable[str | Path] = (), threads: int = 1,
                     root: Path | str | None = None) -> dict:
    """The content part of a provenance record (no run id yet) + its fingerprint. Hashes every input first, so a
    missing artifact fails here, before any run is created or output written."""
    if not isinstance(stage, str) or not stage:
        raise ProvenanceError(f"stage must be a non-empty string, got {stage!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ProvenanceError(f"run.threads must be an integer >= 1 (or None for a stage without tensor work), "
                              f"got {threads!r}")
    if not isinstance(params, Mapping):
        raise ProvenanceError(f"params must be a mapping, got {type(params).__name__}")
    root = Path(root).resolve() if root is not None else work_root()
    flat = _plain(flatten_params(params))
    if "run.threads" in flat and flat["run.threads"] != threads:
        raise ProvenanceError(f"params say run.threads={flat['run.threads']!r} but threads={threads!r}")
    hashes = {}
    for item in inputs:
        path = Path(item)
        path = (path if path.is_absolute() else Path.cwd() / path).resolve()
        hashes[_input_name(path, root)] = file_hash(path)
    git = git_info(root)
    record = {"stage": stage, "params": dict(sorted(flat.items())), "threads": threads,
              "git_commit": git["commit"], "dirty": git["dirty"], "code_hash": running_code_hash(root),
              "versions": versions(), "inputs": dict(sorted(hashes.items()))}
    record["fingerprint"] = fingerprint(record)
    record["_agentrl_dir"] = str(_imported_agentrl_dir())
    return record


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


def _retry(fn, *args, init: bool = False, tries: int = RETRY_TRIES, **kwargs):
    """Call fn, retrying on a locked/busy database (and, with init=True, on store-creation races) with jittered
    exponential backoff capped at RETRY_MAX_SLEEP seconds."""
    for attempt in range(tries):
        try:
            return fn(*args, **kwargs)
        except Exception as exc:  # noqa: BLE001 - filtered below
            if attempt == tries - 1 or not _is_transient(exc, init):
                raise
            delay = min(RETRY_MAX_SLEEP, 0.02 * 2 ** attempt) * (0.5 + 0.5 * _rng().random())
            log.debug("store busy (%s); retry %d/%d in %.2fs", type(exc).__name__, attempt + 1, tries, delay)
            time.sleep(delay)
    raise AssertionError("unreachable")


class _DropLockedNoise(logging.Filter):
    """MLflow logs a full traceback for every OperationalError before re-raising it; ours are retried."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            return "database is locked" not in record.getMessage()
        except Exception:  # noqa: BLE001
            return True


_FILTER = _DropLockedNoise()


def _store_initialised(db: Path) -> bool:
    """Has some process already started creating this sqlite store (alembic_version table present)?"""
    if not db.is_file() or db.stat().st_size == 0:
        return False
    import sqlite3
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
    db.parent.mkdir(parents=True, exist_ok=True)
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
        logging.getLogger("mlflow.store.db.utils").addFilter(_FILTER)
        with _store_lock(uri):
            try:
                _CLIENTS[key] = _retry(MlflowClient, tracking_uri=uri, init=True)
            except Exception as exc:
                if any(s in _exc_text(exc) for s in _CORRUPT):
                    raise ProvenanceError(
                        f"MLflow store {uri}: creation collided with another process migrating it at the same "
                        f"time ({type(exc).__name__}: {str(exc).splitlines()[0]}). Run again; if it fails the same "
                        f"way the file was left half-migrated and holds no runs: delete it. Where flock is "
                        f"unavailable, create the store (agentrl.tracking.ensure_store) before starting parallel "
                        f"workers") from exc
                raise
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


_BAD_KEY_CHARS = re.compile(r"[^\w.\- /]")


def _key(name: str) -> str:
    """A valid MLflow param/metric/tag key (alnum _ - . space /; no leading '/', no '..'; <= 250 chars)."""
    key = _BAD_KEY_CHARS.sub("_", str(name)).lstrip("/").replace("..", "__") or "_"
    if len(key) > MAX_KEY:
        key = key[:MAX_KEY - 17] + "~" + hashlib.sha256(key.encode()).hexdigest()[:16]
    return key


def _value_text(value: Any, limit: int) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 1] + "\u2026"


def _metric_value(value: Any) -> float | None:
    """A finite float, or None for anything non-numeric (bool, str, None, ...) or non-finite."""
    if isinstance(value, bool):
        return None
    if not isinstance(value, numbers.Number) and hasattr(value, "item"):
        try:
            value = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        return None
    value = float(value)
    return value if math.isfinite(value) else None


def _chunks(items: list, size: int):
    for i in range(0, len(items), size):
        yield items[i:i + size]


# ----------------------------------------------------------------------------------------------------------------
# the stage run

class StageRun:
    """Handle yielded by `stage_run`: the run id, the fingerprint, the provenance block, and metric logging."""

    def __init__(self, client, run_id: str, provenance: dict):
        self._client = client
        self.run_id = run_id
        self.provenance = provenance
        self.fingerprint = provenance["fingerprint"]
        self.experiment = provenance["experiment"]
        self.tracking_uri = provenance["tracking_uri"]
        self.n_logged = 0

    def _log(self, metrics: list) -> int:
        for chunk in _chunks(metrics, MAX_METRICS_PER_BATCH):
            _retry(self._client.log_batch, self.run_id, metrics=chunk)
        self.n_logged += len(metrics)
        return len(metrics)

    def log_metrics(self, metrics: Mapping, step: int | None = None) -> int:
        """Log one row of metrics (nested dicts flattened with dots) at `step`; returns how many were logged."""
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        rows = [Metric(_key(k), v, now, int(step or 0)) for k, raw in flatten_params(metrics).items()
                if (v := _metric_value(raw)) is not None]
        return self._log(rows)

    def log_history(self, rows: Iterable[Mapping], step_key: str = "step") -> int:
        """Log many step rows (e.g. the training dashboard) in few transactions: `row[step_key]` is the step (the
        row's index if absent); other numeric, finite values become metrics. Returns how many were logged."""
        from mlflow.entities import Metric
        now = int(time.time() * 1000)
        metrics = []
        for index, row in enumerate(rows):
            step = row.get(step_key, index)
            step = int(step) if _metric_value(step) is not None else index
            for k, raw in flatten_params({k: v for k, v in row.items() if k != step_key}).items():
                v = _metric_value(raw)
                if v is not None:
                    metrics.append(Metric(_key(k), v, now, step))
        return self._log(metrics)

    def set_tags(self, tags: Mapping) -> None:
        """Extra stage-specific tags (e.g. the selected checkpoint). Not part of the fingerprint."""
        from mlflow.entities import RunTag
        items = [RunTag(_key(k), _value_text(v, MAX_TAG_VALUE)) for k, v in tags.items()]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            _retry(self._client.log_batch, self.run_id, tags=chunk)


def _run_tags(record: dict, work: Path, root: Path) -> dict:
    tags = {"stage": record["stage"], "fingerprint": record["fingerprint"], "git.commit": record["git_commit"],
            "git.dirty": str(record["dirty"]).lower(), "code_hash": record["code_hash"],
            "run.threads": str(record["threads"])}
    tags.update({f"version.{k}": v for k, v in record["versions"].items()})
    tags.update({f"input.{p}": h for p, h in record["inputs"].items()})
    if record["git_commit"] != "unknown":
        tags["mlflow.source.git.commit"] = record["git_commit"]
    for env, tag in (("DVC_EXP_NAME", "dvc.exp_name"), ("DVC_EXP_BASELINE_REV", "dvc.baseline_rev"),
                     ("DVC_STAGE", "dvc.stage")):
        if os.environ.get(env):
            tags[tag] = os.environ[env]
    if work != root:
        tags["workdir"] = str(work)
    if record["_agentrl_dir"] != str(work / "agentrl"):
        tags["code.agentrl_dir"] = record["_agentrl_dir"]  # imported agentrl is not the working copy's
    return {_key(k): _value_text(v, MAX_TAG_VALUE) for k, v in tags.items()}


@contextlib.contextmanager
def stage_run(stage: str, params: Mapping, inputs: Iterable[str | Path], threads: int,
              experiment: str = DEFAULT_EXPERIMENT):
    """Open exactly one MLflow run for a pipeline stage (run name = stage) and yield a `StageRun`.

    Logged: the params it read (flattened, e.g. `rl.lr`) plus `run.threads`; tags stage, git.commit, git.dirty,
    code_hash, version.*, input.<path> (sha256), fingerprint. Status FINISHED on a clean exit, FAILED (KILLED on
    Ctrl-C) when an exception escapes; the exception is re-raised. Relative input paths are relative to the cwd
    and are recorded relative to the working copy's root."""
    from mlflow.entities import Param
    work = work_root()
    root = project_root()
    uri = tracking_uri(root)
    record = build_provenance(stage, params, inputs, threads, root=work)  # fails before any run exists
    if record["_agentrl_dir"] != str(work / "agentrl"):
        print(f"agentrl.tracking: warning: agentrl imported from {record['_agentrl_dir']}, not from the working "
              f"copy {work}; code_hash covers the imported package", file=sys.stderr)
    client = _client(uri)
    exp_id = _ensure_experiment(client, uri, experiment, artifact_location(uri, root))
    run = _retry(client.create_run, exp_id, run_name=stage, tags=_run_tags(record, work, root))
    run_id = run.info.run_id
    status, clean = "FAILED", False
    try:
        logged = dict(record["params"])
        if threads is not None:
            logged["run.threads"] = threads
        items = [Param(_key(k), _value_text(v, MAX_PARAM_VALUE)) for k, v in sorted(logged.items())]
        for chunk in _chunks(items, MAX_PARAMS_TAGS_PER_BATCH):
            _retry(client.log_batch, run_id, params=chunk)
        provenance = {**{k: record[k] for k in FINGERPRINT_FIELDS + ("fingerprint",)}, "mlflow_run_id": run_id,
                      "experiment": experiment, "tracking_uri": uri}
        provenance = {k: provenance[k] for k in PROVENANCE_KEYS}
        yield StageRun(client, run_id, provenance)
        status, clean = "FINISHED", True
    except KeyboardInterrupt:
        status = "KILLED"
        raise
    except SystemExit as exc:
        status = "FINISHED" if exc.code in (None, 0) else "FAILED"
        raise
    finally:
        try:
            _retry(client.set_terminated, run_id, status)
        except Exception:
            if clean:  # nothing else is propagating: the caller must learn the run was not closed
                raise
            log.warning("could not mark MLflow run %s as %s", run_id, status, exc_info=True)


def record_provenance(path: Path | str, provenance: Mapping) -> None:
    """Insert `provenance` as the top-level "provenance" key of an existing JSON object file."""
    path = Path(path)
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        raise ProvenanceError(f"{path}: top level must be a JSON object to carry a provenance block")
    data["provenance"] = dict(provenance)
    path.write_text(json.dumps(data, indent=2, sort_keys=False) + "\n")


# ----------------------------------------------------------------------------------------------------------------
# audit: "which params, inputs, code and thread count produced this number?"

def _split_spec(spec: str) -> tuple[str, str]:
    if not isinstance(spec, str) or ":" not in spec:
        raise AuditError(f"audit spec must be '<file>.json:<dotted.path>', e.g. "
                         f"'reports/test.json:chosen.pass_rate'; got {spec!r}")
    file, dotted = spec.rsplit(":", 1)
    if not file or not dotted:
        raise AuditError(f"audit spec must be '<file>.json:<dotted.path>'; got {spec!r}")
    return file, dotted


def _describe_keys(node: Any) -> str:
    if isinstance(node, dict):
        keys = list(node)
        shown = ", ".join(map(str, keys[:20])) + (", ..." if len(keys) > 20 else "")
        return f"available keys: {shown}" if keys else "it is an empty object"
    if isinstance(node, list):
        return f"it is a list of {len(node)} (indices 0..{len(node) - 1})" if node else "it is an empty list"
    return f"it is a {type(node).__name__} ({node!r}), not an object or list"


def extract(data: Any, dotted: str, label: str = "") -> Any:
    """Follow a dotted path (list indices allowed; keys that themselves contain dots are matched greedily)."""
    parts = dotted.split(".")
    node, done, i = data, [], 0
    while i < len(parts):
        where = ".".join(done) or "<top level>"
        if isinstance(node, list):
            try:
                index = int(parts[i])
                node = node[index]
            except (ValueError, IndexError):
                raise AuditError(f"{label}: no index '{parts[i]}' at '{where}' (path '{dotted}'); "
                                 f"{_describe_keys(node)}") from None
            done.append(parts[i])
            i += 1
        elif isinstance(node, dict):
            for j in range(len(parts), i, -1):  # longest key first: "rl.lr" may be a literal key
                key = ".".join(parts[i:j])
                if key in node:
                    node = node[key]
                    done.append(key)
                    i = j
                    break
            else:
                raise AuditError(f"{label}: key '{parts[i]}' not found at '{where}' (path '{dotted}'); "
                                 f"{_describe_keys(node)}")
        else:
            raise AuditError(f"{label}: cannot look up '{parts[i]}' at '{where}' (path '{dotted}'); "
                             f"{_describe_keys(node)}")
    return node


def _same(old: Any, new: Any) -> bool:
    """Equal as JSON, or equal as numbers (YAML '1e-3' is a string, a validated param the float 0.001)."""
    if canonical_json(_plain(old)) == canonical_json(_plain(new)):
        return True
    try:
        return not isinstance(old, bool) and not isinstance(new, bool) and float(old) == float(new)
    except (TypeError, ValueError):
        return False


def _read_params_yaml(root: Path) -> dict | None:
    path = root / "params.yaml"
    if not path.is_file():
        return None
    import yaml
    data = yaml.safe_load(path.read_text()) or {}
    if not isinstance(data, dict):
        raise AuditError(f"{path}: top level must be a mapping")
    return flatten_params(data)


def _fetch_run(run_id: str, uris: list[str]) -> dict:
    """Look the run up read-only: a sqlite store that does not exist is reported, never created."""
    result = {"exists": False, "run_id": run_id, "searched": [], "error": None}
    if not run_id:
        result["error"] = "provenance has no mlflow_run_id"
        return result
    for uri in dict.fromkeys(u for u in uris if u):
        result["searched"].append(uri)
        db = _sqlite_path(uri)
        if db is not None and not db.is_file():
            result["error"] = f"store not found: {db}"
            continue
        try:
            from mlflow.exceptions import MlflowException
            client = _client(uri)
            try:
                run = _retry(client.get_run, run_id)
            except MlflowException as exc:
                if "RESOURCE_DOES_NOT_EXIST" in str(getattr(exc, "error_code", "")) or "not found" in str(exc):
                    result["error"] = f"run {run_id} not in {uri}"
                    continue
                raise
            exp = _retry(client.get_experiment, run.info.experiment_id)
        except Exception as exc:  # noqa: BLE001 - report, don't crash the audit
            result["error"] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
            continue
        return {"exists": True, "run_id": run_id, "tracking_uri": uri, "searched": result["searched"],
                "error": None, "run_name": run.info.run_name, "status": run.info.status,
                "experiment": exp.name if exp else None, "start_time": run.info.start_time,
                "end_time": run.info.end_time, "params": dict(sorted(run.data.params.items())),
                "tags": dict(sorted(run.data.tags.items())), "metrics": sorted(run.data.metrics)}
    return result


def audit(spec: str, root: Path | str | None = None) -> dict:
    """Answer "which params, inputs, code and thread count produced this number" for `<file>.json:<dotted.path>`,
    and whether the current workspace would still produce it ("current") or not ("stale", with reasons)."""
    root = Path(root).resolve() if root is not None else project_root()
    file, dotted = _split_spec(spec)
    path = Path(file) if Path(file).is_absolute() else root / file
    if not path.is_file():
        raise AuditError(f"{file}: no such file under {root}")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise AuditError(f"{file}: not valid JSON ({exc})") from None
    value = extract(data, dotted, file)
    prov = data.get("provenance") if isinstance(data, dict) else None
    if not isinstance(prov, dict):
        raise AuditError(f"{file} has no top-level 'provenance' block; re-run the stage that writes it")
    missing = [k for k in FINGERPRINT_FIELDS + ("fingerprint", "mlflow_run_id") if k not in prov]
    if missing:
        raise AuditError(f"{file}: provenance block lacks {', '.join(missing)}")

    reasons, warnings = [], []
    fingerprint_now = fingerprint(prov)
    fingerprint_ok = fingerprint_now == prov["fingerprint"]
    if not fingerprint_ok:
        reasons.append(f"provenance block does not match its fingerprint ({prov['fingerprint']} recorded, "
                       f"{fingerprint_now} recomputed): edited after the run?")

    run = _fetch_run(prov["mlflow_run_id"], [tracking_uri(root), prov.get("tracking_uri")])
    if not run["exists"]:
        warnings.append(f"MLflow run {prov['mlflow_run_id']} not found ({run['error']})")
    elif run["tags"].get("fingerprint") != prov["fingerprint"]:
        reasons.append(f"MLflow run fingerprint {run['tags'].get('fingerprint')} != provenance fingerprint "
                       f"{prov['fingerprint']}")

    param_changes = []
    current = _read_params_yaml(root)
    if current is None:
        reasons.append("params.yaml missing at the project root")
    else:
        for key, old in sorted(prov["params"].items()):
            if key not in current:
                param_changes.append({"key": key, "old": old, "new": None, "status": "removed"})
                reasons.append(f"param {key} removed from params.yaml (was {old!r})")
            elif not _same(old, current[key]):
                param_changes.append({"key": key, "old": old, "new": current[key], "status": "changed"})
                reasons.append(f"param {key} changed: {old!r} -> {current[key]!r}")
        if "run.threads" not in prov["params"] and "run.threads" in current and prov["threads"] is not None \
                and not _same(prov["threads"], current["run.threads"]):
            param_changes.append({"key": "run.threads", "old": prov["threads"], "new": current["run.threads"],
                                  "status": "changed"})
            reasons.append(f"param run.threads changed: {prov['threads']!r} -> {current['run.threads']!r}")

    input_changes, input_now = [], {}
    for name, old in sorted(prov["inputs"].items()):
        ipath = Path(name) if Path(name).is_absolute() else root / name
        try:
            input_now[name] = new = file_hash(ipath)
        except ProvenanceError:
            input_now[name] = None
            input_changes.append({"path": name, "old": old, "new": None, "status": "missing"})
            reasons.append(f"input {name} missing")
            continue
        if new != old:
            input_changes.append({"path": name, "old": old, "new": new, "status": "changed"})
            reasons.append(f"input {name} changed: {old[:12]} -> {new[:12]}")

    code_now = running_code_hash(root)
    if code_now != prov["code_hash"]:
        reasons.append(f"code changed: code hash {prov['code_hash']} -> {code_now}")
    git_now = git_info(root)

    return {"spec": spec, "file": file, "path": dotted, "value": value, "root": str(root),
            "stage": prov["stage"], "fingerprint": prov["fingerprint"], "fingerprint_ok": fingerprint_ok,
            "provenance": prov, "run": run,
            "current": {"code_hash": code_now, "git_commit": git_now["commit"], "dirty": git_now["dirty"],
                        "inputs": input_now, "tracking_uri": tracking_uri(root)},
            "changes": {"params": param_changes, "inputs": input_changes,
                        "code": None if code_now == prov["code_hash"] else {"old": prov["code_hash"],
                                                                             "new": code_now}},
            "status": "current" if not reasons else "stale", "reasons": reasons, "warnings": warnings}


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value) if isinstance(value, (str, float, int, bool)) or value is None else \
        json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def format_audit(result: Mapping) -> str:
    """Human-readable audit answer."""
    prov, run = result["provenance"], result["run"]
    changed_params = {c["key"]: c for c in result["changes"]["params"]}
    changed_inputs = {c["path"]: c for c in result["changes"]["inputs"]}
    lines = [f"{result['file']}:{result['path']} = {_short(result['value'])}",
             f"  stage        : {prov['stage']}"]
    if run["exists"]:
        lines.append(f"  mlflow run   : {prov['mlflow_run_id']} (found, status {run['status']}, "
                     f"run name {run['run_name']!r})")
        lines.append(f"  experiment   : {run['experiment']}   store: {run['tracking_uri']}")
    else:
        lines.append(f"  mlflow run   : {prov['mlflow_run_id']} (NOT FOUND: {run['error']})")
        lines.append(f"  experiment   : {prov.get('experiment')}   store (recorded): {prov.get('tracking_uri')}")
    lines.append(f"  fingerprint  : {prov['fingerprint']}"
                 + ("" if result["fingerprint_ok"] else "  (MISMATCH: block edited after the run?)"))
    lines.append(f"  threads      : {prov['threads']}")
    lines.append(f"  params       : {len(prov['params'])}")
    for key, value in sorted(prov["params"].items()):
        change = changed_params.get(key)
        note = "" if change is None else (f"   <- now {_short(change['new'], 60)}" if change["status"] == "changed"
                                          else "   <- now absent from params.yaml")
        lines.append(f"      {key} = {_short(value, 120)}{note}")
    if "run.threads" in changed_params and "run.threads" not in prov["params"]:
        lines.append(f"      (run.threads now {changed_params['run.threads']['new']!r} in params.yaml)")
    lines.append(f"  code version : commit {prov['git_commit']}{' (dirty)' if prov['dirty'] else ''}, "
                 f"code hash {prov['code_hash']}")
    cur = result["current"]
    lines.append(f"  code now     : commit {cur['git_commit']}{' (dirty)' if cur['dirty'] else ''}, "
                 f"code hash {cur['code_hash']}")
    lines.append("  versions     : " + ", ".join(f"{k} {v}" for k, v in prov["versions"].items()))
    lines.append(f"  inputs       : {len(prov['inputs'])}")
    for name, digest in sorted(prov["inputs"].items()):
        change = changed_inputs.get(name)
        note = "" if change is None else ("   <- MISSING now" if change["status"] == "missing"
                                          else f"   <- CHANGED, now {change['new'][:16]}")
        lines.append(f"      {name}  sha256 {digest[:16]}{note}")
    for warning in result["warnings"]:
        lines.append(f"  warning      : {warning}")
    if result["status"] == "current":
        lines.append("  status       : current (params, inputs and code match the workspace)")
    else:
        lines.append(f"  status       : STALE ({len(result['reasons'])} reason(s))")
        lines += [f"      - {r}" for r in result["reasons"]]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """`python -m agentrl.tracking audit SPEC [--root DIR] [--json]`: 0 current, 1 stale, 2 error."""
    import argparse
    parser = argparse.ArgumentParser(prog="python -m agentrl.tracking")
    sub = parser.add_subparsers(dest="cmd", required=True)
    p = sub.add_parser("audit", help="provenance of a number in reports/*.json")
    p.add_argument("spec", help="reports/<file>.json:<dotted.path>")
    p.add_argument("--root", default=None)
    p.add_argument("--json", action="store_true")
    args = parser.parse_args(argv)
    try:
        result = audit(args.spec, args.root)
    except (AuditError, ProvenanceError) as exc:
        print(f"audit: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=str) if args.json else format_audit(result))
    return 0 if result["status"] == "current" else 1


if __name__ == "__main__":
    sys.exit(main())
