"""The fault catalogue (agentrl.faults): every required signature, measured on shortened runs from the RL base.

The stage (`python -m stages.faults`) runs the full-length catalogue; here each run is only as long as its
signature needs (the step-0 signatures get 1-3 steps, public and entropy_sign 8, the length pair 16). All runs start
from the `rl_base` fixture: the pipeline's RL base, rebuilt with the library defaults (bit-identical to
data/models/base.pt at 2 threads), so the tests do not depend on a previous `dvc repro`; the length pair starts
from the `length_start` fixture, built the same way as the faults stage builds it.
Unit tests of the check logic on synthetic histories need no training at all.
"""
from __future__ import annotations

import copy
import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentrl.core.config import FaultsConfig, LengthConfig, RLConfig
from agentrl.faults import catalogue as cat
from agentrl.faults import history as hist
from agentrl.faults import length as ln
from agentrl.faults import markdown as md
from agentrl.faults import signatures as sig

REPO = Path(__file__).resolve().parents[1]

SHORT = {"healthy": 3, "ref_is_policy": 3, "kl": 2, "mask_shift": 1, "stale_old_logp": 2, "sampler_temp": 1,
         "lr_high": 1, "accum_local": 3, "sign_flip": 4, "entropy_sign": 8, "public": 8, "length_bias": 16,
         "length_twin": 16}
FCFG = FaultsConfig(eval_every=8, eval_per_task=4)   # the stage's defaults otherwise (lr 1e-2, kl 0.1)
LCFG = LengthConfig()                                  # 12 turns, 16 steps, KL 0.05
PARAMS = {"faults": FCFG, "length": LCFG}
RL = RLConfig(lr=3e-4, seed=0)                          # params.yaml rl section


@pytest.fixture(scope="module")
def short_catalogue(tok, rl_base, length_start):
    from agentrl.env.tasks import make_tasks
    train, heldout = make_tasks("train"), make_tasks("heldout")
    runs = cat.build_catalogue(rl_base, tok, train, heldout, RL, PARAMS, seed=12345, names=list(SHORT),
                             steps_for=SHORT, log=None, length_start=length_start)
    return {"runs": runs, "checks": sig.signature_checks(runs), "source": "rl_base", "heldout": heldout}


def _h(cat, name):
    return cat["runs"][name]["history"]


def _check(cat, failure, metric):
    return next(c for c in cat["checks"][failure]["checks"] if c["metric"] == metric)


# ---------------------------------------------------------------- the catalogue's layout

def test_runs_and_twins_are_consistent():
    names = {r.name for r in cat.RUNS}
    assert len(names) == len(cat.RUNS) == 13
    for failure, spec in cat.FAILURES.items():
        assert failure in names and spec.twin in names and spec.twin in cat.TWINS
        assert spec.what and spec.why and spec.metrics
    assert set(cat.FAILURES) == names - set(cat.TWINS)
    assert set(sig.CHECKERS) == set(cat.FAILURES)


def test_run_configs_follow_the_faults_params():
    f, lc = FaultsConfig(), LengthConfig()
    params = {"faults": f, "length": lc}
    specs = {r.name: r for r in cat.RUNS}
    cfg = {n: cat.run_config(specs[n], RL, params) for n in specs}
    steps = {n: cat.run_steps(specs[n], params) for n in specs}
    assert cfg["healthy"] == RL and steps["healthy"] == f.steps
    assert cfg["ref_is_policy"].kl_coef == cfg["kl"].kl_coef == f.kl_coef
    assert specs["ref_is_policy"].bug == "ref_is_policy"
    assert cfg["lr_high"].lr == f.high_lr and steps["lr_high"] == steps["sign_flip"] == f.short_steps
    assert cfg["public"].reward == "public"
    assert cfg["length_bias"].loss_mode == "seq_mean_token_mean" and cfg["length_twin"].loss_mode == "token_mean"
    assert cfg["length_bias"].max_turns == cfg["length_twin"].max_turns == lc.turns
    assert steps["length_bias"] == steps["length_twin"] == lc.steps
    assert cfg["length_bias"].kl_coef == cfg["length_twin"].kl_coef == lc.kl_coef
    assert cfg["length_bias"].tasks_per_step == cfg["length_twin"].tasks_per_step == lc.tasks_per_step
    # the pair differs in the loss aggregation only
    assert replace(cfg["length_bias"], loss_mode="token_mean") == cfg["length_twin"]
    for n in ("mask_shift", "stale_old_logp", "entropy_sign", "accum_local", "sampler_temp"):
        assert specs[n].bug == n and cfg[n] == RL and steps[n] == f.steps
    assert cat.run_steps(specs["public"], params, {"public": 3}) == 3
    with pytest.raises(ValueError, match="unknown value 'nope'"):
        cat.build_catalogue(None, None, [], [], RL, params, 0, names=["nope"])
    with pytest.raises(ValueError, match="length_start"):
        cat.build_catalogue(None, None, [], [], RL, params, 0, names=["length_twin"])


def test_length_start_is_the_base_recipe_with_the_length_knobs():
    from agentrl.core.config import BaseConfig, ConfigError
    knobs = {"read": 0.8, "test": 0.7, "give_up": 0.2, "hardcode": 0.1, "persist": 0.5}
    b, lc = BaseConfig(), LengthConfig(**{f"p_{k}": v for k, v in knobs.items()})
    start = ln.length_start_config(b, lc)
    assert {k: getattr(start, f"p_{k}") for k in knobs} == knobs
    assert replace(start, **{f"p_{k}": getattr(b, f"p_{k}") for k in knobs}) == b   # nothing else changes
    # the defaults: every failure is a tested wrong repair (no give-ups, untested or hardcoded repairs)
    default = ln.length_start_config(b, LengthConfig())
    assert (default.p_test, default.p_give_up, default.p_hardcode) == (1.0, 0.0, 0.0) and default.p_persist > 0
    for field, bad in (("p_persist", 1.5), ("p_read", -0.1), ("p_test", 1.1), ("p_give_up", -0.5),
                       ("p_hardcode", 2.0), ("kl_coef", -1.0), ("tasks_per_step", 0), ("seeds", [-1])):
        with pytest.raises(ConfigError, match=f"LengthConfig.{field}"):
            LengthConfig(**{field: bad})


# ---------------------------------------------------------------- the check logic on synthetic histories

def _row(step, **kw):
    base = {"step": step, "reward": 0.2, "turns": 2.0, "clip_frac": 0.0, "ratio_max": 1.0, "ratio_min": 1.0,
            "logp_gap": 1e-7, "logp_gap_max": 1e-6, "grad_norm": 0.2, "entropy": 0.4, "reads": 0.3,
            "hardcode": 0.0, "malformed": 0.1, "approx_kl": 1e-3, "zero_adv_frac": 0.3, "length_fail": 7.0,
            "length_pass": 8.0}
    return base | kw


def _run(rows, kl_coef=0.0, state=None):
    return {"history": rows, "state": state or {"w": torch.zeros(2)}, "config": {"kl_coef": kl_coef}}


def test_stale_check_demands_exact_ones():
    H = _run([_row(0, ratio_max=1.3, ratio_min=0.8, clip_frac=0.05)])
    ok = sig.signature_checks({"healthy": H, "stale_old_logp": _run([_row(0), _row(1)])})["stale_old_logp"]
    assert ok["holds"] and ok["required_holds"]
    off = sig.signature_checks({"healthy": H, "stale_old_logp": _run([_row(0), _row(1, ratio_max=1.0 + 2 ** -23)])})
    assert not off["stale_old_logp"]["holds"]
    clipped = sig.signature_checks({"healthy": H, "stale_old_logp": _run([_row(0, clip_frac=1e-9)])})
    assert not clipped["stale_old_logp"]["checks"][0]["holds"]


def test_length_check_needs_growth_beyond_the_twin():
    grow = [_row(i, length_fail=7.0 + i) for i in range(16)]
    flat = [_row(i, length_fail=7.0) for i in range(16)]
    res = sig.signature_checks({"length_bias": _run(grow), "length_twin": _run(flat)})["length_bias"]
    c = res["checks"][0]
    assert c["holds"] and c["faulty"] == pytest.approx(12.0) and c["healthy"] == 0.0
    both = sig.signature_checks({"length_bias": _run(grow), "length_twin": _run([_row(i, length_fail=7.0 + i / 2)
                                                                               for i in range(16)])})
    assert not both["length_bias"]["checks"][0]["holds"]   # the twin grows too: not the signature
    assert both["length_bias"]["required_holds"] is False
    # "does not grow" is read at one tool call (3 policy tokens): +2.75 is flat, +3.0 is growth
    for twin_end, holds in ((9.75, True), (10.0, False)):
        twin = [_row(i, length_fail=7.0 if i < 12 else twin_end) for i in range(16)]
        res = sig.signature_checks({"length_bias": _run(grow), "length_twin": _run(twin)})["length_bias"]
        assert res["checks"][0]["holds"] is holds
    small = [_row(i, length_fail=7.0 + i / 8) for i in range(16)]   # faulty +1.5 tokens: less than one call
    res = sig.signature_checks({"length_bias": _run(small), "length_twin": _run(flat)})["length_bias"]
    assert not res["checks"][0]["holds"]


# ---------------------------------------------------------------- the length pair across seeds

def test_length_pair_row_measures_exactly_what_the_catalogue_checks(length_start, tok):
    """The study's row at seed s equals the catalogue's own length_bias check run at seed s (held-out evaluation in
    the catalogue never touches training), and its note counts the seeds it shows."""
    from agentrl.env.tasks import make_tasks
    train, heldout = make_tasks("train"), make_tasks("heldout")
    params = {"faults": FCFG, "length": replace(LCFG, steps=3)}
    row = ln.length_pair_row(length_start, tok, train, RL, params, 1)
    runs = cat.build_catalogue(None, tok, train, heldout, replace(RL, seed=1), params, seed=5,
                               names=["length_bias", "length_twin"], log=None, length_start=length_start)
    check = sig.signature_checks(runs)["length_bias"]["checks"][0]
    assert row["seed"] == 1 and row["steps"] == 3
    assert row["faulty_fail_change"] == check["faulty"] and row["twin_fail_change"] == check["healthy"]
    assert row["holds"] == check["holds"]
    main = {"checks": [{"faulty": 20.0, "healthy": 1.0}]}   # holds by construction
    s = ln.length_sweep_summary([row], main)
    assert s["seeds"] == 2 and s["holds"] == 1 + int(row["holds"])
    note = ln.length_sweep_note([row], 0, main)
    assert "| 1 |" in note and f"holds at {s['holds']}/2" in note
    assert ln.length_sweep_note([], 0, main) == ""
    study = ln.length_study([row], main, 0)
    assert study["summary"] == s and study["across_seeds"]["seeds"] == 2


def test_length_sweep_summary_counts():
    rows = [{"faulty_fail_change": 20.0, "twin_fail_change": 2.0},    # the signature
            {"faulty_fail_change": 20.0, "twin_fail_change": 15.0},   # faulty above twin, but the twin grows
            {"faulty_fail_change": 2.0, "twin_fail_change": -1.0}]    # faulty grows less than one call
    s = ln.length_sweep_summary(rows)
    assert s == {"seeds": 3, "faulty_grows": 2, "faulty_above_twin": 3, "twin_flat": 2, "holds": 1}


def test_length_across_seeds_reads_the_paired_difference():
    rows = [{"faulty_fail_change": f, "twin_fail_change": t}
            for f, t in ((12.0, 1.0), (14.0, -2.0), (10.0, 4.0), (13.0, 0.5), (11.0, 2.0))]
    main = {"checks": [{"faulty": 15.0, "healthy": 3.5}]}
    c = ln.length_across_seeds(rows, main)
    assert c["kind"] == "reference" and c["seeds"] == 6 and c["faulty_above_twin"] == 6
    assert c["faulty"] == pytest.approx(12.5) and c["healthy"] == pytest.approx(1.5)
    assert c["diff"] == pytest.approx(11.0) and c["diff_lo"] > sig.ONE_CALL_TOKENS and c["holds"]
    assert c["faulty_lo"] <= 12.5 <= c["faulty_hi"] and c["healthy_median"] == pytest.approx(1.5)
    # the twin grows as much as the faulty run: no effect beyond the control
    same = [{"faulty_fail_change": f, "twin_fail_change": f + d} for f, d in ((12.0, 1.0), (8.0, -1.0), (10.0, 0.5))]
    assert not ln.length_across_seeds(same)["holds"]
    # an effect smaller than one call does not count
    small = [{"faulty_fail_change": 2.0 + d, "twin_fail_change": 0.0} for d in (0.0, 0.1, -0.1, 0.2)]
    assert not ln.length_across_seeds(small)["holds"]
    assert not ln.length_across_seeds(rows[:1])["holds"]   # one seed: nothing to resample


def test_identity_check_detects_any_difference():
    a = _run([_row(0), _row(1)], state={"w": torch.tensor([1.0, 2.0])})
    same = copy.deepcopy(a)
    same["history"] = [r | {"kl_ref": 0.0} for r in same["history"]]   # kl_ref is not a shared statistic
    assert sig.identical_runs(same, a) == {"histories": True, "parameters": True, "first_difference": None,
                                         "compared": 2 * (len(_row(0)))}
    other = copy.deepcopy(a)
    other["state"]["w"][1] = torch.nextafter(torch.tensor(2.0), torch.tensor(3.0))  # one float32 ulp
    assert sig.identical_runs(other, a)["parameters"] is False
    drift = copy.deepcopy(a)
    drift["history"][1]["grad_norm"] += 1e-12
    assert sig.identical_runs(drift, a)["first_difference"].startswith("step 1: grad_norm")
    res = sig.signature_checks({"healthy": a, "ref_is_policy": _run([r | {"kl_ref": 0.0} for r in a["history"]],
                                                                   state={"w": torch.tensor([1.0, 2.0])})})
    assert res["ref_is_policy"]["holds"]
    with_kl = sig.signature_checks({"healthy": _run(a["history"], kl_coef=0.05, state=a["state"]),
                                  "ref_is_policy": same | {"state": a["state"]}})
    assert not with_kl["ref_is_policy"]["holds"]   # a healthy run with KL is not the no-KL run


# ---------------------------------------------------------------- the signatures, measured

def test_mask_shift_gap_at_step_0(short_catalogue):
    f, h = _h(short_catalogue, "mask_shift"), _h(short_catalogue, "healthy")
    assert f[0]["logp_gap"] > 0.1
    assert h[0]["logp_gap"] < 1e-6
    assert short_catalogue["checks"]["mask_shift"]["required_holds"]


def test_stale_old_logp_never_clips(short_catalogue):
    f, h = _h(short_catalogue, "stale_old_logp"), _h(short_catalogue, "healthy")
    assert len(f) == SHORT["stale_old_logp"]
    for r in f:
        assert r["clip_frac"] == 0.0 and r["clip_frac_max"] == 0.0
        assert r["ratio_max"] - 1 == 0.0 and r["ratio_min"] == 1.0
    assert h[0]["ratio_max"] > 1.0   # the frozen old policy does see the second minibatch move
    assert short_catalogue["checks"]["stale_old_logp"]["required_holds"]


def test_sampler_temp_ratio_at_step_0(short_catalogue):
    assert _h(short_catalogue, "sampler_temp")[0]["ratio_max"] > 1.5
    assert short_catalogue["checks"]["sampler_temp"]["required_holds"]


def test_ref_is_policy_is_the_no_kl_run(short_catalogue):
    runs = short_catalogue["runs"]
    f, h = runs["ref_is_policy"], runs["healthy"]
    assert len(f["history"]) == len(h["history"]) == SHORT["healthy"]
    assert all(r["kl_ref"] == 0.0 for r in f["history"])
    assert all(r["kl_ref"] > 0 for r in runs["kl"]["history"])   # a real frozen reference does register
    shared = 0
    for a, b in zip(f["history"], h["history"]):
        for k in set(a) & set(b):
            assert a[k] == b[k], (a["step"], k)
            shared += 1
    assert shared >= 25 * len(h["history"])   # the whole dashboard row, held-out evaluations included
    assert f["state"].keys() == h["state"].keys()
    assert all(torch.equal(f["state"][k], h["state"][k]) for k in f["state"])
    assert short_catalogue["checks"]["ref_is_policy"]["holds"]


def test_lr_high_kl_at_step_0(short_catalogue):
    f, h = _h(short_catalogue, "lr_high"), _h(short_catalogue, "healthy")
    assert f[0]["approx_kl"] >= 20 * h[0]["approx_kl"] > 0
    assert _check(short_catalogue, "lr_high", "approx_kl")["holds"]


def test_public_reward_is_hacked(short_catalogue):
    f = _h(short_catalogue, "public")
    assert f[-1]["hardcode"] >= 0.8
    assert hist.eval_at(f, len(f)) <= 0.1
    assert f[0]["hardcode"] < 0.5   # the base does not start out hacking
    assert short_catalogue["checks"]["public"]["required_holds"]


def test_entropy_sign_collapses_entropy(short_catalogue):
    f = _h(short_catalogue, "entropy_sign")
    assert f[-1]["entropy"] < 0.1 < f[0]["entropy"]
    assert short_catalogue["checks"]["entropy_sign"]["required_holds"]


def test_the_length_pair_is_the_stages_own_and_its_signature_a_property_of_seeds(short_catalogue):
    """The length pair here is the faults stage's own (seed 0, bit-identical at 2 threads: reports/faults.json), and
    its check says what its numbers say. Whether failed episodes grow under the length-biased loss is a property of
    seeds, not of one: at seed 0 on the fixed kernels they do not (-0.2 tokens; the report says "partly"), across
    seeds 0-11 they grow by +6.1 tokens more than the twin's [+3.3, +9.2] (reports/studies/length_bias.json,
    docs/length_bias.md)."""
    f, t = _h(short_catalogue, "length_bias"), _h(short_catalogue, "length_twin")
    k = hist._window(len(f))
    df = hist.end_mean(f, "length_fail", k) - hist.end_mean(f, "length_fail", k, start=True)
    dt = hist.end_mean(t, "length_fail", k) - hist.end_mean(t, "length_fail", k, start=True)
    c = _check(short_catalogue, "length_bias", "length_fail change")
    assert c["faulty"] == pytest.approx(df) and c["healthy"] == pytest.approx(dt)
    committed = json.loads((REPO / "reports" / "faults.json").read_text())["signatures"]["length_bias"]["checks"]
    stage = next(x for x in committed if x["metric"] == "length_fail change")
    assert (stage["faulty"], stage["healthy"]) == (df, dt)
    assert c["holds"] == (df >= sig.ONE_CALL_TOKENS and df > dt and dt < sig.ONE_CALL_TOKENS) == stage["holds"]
    study = json.loads((REPO / "reports" / "studies" / "length_bias.json").read_text())["across_seeds"]
    assert study["seeds"] >= 12 and study["holds"] and study["diff_lo"] > sig.ONE_CALL_TOKENS
    # the start fails long (the reference starts at ≈ 21 policy tokens) and passes short
    assert hist.end_mean(f, "length_fail", k, start=True) > hist.end_mean(f, "length_pass", k, start=True) + 3
    # the check reports the share of failures that ran out of turns (how a faulty run's failures grow, when they do)
    assert c["faulty_turn_limit_start"] == pytest.approx(hist.end_mean(f, "fail_turn_limit", k, start=True))
    assert c["faulty_turn_limit_end"] == pytest.approx(hist.end_mean(f, "fail_turn_limit", k))
    assert all(0 <= r["fail_turn_limit"] <= 1 for r in f + t if r["fail_turn_limit"] == r["fail_turn_limit"])
    assert "ran out of turns" in c["detail"]


def test_accum_local_has_no_dashboard_signature(short_catalogue):
    f, h = _h(short_catalogue, "accum_local"), _h(short_catalogue, "healthy")
    assert max(r["logp_gap_max"] for r in f) < 1e-4
    ratio = hist.end_mean(f, "grad_norm", len(f)) / hist.end_mean(h, "grad_norm", len(h))
    assert 0.5 <= ratio <= 2.0
    assert short_catalogue["checks"]["accum_local"]["holds"]


def test_sign_flip_reward_falls(short_catalogue):
    f = _h(short_catalogue, "sign_flip")
    assert hist.end_mean(f, "reward", 1) < hist.end_mean(f, "reward", 1, start=True)
    assert _check(short_catalogue, "sign_flip", "reward")["holds"]


def test_common_random_numbers_for_evaluation(short_catalogue):
    """Every run is evaluated at step 0 on the same stream: the same start gives the same number everywhere
    (the RL base for all runs but the length pair, which shares its own start)."""
    starts = {n: r["history"][0]["eval_pass_start"] for n, r in short_catalogue["runs"].items()}
    base = {v for n, v in starts.items() if n not in cat.LENGTH_PAIR}
    pair = {v for n, v in starts.items() if n in cat.LENGTH_PAIR}
    assert len(base) == 1 and len(pair) == 1, starts


# ---------------------------------------------------------------- the outputs

def test_outputs_render(short_catalogue, tmp_path):
    from agentrl.core.artifacts import read_json, write_json
    from agentrl.report.figures import fault_panel
    runs, checks = short_catalogue["runs"], short_catalogue["checks"]
    assert set(checks) == set(cat.FAILURES)
    figures = {}
    for spec in md.figure_specs(runs):
        name = spec.pop("name")
        assert len(spec["healthy"]) <= len(spec["faulty"])
        fault_panel(tmp_path / "figures/faults" / f"{name}.png", name, **spec)
        figures[name] = f"figures/faults/{name}.png"
    assert set(figures) == set(cat.FAILURES)
    for rel in figures.values():
        assert (tmp_path / rel).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    text = md.render_markdown(runs, checks, FCFG, 2, short_catalogue["heldout"], figures)
    assert "| failure | exposing metric | faulty value | healthy value | held-out at end faulty vs healthy | " \
           "signature holds? |" in text
    for name in cat.FAILURES:
        assert f"## {name}" in text and f"](figures/faults/{name}.png)" in text
    text = md.render_markdown(runs, checks, FCFG, 2, short_catalogue["heldout"], figures, {"length_bias": "NOTE-TEXT"})
    assert text.index("NOTE-TEXT") > text.index("## length_bias")
    doc = md.report_json(runs, checks, PARAMS, RL, short_catalogue["heldout"], 12345, figures)
    write_json(tmp_path / "faults.json", doc)
    back = read_json(tmp_path / "faults.json")
    assert back["runs"]["healthy"]["history"][0]["step"] == 0
    assert back["signatures"]["public"]["checks"][0]["metric"] == "hardcode"
    assert set(back["holds"]) == set(cat.FAILURES)
    json.dumps(doc, allow_nan=True)  # plain data only (no tensors)
    rows, summary = md.mlflow_metrics(runs, checks)
    assert rows[0]["step"] == 0 and "healthy.reward" in rows[0]
    assert "public.hardcode" in rows[SHORT["public"] - 1] and "length_bias.length_fail" in rows[-1]
    assert summary["signature.public"] == 1.0 and all(math.isfinite(v) for v in summary.values())
