"""Reading a catalogue run's history: series, held-out evaluation points, window means, and number formatting
shared by the signature checks and the catalogue's markdown."""
from __future__ import annotations

import math


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def series(history: list, key: str) -> list:
    return [r.get(key) for r in history]


def eval_points(history: list) -> list[tuple[int, float]]:
    """(updates done, held-out pass rate) for every evaluation in the run: step 0 and after step+1 updates."""
    pts = []
    if history and "eval_pass_start" in history[0]:
        pts.append((0, history[0]["eval_pass_start"]))
    pts += [(r["step"] + 1, r["eval_pass"]) for r in history if "eval_pass" in r]
    return pts


def eval_at(history: list, updates: int):
    """The held-out pass rate after `updates` updates (None if not evaluated then)."""
    return dict(eval_points(history)).get(updates)


def end_mean(history: list, key: str, k: int = 4, start: bool = False):
    """Mean of the first (start=True) or last k finite values of `key`."""
    vals = [v for v in series(history, key) if _finite(v)]
    if not vals:
        return None
    part = vals[:k] if start else vals[-k:]
    return sum(part) / len(part)


def _window(n: int) -> int:
    """Steps averaged at each end of a run: 4, or a quarter of a short run (at least 1)."""
    return max(1, min(4, n // 4))


def at(history: list, key: str, step: int = 0):
    return history[step].get(key) if len(history) > step else None


def _all(values, pred) -> bool:
    return bool(values) and all(v is not None and pred(v) for v in values)


def _num(*xs) -> bool:
    return all(_finite(x) for x in xs)


def _delta(history: list, key: str, k: int):
    a, b = end_mean(history, key, k, start=True), end_mean(history, key, k)
    return None if a is None or b is None else b - a


def _fmt(x, digits: int = 3) -> str:
    if x is None:
        return "—"
    if isinstance(x, bool):
        return "yes" if x else "no"
    if isinstance(x, float):
        if x == 0:
            return "0"
        if abs(x) < 1e-3 or abs(x) >= 1e4:
            return f"{x:.2e}"
        return f"{x:.0f}" if abs(x) >= 100 else f"{x:.{digits}g}"
    return str(x)


def _signed(v) -> str:
    return "—" if not _finite(v) else f"{v:+.3g}"
