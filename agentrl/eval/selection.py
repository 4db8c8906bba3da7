"""Checkpoint selection on validation tasks: every checkpoint with its task-bootstrap interval; the chosen one
has the highest validation pass rate, ties to the earlier step."""
from __future__ import annotations

from agentrl.core.artifacts import checkpoint_path
from agentrl.core.seeding import stream_seed
from agentrl.eval.stats import bootstrap_ci


def checkpoint_rows(checkpoints: list[dict], n_boot: int, alpha: float, seed: int) -> list[dict]:
    rows = []
    for ck in checkpoints:
        rates = [v["c"] / v["n"] for v in ck["per_task"].values()]
        _, lo, hi = bootstrap_ci(rates, n_boot, alpha, seed=stream_seed(seed, "select", ck["step"]))
        rows.append({"step": ck["step"], "pass_rate": ck["pass_rate"], "ci_lo": lo, "ci_hi": hi,
                     "per_task": ck["per_task"]})
    return rows


def choose(rows: list[dict]) -> dict:
    best = max(rows, key=lambda r: (r["pass_rate"], -r["step"]))  # ties go to the earlier checkpoint
    return {"step": best["step"], "pass_rate": best["pass_rate"], "ci_lo": best["ci_lo"], "ci_hi": best["ci_hi"],
            "checkpoint": checkpoint_path(best["step"]).as_posix()}
