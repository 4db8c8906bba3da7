"""Issue #19 beyond the knobs: ablation arms defined in params.yaml (today's four keep their meaning; a bad arm is one
line naming the arm and the field, before any compute), the stopping rules select reports, and the research
studies' statistics."""
from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from agentrl.core.config import ARMS, AblateConfig, ParamsError, RLConfig, SelectConfig, arm_overrides, load_params
from agentrl.eval.ablation import arm_config
from agentrl.eval.stopping import patience_stop, rule_outcome, stopping_report, zero_adv_stop
from agentrl.pipeline.stage import read_keys
from agentrl.studies import summary as rs

REPO = Path(__file__).resolve().parents[1]


# ---------------------------------------------------------------- arms in params

def test_todays_arms_keep_their_meaning():
    assert ARMS == AblateConfig().arms == yaml.safe_load((REPO / "params.yaml").read_text())["ablate"]["arms"]
    rl, acfg = RLConfig(), AblateConfig()
    # the arms as the code defined them before (kl: ablate.kl_coef 0.05 and ablate.kl_kind k3)
    before = {"default": ({}, "base"), "kl": ({"kl_coef": 0.05, "kl_kind": "k3"}, "base"), "sft": ({}, "sft"),
              "public": ({"reward": "public"}, "base")}
    for arm, (changes, start) in before.items():
        assert arm_config(arm, rl, acfg, 2) == (replace(rl, seed=2, **changes), start), arm


def test_a_new_arm_needs_no_code():
    acfg = AblateConfig(arms={**ARMS, "clip_higher": {"rl.clip_eps_high": 0.28}})
    cfg, start = arm_config("clip_higher", RLConfig(), acfg, 0)
    assert cfg.clip_range == (0.2, 0.28) and start == "base"


BAD_ARMS = [
    ({"rl.clip_eps_hi": 0.28}, ["ablate.arms: x: rl.clip_eps_hi: unknown key", "clip_eps_high"]),
    ({"lr": 0.1}, ["ablate.arms: x: lr: unknown key", "rl.<key>"]),
    ({"rl.seed": 3}, ["ablate.arms: x: rl.seed: unknown key"]),
    ({"rl.kl_kind": "k9"}, ["ablate.arms: x: rl.kl_kind: unknown value 'k9'", "k1, k2, k3"]),
    ({"rl.lr": float("inf")}, ["ablate.arms: x: rl.lr:", "finite"]),
    ({"rl.lr": -1}, ["ablate.arms: x: rl.lr:"]),
    ({"start": "length_start"}, ["ablate.arms: x: start: unknown value 'length_start'", "base, sft"]),
    ([1, 2], ["ablate.arms: x: expected a mapping"]),
]


@pytest.mark.parametrize("spec,needles", BAD_ARMS, ids=[str(s) for s, _ in BAD_ARMS])
def test_a_bad_arm_is_one_line_naming_the_arm_and_the_field(tmp_path, monkeypatch, spec, needles):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["ablate"]["arms"]["x"] = spec
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParamsError) as err:
        load_params(["ablate"])
    msg = str(err.value)
    assert "\n" not in msg and msg.startswith("params.yaml: ") and all(n in msg for n in needles), msg


def test_arm_names_must_name_dvc_stages():
    with pytest.raises(ValueError, match="letters, digits and _"):
        arm_overrides("clip-higher", {})


@pytest.mark.slow   # the stage script in a subprocess (its torch and MLflow imports)
def test_a_bad_ablate_arm_stops_the_stage_before_any_compute(tmp_path):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["ablate"]["arms"]["x"] = {"rl.clip_ratio_c": 0.5}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {str(REPO)!r}); "
                          "import stages.ablate as a; a.main('x', 0)"], cwd=tmp_path, capture_output=True, text=True,
                         timeout=120)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and "ablate.arms: x: rl.clip_ratio_c:" in lines[0], out.stderr
    assert not (tmp_path / "reports").exists() and not (tmp_path / "data").exists()


def test_an_instance_reads_only_its_own_arm():
    values = AblateConfig().to_dict()
    assert read_keys(values, ["steps", "arms.kl"]) == {"steps": 30, "arms": {"kl": ARMS["kl"]}}


# ---------------------------------------------------------------- stopping rules

def _ck(step, rate, hi, per=None):
    return {"step": step, "pass_rate": rate, "ci_lo": rate - 0.1, "ci_hi": hi,
            "per_task": per or {"a": {"n": 10, "c": round(rate * 10)}, "b": {"n": 10, "c": round(rate * 10)}}}


ROWS = [_ck(0, 0.1, 0.3), _ck(10, 0.5, 0.7), _ck(20, 0.6, 0.8), _ck(30, 0.9, 1.0), _ck(40, 0.8, 1.0),
        _ck(50, 0.9, 1.0), _ck(60, 1.0, 1.0)]


def test_patience_rule():
    # beats the previous interval at 10 (0.5 > 0.3) and 30 (0.9 > 0.8); not at 20, 40, 50, 60
    assert patience_stop(ROWS, 1) == 20
    assert patience_stop(ROWS, 2) == 50
    assert patience_stop(ROWS, 4) is None


def test_zero_adv_rule_is_checked_at_checkpoints():
    history = [{"step": s, "zero_adv_frac": 0.9 if 34 <= s < 39 or s >= 45 else 0.2} for s in range(60)]
    assert zero_adv_stop(ROWS, history, 0.75, 5) == 50      # steps 34-38 end between checkpoints; 45-49 end at 50
    assert zero_adv_stop(ROWS, history, 0.95, 5) is None


def test_rule_outcome_costs():
    chosen = {"step": 60, "pass_rate": 1.0}
    out = rule_outcome(ROWS, 30, chosen, 200, 0.05, 0)
    assert out["steps_saved"] == 30 and out["chosen_step"] == 30 and out["chosen_validation"] == 0.9
    assert out["validation_cost"]["mean"] == pytest.approx(0.1)
    never = rule_outcome(ROWS, None, chosen, 200, 0.05, 0)
    assert never["steps_saved"] == 0 and never["chosen_step"] == 60 and never["validation_cost"]["mean"] == 0


def test_rules_off_report_nothing():
    assert stopping_report(ROWS, [], {"step": 60}, SelectConfig(), {}) == {}
    both = stopping_report(ROWS, [{"step": s, "zero_adv_frac": 1.0} for s in range(60)], {"step": 60},
                           SelectConfig(stop_patience=2, stop_zero_adv_steps=10), {"patience": 1, "zero_adv": 2})
    assert both["patience"]["stop_step"] == 50 and both["zero_adv"]["stop_step"] == 10


# ---------------------------------------------------------------- research statistics

def _run(pass_rates: dict, start: dict, rollouts: int, steps: int = 3, entropy=0.5) -> dict:
    per = {t: {"n": 10, "c": round(p * 10)} for t, p in pass_rates.items()}
    begin = {t: {"n": 10, "c": round(p * 10)} for t, p in start.items()}
    history = [{"step": s, "rollouts": rollouts // steps, "trained": rollouts // steps, "entropy": entropy - 0.1 * s,
                "zero_adv_frac": 0.25 * s} for s in range(steps)]
    mean = lambda d: sum(d.values()) / len(d)
    return {"history": history, "per_task": per, "heldout_pass": mean(pass_rates), "start_per_task": begin,
            "start_pass": mean(start)}


def test_research_statistics():
    start = {"minmax/a": 0.0, "range/b": 0.0}
    runs = {("default", 0): _run({"minmax/a": 0.5, "range/b": 0.5}, start, 3000),
            ("default", 1): _run({"minmax/a": 0.7, "range/b": 0.3}, start, 3000),
            ("arm", 0): _run({"minmax/a": 0.8, "range/b": 0.6}, start, 6000),
            ("arm", 1): _run({"minmax/a": 0.6, "range/b": 0.8}, start, 6000)}
    m = rs.run_metrics(runs[("arm", 0)])
    assert m["rollouts"] == 6000 and m["gain_per_1k"] == pytest.approx(0.7 / 6)
    assert m["unsolved"] == [] and rs.run_metrics(runs[("default", 1)])["unsolved"] == ["range"]
    assert m["entropy"] == {} and rs.entropy_at(runs[("arm", 0)]["history"], 10) == pytest.approx(0.3)
    held = rs.compare_arms(runs, ["default", "arm"], [0, 1], rs.heldout_value, 500, 0.05, 0, "heldout")
    assert held["arm"]["mean"] == pytest.approx(0.7) and held["default"]["mean"] == pytest.approx(0.5)
    d = held["arm"]["diff_vs_default"]
    assert d["mean"] == pytest.approx(0.2) and d["seeds_needed"] is None   # both arms' seed SD is 0
    gain = rs.compare_arms(runs, ["default", "arm"], [0, 1], rs.gain_per_1k_value, 500, 0.05, 0, "gain")
    assert gain["default"]["mean"] == pytest.approx(0.5 / 3) and gain["arm"]["mean"] == pytest.approx(0.7 / 6)
    p = rs.power_statement([0.5, 0.7], [0.6, 0.9], 0.15)
    assert p["seeds_needed"] > 2 and 0 < p["power_now"] < 0.8


def test_research_cli_rejects_bad_arguments_in_one_line():
    out = subprocess.run([sys.executable, "-m", "agentrl", "research", "nope"], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert out.returncode == 2 and len(out.stderr.strip().splitlines()) == 1
    out = subprocess.run([sys.executable, "-m", "agentrl", "research", "stopping", "--seeds", "a"], cwd=REPO,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 2 and "--seeds" in out.stderr and len(out.stderr.strip().splitlines()) == 1
