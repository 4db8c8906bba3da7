"""The length-bias pair and its robustness study (docs/length_bias.md).

The catalogue's length pair (seq_mean_token_mean vs its token_mean twin, 12 turns) starts from its own base: the
RL base's recipe with the mixture knobs length.p_* (`length_start_config`, stage length_start). How much of its
signature is the seed's is a study outside the default pipeline: the stage length_pair (a matrix over
length.seeds, empty by default) runs the pair at each seed (`length_pair_row`), and `python -m agentrl study
length-bias` reads those rows with the catalogue's own pair (`length_study`).
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import replace

from agentrl.core.config import LENGTH_START_KNOBS, RLConfig
from agentrl.env.gym.spec import GYM
from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff
from agentrl.faults.catalogue import LENGTH_PAIR, SPECS, run_config, run_steps
from agentrl.faults.history import _delta, _fmt, _num, _signed, _window, end_mean
from agentrl.faults.signatures import ONE_CALL_TOKENS, _check, length_signature
from agentrl.rl.trainer import train


def length_start_config(base_cfg, lcfg):
    """The BaseConfig of the length pair's start: the RL base's recipe with the mixture knobs p_read, p_test,
    p_give_up, p_hardcode and p_persist taken from length.p_*. The defaults read and test every repair and never
    give up or hardcode, so every failure is a tested wrong repair that then either submits or keeps calling
    tools (p_persist per turn): short and long failures both start common, and no kind of short failure is one
    that learning removes by itself. Built by make_rl_base with the base stage's seed."""
    return replace(base_cfg, **{f"p_{k}": getattr(lcfg, f"p_{k}") for k in LENGTH_START_KNOBS})


def length_pair_row(length_start, tok, train_tasks: list, base_cfg: RLConfig, params: dict, seed: int,
                    hooks_for=lambda cfg: ()) -> dict:
    """The length pair (length_bias and its twin from copies of `length_start`, training only) at `seed`: the
    failed- and passed-episode length changes of both runs and whether the signature holds, measured exactly as
    the catalogue's own check does."""
    hist = {}
    for name in LENGTH_PAIR:
        cfg = replace(run_config(SPECS[name], base_cfg, params), seed=int(seed))
        hist[name] = train(copy.deepcopy(length_start), train_tasks, tok, cfg, run_steps(SPECS[name], params),
                           env=GYM.make(cfg), hooks=hooks_for(cfg))
    f, t = hist["length_bias"], hist["length_twin"]
    k = _window(min(len(f), len(t)))
    row = {"seed": int(seed), "window": k, "steps": len(f)}
    for side, h in (("faulty", f), ("twin", t)):
        for key in ("length_fail", "length_pass"):
            short = key.split("_")[1]
            row[f"{side}_{short}_start"] = end_mean(h, key, k, start=True)
            row[f"{side}_{short}_end"] = end_mean(h, key, k)
            row[f"{side}_{short}_change"] = _delta(h, key, k)
        row[f"{side}_reward_end"] = end_mean(h, "reward", k)
    row["holds"] = length_signature(row["faulty_fail_change"], row["twin_fail_change"])
    return row


def _length_pairs(rows: list[dict], main: dict | None = None) -> list[tuple]:
    """(faulty, twin) failed-episode length changes per seed: the sweep's rows, then the catalogue's own
    length_bias result if given."""
    pairs = [(r["faulty_fail_change"], r["twin_fail_change"]) for r in rows]
    if main is not None:
        c = main["checks"][0]
        pairs.append((c["faulty"], c["healthy"]))
    return pairs


def length_sweep_summary(rows: list[dict], main: dict | None = None) -> dict:
    """Counts over the sweep's seeds, plus (if given) the catalogue's own length_bias check as one more seed."""
    pairs = _length_pairs(rows, main)
    ok = [(df, dt) for df, dt in pairs if _num(df, dt)]
    return {"seeds": len(pairs),
            "faulty_grows": sum(df >= ONE_CALL_TOKENS for df, _ in ok),
            "faulty_above_twin": sum(df > dt for df, dt in ok),
            "twin_flat": sum(dt < ONE_CALL_TOKENS for _, dt in ok),
            "holds": sum(length_signature(df, dt) for df, dt in ok)}


def length_sweep_note(rows: list[dict], main_seed: int, main: dict | None = None) -> str:
    """Markdown for the length_bias section: the pair at further seeds, and the counts including the main seed."""
    if not rows:
        return ""
    s = length_sweep_summary(rows, main)
    n = s["seeds"]
    L = [f"**Across seeds.** The same pair at seeds {', '.join(str(r['seed']) for r in rows)} (training only; "
         f"the catalogue's own runs use seed {main_seed}). Over all {n} seeds the faulty run's failed episodes grow "
         f"by at least one call at {s['faulty_grows']}/{n} and more than the twin's at {s['faulty_above_twin']}/{n}; "
         f"the twin's stay within one call at {s['twin_flat']}/{n}; the whole signature holds at {s['holds']}/{n}.",
         "", "| seed | length_fail, faulty | length_fail, twin | length_pass change, faulty / twin | "
         "train reward at the end, faulty / twin | signature holds |", "|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['seed']} | {_fmt(r['faulty_fail_start'])} → {_fmt(r['faulty_fail_end'])} "
                 f"({_signed(r['faulty_fail_change'])}) | {_fmt(r['twin_fail_start'])} → {_fmt(r['twin_fail_end'])} "
                 f"({_signed(r['twin_fail_change'])}) | {_signed(r['faulty_pass_change'])} / "
                 f"{_signed(r['twin_pass_change'])} | {_fmt(r['faulty_reward_end'])} / {_fmt(r['twin_reward_end'])} | "
                 f"{'yes' if r['holds'] else '**no**'} |")
    return "\n".join(L)


def length_across_seeds(rows: list[dict], main: dict | None = None, n_boot: int = 10000, alpha: float = 0.05) -> dict:
    """The length pair read over seeds (the sweep's rows plus, if given, the catalogue's own length_bias result):
    a reference check on the fault's effect beyond its control, the paired difference faulty - twin of the
    failed-episode length changes, whose percentile-bootstrap interval (seeds resampled) should lie above one
    call. Means, medians and intervals of both runs' changes ride along for the report."""
    ok = [(df, dt) for df, dt in _length_pairs(rows, main) if _num(df, dt)]
    n = len(ok)
    stat = f"mean over {n} seeds, {1 - alpha:.0%} CI with seeds resampled"
    crit = f"paired difference faulty - twin: CI above one call ({ONE_CALL_TOKENS:g} tokens)"
    if n < 2:
        return _check("length_fail change across seeds", stat, None, None, crit, False, "reference", seeds=n,
                      detail="needs the pair at two seeds or more (length.seeds)")
    faulty, twin = [df for df, _ in ok], [dt for _, dt in ok]
    diff, lo, hi = paired_bootstrap_diff(twin, faulty, n_boot=n_boot, alpha=alpha, seed=0)
    (mf, flo, fhi), (mt, tlo, thi) = (bootstrap_ci(v, n_boot=n_boot, alpha=alpha, seed=0) for v in (faulty, twin))
    above = sum(df > dt for df, dt in ok)
    detail = (f"over {n} seeds the faulty run's failed episodes grow by {_signed(mf)} tokens on average "
              f"[{_signed(flo)}, {_signed(fhi)}] (median {_signed(statistics.median(faulty))}, smallest "
              f"{_signed(min(faulty))}), the twin's by {_signed(mt)} [{_signed(tlo)}, {_signed(thi)}] (median "
              f"{_signed(statistics.median(twin))}, largest {_signed(max(twin))}); the difference is "
              f"{_signed(diff)} [{_signed(lo)}, {_signed(hi)}], and the faulty run's grow more at "
              f"{above}/{n} seeds")
    return _check("length_fail change across seeds", stat, mf, mt, crit, lo > ONE_CALL_TOKENS, "reference",
                  seeds=n, diff=diff, diff_lo=lo, diff_hi=hi, faulty_lo=flo, faulty_hi=fhi,
                  faulty_median=statistics.median(faulty), healthy_lo=tlo, healthy_hi=thi,
                  healthy_median=statistics.median(twin), faulty_above_twin=above,
                  detail=detail)


def length_study(rows: list[dict], main: dict | None = None, main_seed: int | None = None) -> dict:
    """The study's summary: per-seed rows, counts, and the across-seeds check (the catalogue's own pair, if
    given, counts as one more seed)."""
    return {"rows": rows, "main_seed": main_seed, "summary": length_sweep_summary(rows, main),
            "across_seeds": length_across_seeds(rows, main)}
