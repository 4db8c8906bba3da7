"""Numbers don't move: the numeric fields of every reports/*.json against a snapshot.

`snapshot(reports_dir)` flattens every JSON report into {file: {dotted.path: value}} for numbers and booleans,
leaving out provenance (commits, run ids, fingerprints) and wall times. `compare(snapshot, reports_dir, moved)`
finds each snapshot number in today's reports -- at the same place, or where a rule of `moved` says it went
({"from": "capstone.json:learned.", "to": "behaviour.json:"}, or {"from": ..., "removed": "why"}) -- and lists
every number that differs or is missing. `python -m agentrl compare-reports` runs it on the committed reports.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

from agentrl.core import files
from agentrl.core.knobs import UserError

MAX_REPORT_BYTES = 256 * files.MiB   # the largest committed report is a few MiB


class ReportError(UserError):
    """A report that cannot be read as JSON: one line naming the file (exit 2)."""


SKIP_KEYS = {"provenance", "seconds", "wall_seconds", "total_seconds", "mlflow_run_id", "fingerprint", "runs_ids"}


def _flat(node, prefix=""):
    if isinstance(node, dict):
        for k, v in node.items():
            if k in SKIP_KEYS:
                continue
            yield from _flat(v, f"{prefix}.{k}" if prefix else str(k))
    elif isinstance(node, list):
        for i, v in enumerate(node):
            yield from _flat(v, f"{prefix}.{i}" if prefix else str(i))
    elif isinstance(node, (bool, int, float)) or node is None:
        yield prefix, node


def read_report(path: Path | str):
    """One report's JSON: a regular file within MAX_REPORT_BYTES, UTF-8, valid JSON, or one line naming the file."""
    try:
        return json.loads(files.read_text(path, MAX_REPORT_BYTES, "a report"))
    except files.InputFileError as exc:
        raise ReportError(str(exc)) from None
    except OSError as exc:
        raise ReportError(f"{path}: cannot be read ({exc.strerror or type(exc).__name__})") from None
    except (ValueError, RecursionError) as exc:
        raise ReportError(f"{path}: not valid JSON ({str(exc).splitlines()[0][:120]})") from None


def numbers(path: Path) -> dict:
    """{dotted.path: value} of one JSON file's numbers, booleans and nulls."""
    return dict(_flat(read_report(path)))


def snapshot(reports_dir: Path | str) -> dict:
    reports_dir = Path(reports_dir)
    return {p.name: numbers(p) for p in sorted(reports_dir.glob("*.json"))}


def _same(a, b) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return a is b
    if isinstance(a, float) and isinstance(b, float) and a != a and b != b:
        return True
    return a == b


def _where(spec: str, moved: list[dict]):
    """Where a snapshot number `file:path` lives now: (file, path), or ('removed', reason)."""
    for rule in moved:
        if "changed" in rule:
            continue
        if spec.startswith(rule["from"]):
            if "removed" in rule:
                return "removed", rule["removed"]
            file, _, prefix = rule["to"].partition(":")
            return file, prefix + spec[len(rule["from"]):]
    return tuple(spec.split(":", 1))


def compare(snap: dict, reports_dir: Path | str, moved: list[dict] = ()) -> dict:
    """-> {"equal", "moved_equal", "removed", "changed", "differ": [...], "missing": [...]}. A rule
    {"from": prefix, "changed": reason} (optionally "fields": names one of which must be a
    component of the path) names numbers a later change moved on purpose: they still have to exist,
    and a difference there is counted under its reason instead of in "differ"."""
    reports_dir = Path(reports_dir)
    now = {}
    changed = [r for r in moved if "changed" in r]
    out = {"equal": 0, "moved_equal": 0, "removed": {}, "changed": {}, "differ": [], "missing": []}
    for file, values in snap.items():
        for path, old in values.items():
            spec = f"{file}:{path}"
            where = _where(spec, moved)
            if where[0] == "removed":
                out["removed"][where[1]] = out["removed"].get(where[1], 0) + 1
                continue
            nfile, npath = where
            if nfile not in now:
                p = reports_dir / nfile
                now[nfile] = numbers(p) if p.is_file() else {}
            if npath not in now[nfile]:
                out["missing"].append(spec)
            elif not _same(old, now[nfile][npath]):
                reason = next((r["changed"] for r in changed if spec.startswith(r["from"]) and
                               ("fields" not in r or set(r["fields"]) & set(spec.split(":", 1)[1].split(".")))),
                              None)
                if reason is None:
                    out["differ"].append((spec, old, now[nfile][npath]))
                else:
                    out["changed"][reason] = out["changed"].get(reason, 0) + 1
            else:
                out["equal" if (nfile, npath) == (file, path) else "moved_equal"] += 1
    return out


def main(snapshot_path: str, reports_dir: str, moved_path: str | None) -> int:
    from agentrl.core.artifacts import Leaf, read_json
    snap = read_json(snapshot_path, {str: {str: (float, bool, None)}})
    rule = ({"from": str, "to": str}, {"from": str, "removed": str}, {"from": str, "changed": str})
    no_rules = Leaf(list, lambda v: not v, "an empty list")   # a fresh snapshot: every number where it was
    moved = read_json(moved_path, {"rules": ([rule], no_rules)})["rules"] if moved_path and Path(moved_path).is_file() \
        else []
    res = compare(snap, reports_dir, moved)
    total = sum(len(v) for v in snap.values())
    print(f"compare-reports: {total} numbers in {snapshot_path}: {res['equal']} equal in place, "
          f"{res['moved_equal']} moved and equal, {sum(res['removed'].values())} removed, "
          f"{sum(res['changed'].values())} changed on purpose, {len(res['differ'])} differ, "
          f"{len(res['missing'])} missing")
    for reason, n in sorted(res["removed"].items()):
        print(f"  removed ({n}): {reason}")
    for reason, n in sorted(res["changed"].items()):
        print(f"  changed on purpose ({n}): {reason}")
    for spec, old, new in res["differ"][:20]:
        print(f"  DIFFER {spec}: {old!r} -> {new!r}")
    for spec in res["missing"][:20]:
        print(f"  MISSING {spec}")
    return 0 if not res["differ"] and not res["missing"] else 1


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
