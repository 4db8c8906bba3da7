"""Thread-count reproducibility: where two runs of the same config first sample different batches, and how far
apart their parameters end up."""
from __future__ import annotations


def first_divergent_step(rows: list[dict], reference: list[dict]) -> int | None:
    """The first step whose sampled batch (batch_hash) differs between two dashboards (None: never)."""
    return next((r["step"] for r, m in zip(rows, reference) if r["batch_hash"] != m["batch_hash"]), None)


def max_param_diff(a: dict, b: dict) -> float:
    """Largest absolute difference between two state dicts with the same keys."""
    return max(float((a[k] - b[k]).abs().max()) for k in a)
