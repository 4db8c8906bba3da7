"""Stopping rules, written down before the run and applied to it afterwards: where each would have stopped, the
checkpoint it would then have chosen, the steps it would have saved and the validation pass rate it would have
cost. Both rules are checked when a checkpoint is written (validation exists only there):

    patience   (a) stop at the first checkpoint that ends `patience` checkpoints in a row none of which beat the
                   upper end of the previous checkpoint's interval (validation has stopped improving beyond noise)
    zero_adv   (b) stop at the first checkpoint whose last `steps` training steps all had a zero-advantage share
                   above `threshold` (most groups all pass or all fail: little is left to learn from)

The run itself is unchanged: the rules only report (select.stop_* in params.yaml; 0 turns a rule off).
"""
from __future__ import annotations

from agentrl.eval.selection import choose
from agentrl.eval.stats import paired_bootstrap_diff


def patience_stop(rows: list[dict], patience: int) -> int | None:
    """Rule (a) over checkpoint rows (step, pass_rate, ci_lo, ci_hi in step order) -> the stop step or None."""
    streak = 0
    for prev, row in zip(rows, rows[1:]):
        streak = 0 if row["pass_rate"] > prev["ci_hi"] else streak + 1
        if streak >= patience:
            return row["step"]
    return None


def zero_adv_stop(rows: list[dict], history: list[dict], threshold: float, steps: int) -> int | None:
    """Rule (b): the first checkpoint step c >= steps whose dashboard rows c - steps .. c - 1 all have
    zero_adv_frac > threshold, or None."""
    share = {r["step"]: r["zero_adv_frac"] for r in history}
    for row in rows:
        c = row["step"]
        window = [share.get(s) for s in range(c - steps, c)]
        if c >= steps and all(v is not None and v > threshold for v in window):
            return c
    return None


def rule_outcome(rows: list[dict], stop: int | None, chosen: dict, n_boot: int, alpha: float, seed: int) -> dict:
    """What stopping at `stop` would have given: the best checkpoint up to it (choose), steps saved and the
    validation cost (chosen minus rule's pick, with a paired task-bootstrap interval)."""
    final = rows[-1]["step"]
    pick = choose([r for r in rows if stop is None or r["step"] <= stop])
    per_full = next(r for r in rows if r["step"] == chosen["step"])["per_task"]
    per_rule = next(r for r in rows if r["step"] == pick["step"])["per_task"]
    tasks = sorted(per_full)
    rates = lambda per: [per[t]["c"] / per[t]["n"] for t in tasks]
    cost, lo, hi = paired_bootstrap_diff(rates(per_rule), rates(per_full), n_boot, alpha, seed=seed)
    return {"stop_step": stop, "fired": stop is not None, "steps_saved": 0 if stop is None else final - stop,
            "chosen_step": pick["step"], "chosen_validation": pick["pass_rate"],
            "validation_cost": {"mean": cost, "ci_lo": lo, "ci_hi": hi}}


def stopping_report(rows: list[dict], history: list[dict], chosen: dict, scfg, seeds: dict) -> dict:
    """{rule: outcome} for every rule that select.stop_* turns on (empty when both are off). `seeds` maps a rule
    name to its bootstrap seed."""
    rules = {}
    if scfg.stop_patience:
        rules["patience"] = ({"patience": scfg.stop_patience}, patience_stop(rows, scfg.stop_patience))
    if scfg.stop_zero_adv_steps:
        rules["zero_adv"] = ({"threshold": scfg.stop_zero_adv, "steps": scfg.stop_zero_adv_steps},
                             zero_adv_stop(rows, history, scfg.stop_zero_adv, scfg.stop_zero_adv_steps))
    return {name: {"rule": spec, **rule_outcome(rows, stop, chosen, scfg.n_boot, scfg.alpha, seeds[name])}
            for name, (spec, stop) in rules.items()}
