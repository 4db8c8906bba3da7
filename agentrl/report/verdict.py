"""`python -m agentrl compare-reports A B`: two report trees (say the committed one and a rebuild on another
machine) and one screen for a user: identical; or how many fields differ, the headline numbers side by side, and
for each whether the difference lies inside the spread the report itself measures (its bootstrap intervals, the
ablation's seed spread), and whether any conclusion of the report changes.

A conclusion is what the report says in words: the chosen checkpoint beats the start (its paired interval excludes
0), an ablation arm differs from the default (its paired interval excludes 0), the preflight gate passes and matches
the expected fault matrix, every failure of the catalogue shows its signature.
"""
from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

from agentrl.report.numbers import ReportError, read_report, snapshot


class CompareError(ValueError):
    """A report tree that cannot be compared (missing directory or file, not JSON)."""


def _load(tree: Path, name: str) -> dict:
    path = tree / name
    if not path.exists() and not path.is_symlink():
        return {}
    try:
        return read_report(path)
    except ReportError as exc:
        raise CompareError(str(exc)) from None


def _nan(v) -> bool:
    return isinstance(v, float) and v != v


def _get(data: dict, dotted: str):
    node = data
    for part in dotted.split("."):
        if not isinstance(node, dict) or part not in node:
            return None
        node = node[part]
    return node


@dataclass
class Headline:
    name: str
    file: str
    path: str
    lo: str | None = None      # the report's own interval around the number (paths in the same file)
    hi: str | None = None
    sd: str | None = None      # or its seed standard deviation (inside: within 2 SD)


def headlines(ablation: dict) -> list[Headline]:
    out = [Headline("test: chosen checkpoint pass@1", "test.json", "chosen.pass_at_1", "chosen.ci_lo", "chosen.ci_hi"),
           Headline("test: starting policy pass@1", "test.json", "start.pass_at_1", "start.ci_lo", "start.ci_hi"),
           Headline("test: paired gain over the start", "test.json", "paired_diff.mean", "paired_diff.ci_lo",
                    "paired_diff.ci_hi"),
           Headline("select: chosen checkpoint validation", "selection.json", "chosen.pass_rate", "chosen.ci_lo",
                    "chosen.ci_hi"),
           Headline("select: chosen step", "selection.json", "chosen.step"),
           Headline("train: validation at the last step", "train.json", "validation.-1.pass_rate")]
    for arm in (ablation.get("arms") or {}):
        out.append(Headline(f"ablation: {arm} held-out pass", "ablation.json", f"arms.{arm}.heldout_pass",
                            f"arms.{arm}.ci_lo", f"arms.{arm}.ci_hi"))
        if arm != "default":
            out.append(Headline(f"ablation: {arm} - default", "ablation.json", f"arms.{arm}.diff_vs_default.mean",
                                f"arms.{arm}.diff_vs_default.ci_lo", f"arms.{arm}.diff_vs_default.ci_hi"))
    out.append(Headline("threads: max parameter difference 1 vs 2", "threads.json", "max_param_diff"))
    return out


def _value(tree_data: dict, h: Headline, path: str | None):
    if path is None:
        return None
    if path.startswith("validation.-1."):   # the last row of a list
        rows = _get(tree_data.get(h.file, {}), "checkpoints")
        return rows[-1].get(path.rsplit(".", 1)[1]) if isinstance(rows, list) and rows else None
    return _get(tree_data.get(h.file, {}), path)


def _sign(lo, hi) -> str:
    if lo is None or hi is None:
        return "?"
    if _nan(lo) or _nan(hi):
        return "NaN"   # no interval: never read as one that includes 0
    return "> 0" if lo > 0 else "< 0" if hi < 0 else "includes 0"


def conclusions(data: dict) -> dict:
    """{statement: value} of what the report concludes, from one tree's detail JSON."""
    test, abl = data.get("test.json", {}), data.get("ablation.json", {})
    pre, faults = data.get("preflight.json", {}), data.get("faults.json", {})
    out = {"paired gain interval (chosen - start)": _sign(_get(test, "paired_diff.ci_lo"),
                                                         _get(test, "paired_diff.ci_hi"))}
    for arm, row in (abl.get("arms") or {}).items():
        if arm != "default":
            out[f"ablation {arm} - default interval"] = _sign(_get(row, "diff_vs_default.ci_lo"),
                                                               _get(row, "diff_vs_default.ci_hi"))
    out["preflight gate"] = pre.get("gate")
    out["fault matrix as expected"] = pre.get("matches_expected")
    for name, holds in sorted((faults.get("holds") or {}).items()):
        out[f"fault signature {name} shows"] = holds
    out["default arm seed 0 equals the main run"] = _get(abl, "default_matches_main_run.equal")
    return out


def compare_trees(a: Path | str, b: Path | str) -> dict:
    a, b = Path(a), Path(b)
    for tree in (a, b):
        if not tree.is_dir():
            raise CompareError(f"{tree}: not a directory of reports")
    try:
        sa, sb = snapshot(a), snapshot(b)
    except ReportError as exc:
        raise CompareError(str(exc)) from None
    differ, only_a, only_b, total = {}, 0, 0, 0
    for file in sorted(set(sa) | set(sb)):
        fa, fb = sa.get(file, {}), sb.get(file, {})
        total += len(set(fa) | set(fb))
        only_a += len(set(fa) - set(fb))
        only_b += len(set(fb) - set(fa))
        n = sum(1 for k in set(fa) & set(fb) if fa[k] != fb[k] and not (fa[k] != fa[k] and fb[k] != fb[k]))
        if n:
            differ[file] = n
    da = {f: _load(a, f) for f in sorted(set(sa) | set(sb))}
    db = {f: _load(b, f) for f in sorted(set(sa) | set(sb))}
    rows = []
    for h in headlines(da.get("ablation.json", {})):
        va, vb = _value(da, h, h.path), _value(db, h, h.path)
        lo, hi, sd = _value(da, h, h.lo), _value(da, h, h.hi), _value(da, h, h.sd)
        if va == vb:
            inside = "same"
        elif _nan(va) or _nan(vb) or _nan(lo) or _nan(hi):
            inside = "NaN"
        elif not isinstance(vb, (int, float)) or isinstance(vb, bool):
            inside = "missing" if vb is None else "?"
        elif lo is not None and hi is not None:
            inside = "yes" if lo <= vb <= hi else "NO"
        elif sd is not None:
            inside = "yes" if abs(vb - va) <= 2 * sd else "NO"
        else:
            inside = "no spread measured"
        rows.append({"name": h.name, "a": va, "b": vb, "lo": lo, "hi": hi, "inside": inside})
    ca, cb = conclusions(da), conclusions(db)
    changed = [{"statement": k, "a": ca.get(k), "b": cb.get(k)} for k in sorted(set(ca) | set(cb))
               if ca.get(k) != cb.get(k)]
    return {"a": str(a), "b": str(b), "fields": total, "differ": differ, "only_a": only_a, "only_b": only_b,
            "headlines": rows, "conclusions": ca, "changed_conclusions": changed}


def strict(node):
    """JSON's own values only: NaN and the infinities become the strings "NaN", "Infinity", "-Infinity"."""
    if isinstance(node, dict):
        return {k: strict(v) for k, v in node.items()}
    if isinstance(node, list):
        return [strict(v) for v in node]
    if isinstance(node, float) and not math.isfinite(node):
        return "NaN" if node != node else ("Infinity" if node > 0 else "-Infinity")
    return node


def _fmt(v) -> str:
    if _nan(v):
        return "NaN"
    if isinstance(v, float):
        return f"{v:.4g}"
    return "-" if v is None else str(v)


def verdict(res: dict) -> str:
    n = sum(res["differ"].values()) + res["only_a"] + res["only_b"]
    if n == 0:
        return f"identical: all {res['fields']:,} numeric fields are equal"
    outside = [r["name"] for r in res["headlines"] if r["inside"] in ("NO", "missing")]
    if res["changed_conclusions"]:
        return (f"{n:,} of {res['fields']:,} fields differ and {len(res['changed_conclusions'])} conclusion(s) of "
                f"the report change: " + "; ".join(f"{c['statement']}: {_fmt(c['a'])} -> {_fmt(c['b'])}"
                                                  for c in res["changed_conclusions"]))
    if outside:
        return (f"{n:,} of {res['fields']:,} fields differ; no conclusion changes, but {len(outside)} headline "
                f"number(s) moved outside the report's own spread: {', '.join(outside)}")
    return (f"{n:,} of {res['fields']:,} fields differ, every headline number inside the report's own spread "
            f"and no conclusion changes")


def format_comparison(res: dict) -> str:
    lines = [f"compare-reports: A = {res['a']}, B = {res['b']}",
             f"  {res['fields']:,} numeric fields; differ: " + (", ".join(f"{f} {n:,}" for f, n in
                                                                       res["differ"].items()) or "none")
             + f"; only in A {res['only_a']}, only in B {res['only_b']}",
             f"  {'headline':42s} {'A':>10s} {'B':>10s}   {'A interval':20s} inside?"]
    for r in res["headlines"]:
        interval = f"[{_fmt(r['lo'])}, {_fmt(r['hi'])}]" if r["lo"] is not None else ""
        lines.append(f"  {r['name']:42s} {_fmt(r['a']):>10s} {_fmt(r['b']):>10s}   {interval:20s} {r['inside']}")
    lines.append(f"  {'conclusion':50s} {'A':>12s} {'B':>12s}")
    changed = {c["statement"] for c in res["changed_conclusions"]}
    for k, v in res["conclusions"].items():
        other = next((c["b"] for c in res["changed_conclusions"] if c["statement"] == k), v)
        lines.append(f"  {k:50s} {_fmt(v):>12s} {_fmt(other):>12s}" + ("   CHANGED" if k in changed else ""))
    lines.append("verdict: " + verdict(res))
    return "\n".join(lines)


def main(a: str, b: str, as_json: bool = False) -> int:
    """0: identical, or differences that change no conclusion; 1: a conclusion changes; 2: bad input."""
    import sys
    try:
        res = compare_trees(a, b)
    except CompareError as exc:
        print(f"error: compare-reports: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(strict(res), indent=2, default=str, allow_nan=False) if as_json else format_comparison(res))
    return 1 if res["changed_conclusions"] else 0
