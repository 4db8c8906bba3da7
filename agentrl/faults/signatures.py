"""The measured signatures of the fault catalogue: per failure, checks of the metric that exposes it against its
healthy twin.

A check is {"metric", "statistic", "faulty", "healthy", "criterion", "holds", "kind", ...}. kind "required": the
signatures the catalogue must show (asserted in tests/test_faults.py); kind "reference": the debugging chapter's
reference mechanism, measured on the full-length runs and reported honestly either way. "healthy" is the twin's value
over the same steps as the faulty run (the twin truncated to the faulty run's length).
"""
from __future__ import annotations

import torch

from agentrl.faults.catalogue import FAILURE_NAMES, FAILURES
from agentrl.faults.history import _all, _delta, _finite, _num, _window, at, end_mean, eval_at, series


def _check(metric: str, statistic: str, faulty, healthy, criterion: str, holds: bool, kind: str = "required",
           **extra) -> dict:
    return {"metric": metric, "statistic": statistic, "faulty": faulty, "healthy": healthy,
            "criterion": criterion, "holds": bool(holds), "kind": kind, **extra}




SHARED_SKIP = ("kl_ref", "spike_bundle")


def identical_runs(a: dict, b: dict) -> dict:
    """Exact comparison of two runs: every statistic the histories share (except kl_ref) and the final
    parameters (torch.equal). Returns {'histories': bool, 'parameters': bool, 'first_difference': str|None,
    'compared': number of values compared}."""
    ha, hb = a["history"], b["history"]
    first, compared = None, 0
    if len(ha) != len(hb):
        first = f"lengths differ ({len(ha)} vs {len(hb)} steps)"
    for ra, rb in zip(ha, hb):
        if first:
            break
        for k in sorted((set(ra) & set(rb)) - set(SHARED_SKIP)):
            x, y = ra[k], rb[k]
            compared += 1
            if not (x == y or (isinstance(x, float) and isinstance(y, float) and x != x and y != y)):
                first = f"step {ra['step']}: {k} {x!r} vs {y!r}"
                break
    sa, sb = a["state"], b["state"]
    params = set(sa) == set(sb) and all(torch.equal(sa[k], sb[k]) for k in sa)
    return {"histories": first is None, "parameters": bool(params), "first_difference": first, "compared": compared}



def _check_mask_shift(f, H, runs):
    return [_check("logp_gap", "step 0", at(f, "logp_gap"), at(H, "logp_gap"), "faulty > 0.1 and healthy < 1e-6",
                   _num(at(f, "logp_gap"), at(H, "logp_gap")) and at(f, "logp_gap") > 0.1 and at(H, "logp_gap") < 1e-6,
                   faulty_mean=end_mean(f, "logp_gap", len(f)), healthy_mean=end_mean(H, "logp_gap", len(H)))]


def _check_stale(f, H, runs):
    cf, rmax, rmin = series(f, "clip_frac"), series(f, "ratio_max"), series(f, "ratio_min")
    return [_check("clip_frac", "max over the run", max(cf, default=None), max(series(H, "clip_frac"), default=None),
                   "faulty == 0 on every step", _all(cf, lambda v: v == 0.0)),
            _check("ratio_max - 1", "max over the run", max(rmax) - 1 if rmax else None,
                   max(series(H, "ratio_max")) - 1 if H else None,
                   "faulty == 0 exactly on every step, and ratio_min == 1 exactly",
                   _all(rmax, lambda v: v == 1.0) and _all(rmin, lambda v: v == 1.0),
                   faulty_ratio_min=min(rmin, default=None),
                   healthy_ratio_min=min(series(H, "ratio_min"), default=None))]


def _check_sampler_temp(f, H, runs):
    k = _window(len(f))
    w = f"mean of last {k} steps"
    reads, zadv, gn = (end_mean(f, m, k) for m in ("reads", "zero_adv_frac", "grad_norm"))
    return [_check("ratio_max", "step 0", at(f, "ratio_max"), at(H, "ratio_max"), "faulty > 1.5",
                   _num(at(f, "ratio_max")) and at(f, "ratio_max") > 1.5),
            _check("reads", w, reads, end_mean(H, "reads", k), "reads vanish: faulty < 0.05",
                   _num(reads) and reads < 0.05, "reference", faulty_start=end_mean(f, "reads", k, start=True)),
            _check("zero_adv_frac", w, zadv, end_mean(H, "zero_adv_frac", k), "zero_adv_frac -> 1: faulty >= 0.9",
                   _num(zadv) and zadv >= 0.9, "reference", faulty_start=end_mean(f, "zero_adv_frac", k, start=True)),
            _check("grad_norm", w, gn, end_mean(H, "grad_norm", k), "grad_norm -> 0: faulty < 0.01",
                   _num(gn) and gn < 0.01, "reference", faulty_start=end_mean(f, "grad_norm", k, start=True))]


def _check_sign_flip(f, H, runs):
    k = _window(len(f))
    w = f"mean of last {k} steps"
    r0, r1 = end_mean(f, "reward", k, start=True), end_mean(f, "reward", k)
    t0, t1 = end_mean(f, "turns", k, start=True), end_mean(f, "turns", k)
    return [_check("reward", w, r1, end_mean(H, "reward", k), f"reward falls: last {k} < first {k}",
                   _num(r0, r1) and r1 < r0, "reference", faulty_start=r0),
            _check("turns", w, t1, end_mean(H, "turns", k), f"turns rise: last {k} > first {k}",
                   _num(t0, t1) and t1 > t0, "reference", faulty_start=t0)]


def _check_lr_high(f, H, runs):
    k = _window(len(f))
    w = f"mean of last {k} steps"
    a, b = at(f, "approx_kl"), at(H, "approx_kl")
    m, mh = end_mean(f, "malformed", k), end_mean(H, "malformed", k)
    r = end_mean(f, "reward", k)
    return [_check("approx_kl", "step 0", a, b, "faulty >= 20 x healthy", _num(a, b) and a >= 20 * b,
                   ratio=a / b if _num(a, b) and b > 0 else None),
            _check("malformed", w, m, mh, "malformed calls explode: faulty >= 1 per episode and >= 5 x healthy",
                   _num(m, mh) and m >= 1 and m >= 5 * mh, "reference",
                   faulty_start=end_mean(f, "malformed", k, start=True)),
            _check("reward", w, r, end_mean(H, "reward", k), "reward -> 0: faulty <= 0.05", _num(r) and r <= 0.05,
                   "reference", faulty_start=end_mean(f, "reward", k, start=True))]


def _check_accum_local(f, H, runs):
    gf, gh = end_mean(f, "grad_norm", len(f)), end_mean(H, "grad_norm", len(H))
    gap = max((v for v in series(f, "logp_gap_max") if _finite(v)), default=None)
    ratio = gf / gh if _num(gf, gh) and gh > 0 else None
    return [_check("grad_norm", "mean over the run", gf, gh,
                   "no signature: faulty within 0.5-2 x healthy, and logp_gap_max < 1e-4 on every step",
                   ratio is not None and 0.5 <= ratio <= 2.0 and gap is not None and gap < 1e-4, "reference",
                   ratio=ratio, faulty_logp_gap_max=gap)]


def _check_entropy_sign(f, H, runs):
    e, r = (f[-1]["entropy"], f[-1]["reads"]) if f else (None, None)
    return [_check("entropy", "last step", e, H[-1]["entropy"] if H else None, "faulty < 0.1", _num(e) and e < 0.1,
                   faulty_start=at(f, "entropy")),
            _check("reads", "last step", r, H[-1]["reads"] if H else None, "reads vanish: faulty < 0.05",
                   _num(r) and r < 0.05, "reference", faulty_start=at(f, "reads"))]


def _check_public(f, H, runs):
    n = len(f)
    hc, ev = (f[-1]["hardcode"] if f else None), eval_at(f, n)
    return [_check("hardcode", "last step", hc, H[-1]["hardcode"] if H else None, "faulty >= 0.8",
                   _num(hc) and hc >= 0.8, faulty_start=at(f, "hardcode")),
            _check("held-out hidden pass", f"evaluation after {n} updates", ev, eval_at(runs["healthy"]["history"], n),
                   "faulty <= 0.1", _num(ev) and ev <= 0.1, faulty_start=eval_at(f, 0))]


# "Grows" for a per-step length is read at the resolution of behaviour: one tool call (the shortest call,
# `<call> read </call>`, is 3 policy tokens). A twin whose failed episodes end less than one call longer has not
# grown (a flat but noisy series is above its start half the time, so "<= 0" would be a coin flip).
ONE_CALL_TOKENS = 3.0
LENGTH_CRITERION = (f"faulty grows by >= one call ({ONE_CALL_TOKENS:g} tokens) and more than twin; "
                    "twin < one call")


def length_signature(df, dt) -> bool:
    """The length-bias signature on the failed-episode length changes of the faulty run (df) and its twin (dt)."""
    return _num(df, dt) and df >= ONE_CALL_TOKENS and df > dt and dt < ONE_CALL_TOKENS


def _check_length_bias(f, t, runs):
    k = _window(min(len(f), len(t)))
    df, dt = _delta(f, "length_fail", k), _delta(t, "length_fail", k)
    dp, dpt = _delta(f, "length_pass", k), _delta(t, "length_pass", k)
    (fs, fe), (ts, te) = ((end_mean(h, "fail_turn_limit", k, start=True), end_mean(h, "fail_turn_limit", k))
                          for h in (f, t))
    pct = lambda v: f"{v:.0%}" if _finite(v) else "—"
    detail = (f"the share of failed episodes that ran out of turns (fail_turn_limit, same steps) went from "
              f"{pct(fs)} to {pct(fe)} in the faulty run and from {pct(ts)} to {pct(te)} in the twin; length_fail "
              f"mixes these long failures with short submitted ones, so it also moves with this share when no "
              f"failed episode gets longer")
    return [_check("length_fail change", f"mean of last {k} minus first {k} steps", df, dt, LENGTH_CRITERION,
                   length_signature(df, dt), detail=detail,
                   faulty_start=end_mean(f, "length_fail", k, start=True), faulty_end=end_mean(f, "length_fail", k),
                   healthy_start=end_mean(t, "length_fail", k, start=True), healthy_end=end_mean(t, "length_fail", k),
                   faulty_turn_limit_start=fs, faulty_turn_limit_end=fe,
                   healthy_turn_limit_start=ts, healthy_turn_limit_end=te),
            _check("length_pass change", f"mean of last {k} minus first {k} steps", dp, dpt,
                   "passed episodes stay short: faulty change < faulty length_fail change",
                   _num(dp, df) and dp < df, "reference",
                   faulty_start=end_mean(f, "length_pass", k, start=True), faulty_end=end_mean(f, "length_pass", k),
                   healthy_start=end_mean(t, "length_pass", k, start=True), healthy_end=end_mean(t, "length_pass", k))]


def _check_ref_is_policy(f, H, runs):
    kl = series(f, "kl_ref")
    twin = runs["kl"]["history"][:len(f)] if "kl" in runs else []
    checks = [_check("kl_ref", "max over the run", max(kl) if _all(kl, _finite) else None,
                     max(series(twin, "kl_ref"), default=None), "faulty == 0 exactly on every step",
                     _all(kl, lambda v: v == 0.0))]
    if runs["healthy"]["config"].get("kl_coef", 0.0) == 0.0:
        same = identical_runs(runs["ref_is_policy"], runs["healthy"])
        detail = same["first_difference"] or \
            f"{same['compared']} statistics equal; parameters equal: {same['parameters']}"
        checks.append(_check("bit-identical to the no-KL run", "every shared statistic and the final parameters",
                             same["histories"] and same["parameters"], True,
                             "histories exactly equal and torch.equal on every parameter",
                             same["histories"] and same["parameters"], detail=detail, compared=same["compared"],
                             parameters_equal=same["parameters"]))
    else:
        checks.append(_check("bit-identical to the no-KL run", "not measured", None, None,
                             "needs a healthy run without KL (rl.kl_coef = 0)", False,
                             detail="the healthy run has rl.kl_coef > 0, so it is not the no-KL run"))
    return checks


CHECKERS = {"mask_shift": _check_mask_shift, "stale_old_logp": _check_stale, "sampler_temp": _check_sampler_temp,
            "sign_flip": _check_sign_flip, "lr_high": _check_lr_high, "accum_local": _check_accum_local,
            "entropy_sign": _check_entropy_sign, "public": _check_public, "length_bias": _check_length_bias,
            "ref_is_policy": _check_ref_is_policy}


def signature_checks(runs: dict) -> dict:
    """Per failure present in `runs` together with its twin (and, except for length_bias, the healthy run):
    {"twin", "checks": [check...], "holds": all checks hold, "required_holds": all required checks hold}."""
    out = {}
    for name in FAILURE_NAMES:
        twin = FAILURES[name].twin
        needed = {name, twin} | ({"healthy"} if name != "length_bias" else set())
        if name == "ref_is_policy":
            needed = {name, "healthy"}  # the bit-identity reference; the kl twin is optional here
        if not needed <= set(runs):
            continue
        f = runs[name]["history"]
        ref = runs["length_twin" if name == "length_bias" else "healthy"]["history"][:len(f)]
        checks = CHECKERS[name](f, ref, runs)
        req = [c["holds"] for c in checks if c["kind"] == "required"]
        out[name] = {"twin": twin, "checks": checks, "holds": all(c["holds"] for c in checks),
                     "required_holds": all(req) if req else None}
    return out
