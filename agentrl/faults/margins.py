"""Measured margins of the nine invariants: every check's value on the clean trainer and under every registered
fault over many batches (seeds), the worst healthy and the worst faulty value of each check, and how many times
each clears the threshold. docs/preflight.md shows the table the thresholds were set from.

    python -m agentrl.faults.margins [--seeds 20] [--model data/models/base.pt] [--json PATH]
    python -m agentrl.faults.margins --from-json PATH    (the same table from values measured before)
"""
from __future__ import annotations

import argparse
import math
import sys

from agentrl.faults.registry import EXPECTED_FAILURES, FAULTS, seams_for
from agentrl.rl.invariants import CHECKS, THRESHOLDS, failed_checks, passes, sanity_checks

HEALTHY = "healthy"


def measure(model, tok, tasks: list, cfg, seeds: list[int], bugs: list[str], progress=None) -> dict:
    """{seeds, values: {row: [ {check: value} per seed ]}, failed: {row: [failed invariants per seed]}}; rows
    are 'None' (the clean trainer) and each fault. Batches come from the preflight stream of each seed."""
    from agentrl.core.seeding import generator
    from agentrl.env.gym.spec import GYM
    from agentrl.rl.rollout import sample_step
    values: dict = {str(b): [] for b in [None, *bugs]}
    failed: dict = {str(b): [] for b in [None, *bugs]}
    for seed in seeds:
        batch, _ = sample_step(model, GYM.make(cfg), tasks, tok, cfg, generator(seed, "preflight"))
        for bug in [None, *bugs]:
            res = sanity_checks(model, batch, tok, cfg, seams_for(bug))
            values[str(bug)].append({c: float(res[c][0]) for c in CHECKS})
            failed[str(bug)].append(sorted(failed_checks(res)))
        if progress:
            progress(f"margins: seed {seed} done")
    return {"seeds": list(seeds), "values": values, "failed": failed}


def _worst(relation: str, values: list[float], healthy: bool) -> float:
    """The value closest to (or past) the threshold: a healthy value's largest for '<' and '==', smallest for
    '>'; a faulty value's the other way round. NaN counts as the worst."""
    if any(math.isnan(v) for v in values):
        return float("nan")
    high = relation in ("<", "==")
    return (max if high == healthy else min)(abs(v) if relation == "==" else v for v in values)


def clearance(check: str, value: float) -> float | None:
    """Times the value clears the threshold on its side (>= 1 when on the right side): None for exact or sign
    checks, inf for an exact zero on the passing side."""
    relation, t = THRESHOLDS[check]
    if relation == "==" or t == 0 or math.isnan(value):
        return None
    if value <= 0:
        return math.inf
    return max(value / t, t / value)


def summarize(measured: dict) -> dict:
    """Per check: the healthy values (every row expected to pass it), the faulty ones (every row expected to fail
    it) with their worst, the factor between the two worsts, and the seeds on which the whole matrix held."""
    rows = list(measured["values"])
    expected = {r: EXPECTED_FAILURES[None if r == "None" else r] for r in rows}
    out = {}
    for i, check in enumerate(CHECKS):
        relation, threshold = THRESHOLDS[check]
        healthy = [v[check] for r in rows if i + 1 not in expected[r] for v in measured["values"][r]]
        faulty = {r: [v[check] for v in measured["values"][r]] for r in rows if i + 1 in expected[r]}
        hw = _worst(relation, healthy, True)
        fw = _worst(relation, [v for vs in faulty.values() for v in vs], False) if faulty else None
        factor = None
        if fw is not None and not (math.isnan(hw) or math.isnan(fw)):
            lo_side, hi_side = (hw, fw) if relation in ("<", "==") else (fw, hw)
            factor = math.inf if lo_side <= 0 < hi_side else (hi_side / lo_side if lo_side > 0 else None)
        out[check] = {"relation": relation, "threshold": threshold, "healthy_n": len(healthy),
                      "healthy_min": min(healthy), "healthy_max": max(healthy), "healthy_worst": hw,
                      "healthy_passes": all(passes(check, v) for v in healthy),
                      "healthy_clearance": clearance(check, hw),
                      "faulty": {r: {"min": min(vs), "max": max(vs)} for r, vs in faulty.items()},
                      "faulty_worst": fw,
                      "faulty_fail": all(not passes(check, v) for vs in faulty.values() for v in vs),
                      "faulty_clearance": None if fw is None else clearance(check, fw), "factor": factor}
    held = [all(sorted(expected[r]) == measured["failed"][r][k] for r in rows) for k in range(len(measured["seeds"]))]
    return {"checks": out, "seeds": measured["seeds"], "matrix_held": sum(held), "matrix_seeds": len(held),
            "matrix_broke_at": [s for s, ok in zip(measured["seeds"], held) if not ok]}


def _g(x) -> str:
    if x is None:
        return "-"
    if isinstance(x, float) and math.isinf(x):
        return "inf"
    return f"{x:.3g}"


def markdown(summary: dict) -> str:
    """The margins table: one row per invariant."""
    lines = [f"Seeds {summary['seeds'][0]}-{summary['seeds'][-1]} ({summary['matrix_seeds']} batches); the whole "
             f"fault matrix held on {summary['matrix_held']} of {summary['matrix_seeds']}"
             + (f" (not on seeds {summary['matrix_broke_at']})" if summary["matrix_broke_at"] else "") + ".", "",
             "| # | invariant | passes if | healthy values (n) | worst healthy, clears by | faulty rows "
             "| faulty values | worst faulty, clears by | factor |", "|---|---|---|---|---|---|---|---|---|"]
    for i, (check, s) in enumerate(summary["checks"].items()):
        faulty = s["faulty"]
        lines.append(f"| {i + 1} | `{check}` | {s['relation']} {s['threshold']:g} | {_g(s['healthy_min'])} .. "
                     f"{_g(s['healthy_max'])} ({s['healthy_n']}) | {_g(s['healthy_worst'])}, "
                     f"{_g(s['healthy_clearance'])}x | {', '.join(faulty) or '-'} | "
                     + ("; ".join(f"{_g(v['min'])} .. {_g(v['max'])}" for v in faulty.values()) or "-")
                     + f" | {_g(s['faulty_worst'])}, {_g(s['faulty_clearance'])}x | {_g(s['factor'])} |")
    return "\n".join(lines)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m agentrl.faults.margins", description=__doc__)
    p.add_argument("--seeds", type=int, default=20, help="batches (seeds 0..N-1 of the preflight stream)")
    p.add_argument("--model", default="data/models/base.pt")
    p.add_argument("--kl-coef", type=float, default=0.1)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--json", help="also write the measured values and the summary here")
    p.add_argument("--from-json", help="summarize values measured before (a --json file) against today's thresholds")
    args = p.parse_args(argv)
    if args.from_json:
        from agentrl.core.artifacts import read_json
        summary = summarize(read_json(args.from_json)["measured"])
        print(markdown(summary))
        return 0 if summary["matrix_held"] == summary["matrix_seeds"] else 1
    import torch
    torch.set_num_threads(args.threads)
    from agentrl.backends.registry import load_checkpoint
    from agentrl.core.config import RLConfig
    from agentrl.env.gym.tokenizer import build_tokenizer
    from agentrl.env.tasks import make_tasks
    tok = build_tokenizer(make_tasks("all"))
    model = load_checkpoint("tinyagent", args.model, tok)[0]
    measured = measure(model, tok, make_tasks("train"), RLConfig(kl_coef=args.kl_coef), list(range(args.seeds)),
                       list(FAULTS), progress=lambda m: print(m, file=sys.stderr, flush=True))
    summary = summarize(measured)
    if args.json:
        from agentrl.core.artifacts import write_json
        write_json(args.json, {"measured": measured, "summary": summary})
    print(markdown(summary))
    return 0 if summary["matrix_held"] == summary["matrix_seeds"] else 1


if __name__ == "__main__":
    sys.exit(main())
