"""`python -m agentrl audit reports/<file>.json:<dotted.path>`: which params, inputs, code and thread count produced
a number, and is it still current?

DVC is the source of truth. The stage that wrote the file is found in dvc.lock; its lock entry gives the params
it read and the hash of every dep (code files and input artifacts alike); "current or stale" is DVC's own status
of that stage (`Repo.status`), so audit and `dvc status` cannot disagree. The stage's provenance record
(reports/provenance/<stage>.json) adds what DVC does not keep: threads, library versions, git commit, the MLflow
run and wall time. The MLflow run is looked up after a probe with a short timeout; runs whose process is gone
are closed KILLED on the way (agentrl.tracking.orphans; nothing is written to a store this process cannot write).
A number of a stage run outside `dvc repro` (a lab) has no dvc.lock entry: it is traced through its provenance record
(agentrl.tracking.audit_record).
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from agentrl.core import files
from agentrl.core.artifacts import shape_problem
from agentrl.core.boundary import one_line
from agentrl.core.knobs import UserError
from agentrl.tracking.audit_record import audit_outside, format_outside, outside_stage
from agentrl.tracking.closure import is_code
from agentrl.tracking.lineage import attach_verdicts, format_lineage, format_machine, format_run, lineage
from agentrl.tracking.provenance import ProvenanceError, work_root
from agentrl.tracking.records import record_path
from agentrl.tracking.store import _sqlite_path, probe, tracking_uri


class AuditError(UserError):
    """`audit` could not answer: bad spec, missing file or key, or no stage produces the file."""


def _split_spec(spec: str) -> tuple[str, str]:
    if not isinstance(spec, str) or ":" not in spec:
        raise AuditError(f"audit spec must be '<file>.json:<dotted.path>', e.g. 'reports/test.json:chosen.pass_at_1';"
                         f" got {spec!r}")
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
            try:   # an index is ASCII digits only: int() would also read "0_1", " 1" and other scripts' digits
                if not (parts[i].isascii() and parts[i].isdigit()):
                    raise ValueError(parts[i])
                node = node[int(parts[i])]
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


def producing_stage(file: str, root: Path) -> tuple[str, dict]:
    """(stage name, dvc.lock entry) of the stage whose outputs include `file`."""
    import yaml
    lock_path = root / "dvc.lock"
    if not lock_path.is_file():
        raise AuditError(f"{lock_path}: not found; run `dvc repro` first")
    try:
        lock = yaml.safe_load(files.read_text(lock_path, 64 * files.MiB, "dvc.lock")) or {}
    except files.InputFileError as exc:
        raise AuditError(f"{exc}; restore it (git checkout dvc.lock) or run `dvc repro`") from None
    except (yaml.YAMLError, UnicodeDecodeError, ValueError, RecursionError) as exc:
        raise AuditError(f"{lock_path}: not readable YAML ({one_line(str(exc), 120)}); restore it (git checkout "
                         "dvc.lock) or run `dvc repro`") from None
    problem = shape_problem(lock, {"stages": {str: {"outs?": [{"path": str}], "deps?": [{"path": str}],
                                                    "params?": {str: dict}}}})
    if problem:
        raise AuditError(f"{lock_path}: {problem}; restore it (git checkout dvc.lock) or run `dvc repro`")
    for name, entry in lock["stages"].items():
        if any(o["path"] == file for o in entry.get("outs", [])):
            return name, entry
    raise AuditError(f"{file}: no stage in dvc.lock writes it, and no provenance record of a stage run outside "
                     "`dvc repro` names it")


DVC_WAIT_ENV = "AGENTRL_AUDIT_DVC_WAIT"   # seconds audit waits for DVC's status (default 120)


def _check_deps(entry: dict, root: Path) -> None:
    """Every dependency DVC would hash is a regular file (or a directory of them) within the input bound: DVC reads
    a device such as /dev/zero forever, so audit refuses it first, in one line."""
    for dep in entry.get("deps", []):
        path = root / dep["path"]
        try:
            if path.is_dir():
                for p in path.rglob("*"):
                    if not p.is_dir():
                        files.check_regular(p, what=f"a dependency of the stage ({dep['path']})")
            elif path.exists():
                files.check_regular(path, what="a dependency of the stage")
        except files.InputFileError as exc:
            raise AuditError(f"{exc}; dvc status would not finish") from None


def dvc_status(stage: str, root: Path, entry: dict | None = None, wait: float | None = None) -> list:
    """DVC's status of one stage: [] when current, else DVC's list of changes (as `dvc status <stage>` prints).
    The stage's dependencies are checked first (`_check_deps`), and DVC is given at most `wait` seconds
    ($AGENTRL_AUDIT_DVC_WAIT, default 120): past that, one line instead of a wait without end."""
    import threading

    from dvc.exceptions import DvcException
    from dvc.repo import Repo
    if entry is not None:
        _check_deps(entry, root)
    wait = float(os.environ.get(DVC_WAIT_ENV) or 120) if wait is None else wait
    result: dict = {}

    def status():
        try:
            with Repo(str(root)) as repo:
                result["status"] = repo.status(targets=[stage]).get(stage, [])
        except BaseException as exc:   # handed to the caller's thread
            result["error"] = exc

    worker = threading.Thread(target=status, name="dvc-status", daemon=True)
    worker.start()
    worker.join(wait)
    if worker.is_alive():
        raise AuditError(f"dvc status {stage}: no answer within {wait:g} s ({DVC_WAIT_ENV} sets the wait); a "
                         "dependency DVC cannot finish reading, or a repository lock held by a running dvc?")
    exc = result.get("error")
    if isinstance(exc, DvcException):   # e.g. YAMLFileCorruptedError: a syntax error in params.yaml or dvc.yaml
        cause = exc.__cause__
        mark = getattr(cause, "problem_mark", None)
        detail = (f"line {mark.line + 1}: {getattr(cause, 'problem', '')}" if mark is not None
                  else one_line(str(cause or exc), 200))
        raise AuditError(f"dvc status {stage}: {one_line(str(exc), 200)} ({detail}); fix the file and run again") \
            from None
    if exc is not None:
        raise exc
    return result["status"]


def _reasons(changes: list) -> list[str]:
    out = []
    for change in changes:
        if isinstance(change, str):
            out.append(change)
            continue
        for kind, detail in change.items():
            if isinstance(detail, dict):
                for what, how in detail.items():
                    out.append(f"{kind}: {what} {how if isinstance(how, str) else json.dumps(how, sort_keys=True)}")
            else:
                out.append(f"{kind}: {detail}")
    return out


def fetch_run(run_id: str | None) -> dict:
    """The MLflow run, read-only, after a probe with a short timeout (StoreError if the store does not answer);
    {'found': False, 'error': ...} when there is no record, no store yet, or no such run."""
    if not run_id:
        return {"found": False, "error": "no provenance record (run the stage)"}
    uri = tracking_uri()
    db = _sqlite_path(uri)
    if db is not None and not db.is_file():
        return {"found": False, "error": f"store not found: {db}"}
    probe(uri, write=False)   # an unreachable or corrupted store is an error (StoreError), not a silent "not found"
    try:
        from agentrl.tracking.orphans import close_all_orphans
        from agentrl.tracking.store import _client, _retry
        client = _client(uri)
        close_all_orphans(client, "audit")   # runs whose process is gone, though DVC reran nothing since
        run = _retry(client.get_run, run_id)
    except Exception as exc:
        return {"found": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"}
    return {"found": True, "run_id": run_id, "name": run.info.run_name, "status": run.info.status,
            "tracking_uri": uri, "pipeline_run": run.data.tags.get("pipeline_run"),
            "fingerprint": run.data.tags.get("fingerprint")}


def audit(spec: str, root: Path | str | None = None) -> dict:
    """Answer for `<file>.json:<dotted.path>` (see the module doc)."""
    root = Path(root).resolve() if root is not None else work_root()
    file, dotted = _split_spec(spec)
    path = root / file
    if not path.is_file():
        raise AuditError(f"{file}: no such file under {root}")
    try:
        data = json.loads(files.read_text(path, 256 * files.MiB, "the audited file"))
    except files.InputFileError as exc:
        raise AuditError(str(exc)) from None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:
        raise AuditError(f"{file}: not valid JSON ({one_line(str(exc), 120)})") from None
    value = extract(data, dotted, file)
    try:
        stage, lock = producing_stage(file, root)
    except AuditError:   # a stage run outside `dvc repro` (a lab): traced through its provenance record
        found = outside_stage(file, root)
        if found is None:
            raise
        return audit_outside(spec, file, dotted, value, *found, root, fetch_run)
    deps = {d["path"]: d.get("md5") or d.get("hash") for d in lock.get("deps", [])}
    code = {p: h for p, h in deps.items() if is_code(p)}
    inputs = {p: h for p, h in deps.items() if not is_code(p)}
    params = {}
    for pfile, values in (lock.get("params") or {}).items():
        params.update(values if pfile == "params.yaml" else {f"{pfile}:{k}": v for k, v in values.items()})
    changes = dvc_status(stage, root, lock)
    rec_file = record_path(stage, root)
    unreadable = None
    try:
        record = json.loads(files.read_text(rec_file, 16 * files.MiB)) if rec_file.exists() else None
    except (ValueError, UnicodeDecodeError, RecursionError) as exc:   # InputFileError is a ValueError
        record, unreadable = None, str(exc).splitlines()[0][:200]   # audited like a missing record, and said why
    if shape_problem(record, ({"mlflow": {"run_id": str}, "code_files?": list}, None)):
        record, unreadable = None, unreadable or "not a provenance record's shape"
    run = fetch_run((record or {}).get("mlflow", {}).get("run_id"))
    warnings = []
    if record is None:
        warnings.append(f"provenance record {rec_file.relative_to(root)} unreadable: {unreadable}" if unreadable
                        else f"no provenance record {rec_file.relative_to(root)}")
    elif record.get("code_files") and sorted(record["code_files"]) != sorted(code):
        warnings.append("the provenance record's code files differ from dvc.lock's (record from another dvc.yaml)")
    if not run["found"]:
        warnings.append(f"MLflow run not found ({run['error']})")
    chain = lineage(stage, root)
    verdict, why = attach_verdicts(chain)
    return {"spec": spec, "file": file, "path": dotted, "value": value, "stage": stage, "cmd": lock.get("cmd"),
            "params": params, "code": code, "inputs": inputs, "record": record, "run": run,
            "status": "current" if not changes else "stale", "reasons": _reasons(changes), "warnings": warnings,
            "lineage": chain, "reproduction": {"verdict": verdict, "why": why}}


def _short(value: Any, limit: int = 200) -> str:
    text = repr(value) if isinstance(value, (str, float, int, bool)) or value is None else \
        json.dumps(value, sort_keys=True)
    return text if len(text) <= limit else text[:limit - 3] + "..."


def format_audit(result: dict) -> str:
    if result.get("outside"):
        return format_outside(result, _short)
    rec, run = result["record"] or {}, result["run"]
    lines = [f"{result['file']}:{result['path']} = {_short(result['value'])}",
             f"  stage        : {result['stage']}   ({result['cmd']})"]
    lines.append(format_run(run, rec.get("mlflow", {}).get("run_id")))
    lines.append(f"  threads      : {rec.get('threads', '-')}")
    lines.append(f"  machine      : {format_machine(rec.get('machine'))}")
    lines.append("  versions     : " + ", ".join(f"{k} {v}" for k, v in rec.get("versions", {}).items()))
    lines.append(f"  code version : commit {rec.get('git_commit', '-')}{' (dirty)' if rec.get('dirty') else ''}, "
                 f"code hash {rec.get('code_hash', '-')} over {len(result['code'])} files")
    for name, digest in sorted(result["code"].items()):
        lines.append(f"      {name}  md5 {digest}")
    lines.append(f"  params       : {len(result['params'])}")
    for key, value in sorted(result["params"].items()):
        lines.append(f"      {key} = {_short(value, 120)}")
    lines.append(f"  inputs       : {len(result['inputs'])}")
    for name, digest in sorted(result["inputs"].items()):
        lines.append(f"      {name}  md5 {digest}")
    lines += format_lineage(result["lineage"], _short)
    for warning in result["warnings"]:
        lines.append(f"  warning      : {warning}")
    if result["status"] == "current":
        lines.append("  status       : current (dvc status: the stage's params, code and inputs are unchanged)")
    else:
        lines.append(f"  status       : STALE ({len(result['reasons'])} change(s), as `dvc status "
                     f"{result['stage']}` reports)")
        lines += [f"      - {r}" for r in result["reasons"]]
    rep = result["reproduction"]
    meaning = {"bit-for-bit": "a rebuild here must give the same bytes",
               "statistical": "a rebuild here gives other bits: compare within the report's intervals",
               "unknown": "cannot tell"}[rep["verdict"]]
    lines.append(f"  reproduction : {rep['verdict'].upper()} on this machine ({meaning}); {rep['why']}")
    return "\n".join(lines)


def main(spec: str, as_json: bool = False, root=None) -> int:
    """0 current, 1 stale, 2 error (one line)."""
    import sys
    try:
        result = audit(spec, root)
    except (AuditError, ProvenanceError) as exc:
        print(f"error: {one_line(str(exc))}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2, default=str) if as_json else format_audit(result))
    return 0 if result["status"] == "current" else 1
