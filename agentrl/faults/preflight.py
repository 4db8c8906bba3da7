"""The preflight gate: the nine invariants on the clean trainer and on every injected fault (the fault matrix).
The gate passes when the clean trainer passes every invariant and every fault fails exactly where the book's
matrix expects it to. Every cell carries its value, the threshold and the margin (how many times the value
clears the threshold on its side; docs/preflight.md)."""
from __future__ import annotations

from agentrl.faults.registry import BUGS, EXPECTED_FAILURES, seams_for
from agentrl.rl.invariants import CHECKS, failed_checks, margin, sanity_checks


def _cells(res) -> dict:
    t = res.thresholds
    return {k: {"value": v, "passed": p, "relation": t[k][0], "threshold": t[k][1],
                "margin": margin(k, v, res.backend)} | ({"error": res.errors[k]} if k in res.errors else {})
            for k, (v, p) in res.items()}


def fault_matrix(model, trajs: list, tok, cfg, bugs: list[str]) -> dict:
    """{check: value/passed/threshold/margin} for the clean trainer and each fault, what failed, what was expected,
    and the gate."""
    rows = [None] + list(bugs)
    matrix = {str(bug): sanity_checks(model, trajs, tok, cfg, seams_for(bug)) for bug in rows}
    failed = {name: failed_checks(res) for name, res in matrix.items()}
    expected = {str(bug): EXPECTED_FAILURES[bug] for bug in rows}
    escaped = {b: sorted(expected[b] - failed[b]) for b in failed if expected[b] - failed[b]}
    extra = {b: sorted(failed[b] - expected[b]) for b in failed if failed[b] - expected[b]}
    gate = not failed["None"] and not escaped
    return {"checks": list(CHECKS), "kl_coef": cfg.kl_coef,
            "thresholds": {c: {"relation": r, "value": v} for c, (r, v) in matrix["None"].thresholds.items()},
            "batch_episodes": len(trajs),
            "clean": _cells(matrix["None"]),
            "matrix": {b: _cells(res) for b, res in matrix.items()},
            "failed": {b: sorted(f) for b, f in failed.items()},
            "expected": {b: sorted(e) for b, e in expected.items()},
            "matches_expected": all(failed[b] == expected[b] for b in failed), "escaped": escaped, "unexpected": extra,
            "bugs": {b: BUGS[b] for b in bugs}, "gate": "passed" if gate else "failed"}
