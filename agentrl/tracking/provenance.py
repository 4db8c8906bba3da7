"""Provenance: what produced an output, by pure hashing (no MLflow, no DVC run).

    where things live    project_root / work_root (a queued DVC experiment runs in a copy under .dvc/tmp/exps/)
    a stage's code       stage_code_files: the code files dvc.yaml lists as the stage's deps (its import closure,
                         kept exact by tests/test_dvc_yaml.py) -- the one source of truth DVC also hashes
    what produced it     build_provenance(stage, params, inputs, threads, machine) -> the content record (params
                         read, thread count, library versions, code files and hash, input hashes, the machine class
                         its numerics ran on) and its fingerprint
    the code version     git_info (commit, dirty): recorded in the provenance record and MLflow, never in outputs

Nothing here is written into a stage's outputs: outputs depend only on what made them (code, params, inputs,
threads), so the same inputs give byte-identical outputs on any commit.
"""
from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
from collections.abc import Iterable, Mapping
from importlib import metadata
from pathlib import Path
from typing import Any

from agentrl.core import files
from agentrl.core.knobs import UserError
from agentrl.tracking.closure import is_code

FINGERPRINT_FIELDS = ("stage", "params", "threads", "versions", "code_hash", "inputs", "numerics")
_DVC_TMP = (".dvc", "tmp", "exps")


class ProvenanceError(UserError):
    """A missing or unreadable artifact, or a bad argument to the provenance layer."""


# ---------------------------------------------------------------- where things live

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
    """The checkout the code runs in: the directory holding dvc.yaml at or above `cwd`, else the git toplevel,
    else `cwd`. For a queued DVC experiment this is the temporary copy under .dvc/tmp/exps/."""
    cwd = Path(cwd or os.getcwd()).resolve()
    for d in (cwd, *cwd.parents):
        if (d / "dvc.yaml").is_file():
            return d
    top = _git(["rev-parse", "--show-toplevel"], cwd)
    return Path(top).resolve() if top else cwd


def project_root(cwd: Path | str | None = None) -> Path:
    """The MAIN repository, home of the one MLflow store: $DVC_ROOT if set (DVC points it at the main repository
    even for queued experiments that run in a temporary copy), else the working copy; a path inside a DVC
    experiment temp copy is mapped back to the repository owning it."""
    env = os.environ.get("DVC_ROOT")
    if env:
        base = Path(cwd or os.getcwd())
        return _outside_dvc_tmp((base / Path(env).expanduser()).resolve())
    return _outside_dvc_tmp(work_root(cwd))


def git_info(root: Path | str | None = None) -> dict:
    """{"commit": HEAD sha or "unknown", "dirty": uncommitted changes to code, params or dvc.yaml}."""
    root = Path(root) if root is not None else work_root()
    commit = _git(["rev-parse", "--verify", "-q", "HEAD"], root)
    status = _git(["status", "--porcelain", "--untracked-files=all", "--", "agentrl", "stages", "params.yaml",
                   "dvc.yaml", "pyproject.toml"], root)
    return {"commit": commit or "unknown", "dirty": True if status is None else bool(status)}


# ---------------------------------------------------------------- a stage's code

def stage_definition(stage: str, root: Path | str | None = None) -> dict:
    """The dvc.yaml entry of a stage ('ablate@default-0' -> the 'ablate' matrix definition)."""
    import yaml
    root = Path(root) if root is not None else work_root()
    path = root / "dvc.yaml"
    try:
        stages = yaml.safe_load(files.read_text(path, files.MAX_TEXT_BYTES, "dvc.yaml"))["stages"]
    except (OSError, yaml.YAMLError, KeyError, TypeError, files.InputFileError) as exc:
        raise ProvenanceError(f"{path}: cannot read the stage graph ({type(exc).__name__})") from None
    name = stage.split("@", 1)[0]
    if name not in stages:
        raise ProvenanceError(f"stage {stage!r} is not in {path}; stages: {', '.join(stages)}")
    return stages[name]


def loaded_unlisted(code_files: list[str], root: Path | str) -> list[str]:
    """The agentrl source files this process has loaded that are not among `code_files` (a stage's code deps): a
    module a registry imported by name because the stage did not import its entry (agentrl.tracking.closure) shows
    up here. Empty unless this process runs a stage script (`python -m stages.<name>`)."""
    import sys
    main = getattr(sys.modules.get("__main__"), "__spec__", None)
    if main is None or not str(main.name).startswith("stages."):
        return []
    root, listed = Path(root).resolve(), set(code_files)
    out = []
    for module in list(sys.modules.values()):
        source = getattr(module, "__file__", None)
        if not source or not module.__name__.split(".")[0] == "agentrl":
            continue
        try:
            rel = Path(source).resolve().relative_to(root).as_posix()
        except ValueError:
            continue   # agentrl installed elsewhere: not this checkout's code
        if rel not in listed:
            out.append(rel)
    return sorted(out)


def stage_code_files(stage: str, root: Path | str | None = None) -> list[str]:
    """The code a stage runs: the code files dvc.yaml lists as its deps (its exact import closure)."""
    deps = stage_definition(stage, root).get("deps", [])
    return sorted(d for d in deps if isinstance(d, str) and is_code(d))


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def file_hash(path: Path | str) -> str:
    """sha256 (hex) of a file; for a directory, sha256 over its sorted (relative path, file sha256) pairs. Every file
    hashed must be a regular file within the input bound (agentrl.core.files): a device, a FIFO or an oversized
    file is one line, never an endless read."""
    path = Path(path)
    if not path.exists():
        raise ProvenanceError(f"input artifact not found: {path} (run the stage that produces it first)")
    if path.is_dir():
        h = hashlib.sha256()
        for p in sorted(q for q in path.rglob("*") if not q.is_dir()):
            files.check_regular(p, what="an input")
            h.update(f"{p.relative_to(path).as_posix()}\0{_sha256_file(p)}\n".encode())
        return h.hexdigest()
    files.check_regular(path, what="an input")
    return _sha256_file(path)


def code_hash(files: Iterable[str], root: Path | str | None = None) -> str:
    """sha256 (16 hex) over the sorted relative paths and bytes of `files` (paths relative to root)."""
    root = Path(root) if root is not None else work_root()
    h = hashlib.sha256()
    for rel in sorted(files):
        data = (root / rel).read_bytes()
        h.update(f"{rel}\0{len(data)}\0".encode())
        h.update(data)
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- what produced it

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


def plain(value: Any) -> Any:
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
    """sha256 (16 hex) of the canonical JSON of the record's content fields (stage, params, threads, versions, code
    hash, input hashes) -- never a commit, run id, path or timestamp."""
    content = {k: record.get(k) for k in FINGERPRINT_FIELDS}
    return hashlib.sha256(canonical_json(plain(content)).encode()).hexdigest()[:16]


def params_hash(params: Mapping) -> str:
    """sha256 (12 hex) of a stage's params (flattened, canonical JSON)."""
    return hashlib.sha256(canonical_json(plain(flatten_params(params))).encode()).hexdigest()[:12]


def changed_inputs(inputs: Mapping, root: Path) -> list[tuple[str, bool]]:
    """(path, gone) of each input (path -> sha256 as recorded) whose bytes are not the recorded ones now."""
    out = []
    for rel, digest in sorted(inputs.items()):
        try:
            now = file_hash(Path(root) / rel)
        except UserError:
            now = None
        if now != digest:
            out.append((rel, now is None))
    return out


def _relative(path: Path, root: Path) -> str:
    try:
        return path.relative_to(root).as_posix()
    except ValueError:
        return path.as_posix()


def build_provenance(stage: str, params: Mapping, inputs: Iterable[str | Path] = (), threads: int | None = 1,
                     root: Path | str | None = None, machine: Mapping | None = None,
                     sources: Mapping | None = None) -> dict:
    """The content record of a stage run and its fingerprint. Hashes every input first, so a missing artifact
    fails here, before any run is created or output written. `machine` (agentrl.core.numerics.machine_class) is
    recorded whole; the fingerprint covers only the part of it that decides bits (numerics.bits_identity), so under
    portable numerics the same stage on another CPU has the same fingerprint. `sources` says where an input came
    from (input path -> e.g. the registry package, its version and hashes of pinned pretrained weights); the input's
    own hash is what the fingerprint covers."""
    if not isinstance(stage, str) or not stage:
        raise ProvenanceError(f"stage must be a non-empty string, got {stage!r}")
    if threads is not None and (isinstance(threads, bool) or not isinstance(threads, int) or threads < 1):
        raise ProvenanceError(f"run.threads must be an integer >= 1 (or None for a stage without tensor work), "
                              f"got {threads!r}")
    root = Path(root).resolve() if root is not None else work_root()
    flat = plain(flatten_params(params))
    hashes = {}
    for item in inputs:
        path = Path(item)
        path = path if path.is_absolute() else Path.cwd() / path
        path = path.parent.resolve() / path.name   # the input as named: a symlink's target is what is hashed
        hashes[_relative(path, root)] = file_hash(path)
    files = stage_code_files(stage, root)
    record = {"stage": stage, "params": dict(sorted(flat.items())), "threads": threads, "versions": versions(),
              "code_files": files, "code_hash": code_hash(files, root), "inputs": dict(sorted(hashes.items()))}
    if sources:
        record["sources"] = plain(dict(sources))
    if machine is not None:
        from agentrl.core.numerics import bits_identity
        record["machine"] = plain(dict(machine))
        record["numerics"] = plain(bits_identity(machine))
    record["fingerprint"] = fingerprint(record)
    return record
