"""The preflight gate: the nine invariants on the clean trainer and on every injected fault (the fault matrix).
The gate passes when the clean trainer passes every invariant and every fault fails exactly where the book's
matrix expects it to."""
from __future__ import annotations

from agentrl.faults.registry import BUGS, EXPECTED_FAILURES, seams_for
from agentrl.rl.invariants import CHECKS, THRESHOLDS, failed_checks, sanity_checks


def fault_matrix(model, trajs: list, tok, cfg, bugs: list[str]) -> dict:
    """{check: value/passed} for the clean trainer and each fault, what failed, what was expected, and the gate."""
    rows = [None] + list(bugs)
    matrix = {str(bug): sanity_checks(model, trajs, tok, cfg, seams_for(bug)) for bug in rows}
    failed = {name: failed_checks(res) for name, res in matrix.items()}
    expected = {str(bug): EXPECTED_FAILURES[bug] for bug in rows}
    escaped = {b: sorted(expected[b] - failed[b]) for b in failed if expected[b] - failed[b]}
    extra = {b: sorted(failed[b] - expected[b]) for b in failed if failed[b] - expected[b]}
    gate = not failed["None"] and not escaped
    return {"checks": list(CHECKS), "kl_coef": cfg.kl_coef,
            "thresholds": {c: {"relation": r, "value": v} for c, (r, v) in THRESHOLDS.items()},
            "batch_episodes": len(trajs),
            "clean": {k: {"value": v, "passed": p} for k, (v, p) in matrix["None"].items()},
            "matrix": {b: {k: {"value": v, "passed": p} for k, (v, p) in res.items()} for b, res in matrix.items()},
            "failed": {b: sorted(f) for b, f in failed.items()}, "expected": {b: sorted(e) for b, e in expected.items()},
            "matches_expected": all(failed[b] == expected[b] for b in failed), "escaped": escaped, "unexpected": extra,
            "bugs": {b: BUGS[b] for b in bugs}, "gate": "passed" if gate else "failed"}
