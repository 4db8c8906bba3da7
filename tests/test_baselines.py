"""Compute-matched baselines beside GRPO (agentrl.labs.baselines): the budget read from a lab's report, the arms
paired per task with the cold start and with GRPO, and both arms trained from a real kept cold start."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from agentrl.core.config import ConfigError
from agentrl.labs import baselines

REPO = Path(__file__).resolve().parents[1]


def counts(cs, n=4):
    return {f"f/t{i}": {"n": n, "c": c} for i, c in enumerate(cs)}


RECORD = {"before": {"per_task": counts([0, 1, 2, 4])}, "after": {"per_task": counts([2, 3, 4, 4])},
          "training": {"steps_updated": 16}, "rl": {"epochs": 1, "minibatches": 2}}
ARMS = {"seed": 0, "grpo_optimizer_steps": 32,
        "more_cloning": {"held_out": {"per_task": counts([0, 1, 2, 4])},
                         "training": {"steps": 32, "policy_tokens": 4096}},
        "rejection_sampling": {"held_out": {"per_task": counts([1, 2, 3, 4])},
                               "training": {"steps": 32, "policy_tokens": 2048, "sampled": 512, "passed": 300}}}


def test_grpos_budget_is_its_updated_steps_times_epochs_times_minibatches():
    assert baselines.grpo_optimizer_steps(RECORD) == 32
    assert baselines.grpo_optimizer_steps({**RECORD, "training": {"steps_updated": 5},
                                           "rl": {"epochs": 2, "minibatches": 3}}) == 30


def test_each_arm_is_paired_per_task_with_the_cold_start_and_with_grpo():
    s = baselines.summary(ARMS, RECORD, n_boot=2000)
    assert s["tasks"] == 4
    # more cloning changed no task's count: exactly 0, with a zero-width interval
    assert s["more_cloning"]["over_cold_start"] == {"mean": 0.0, "lo": 0.0, "hi": 0.0}
    # rejection sampling: +1 pass in 4 on three tasks of four -> +0.1875; GRPO the same again over it
    assert s["rejection_sampling"]["over_cold_start"]["mean"] == pytest.approx(0.1875)
    assert s["rejection_sampling"]["grpo_over_it"]["mean"] == pytest.approx(0.1875)
    assert s["more_cloning"]["grpo_over_it"]["mean"] == pytest.approx((0.5 + 0.5 + 0.5 + 0) / 4)
    assert s["pass"]["after"]["mean"] == pytest.approx(13 / 16)
    # pass@k from the same counts: a task with 1 pass in 4 has pass@2 = 1 - C(3,2)/C(4,2) = 0.5
    assert set(s["pass_at_k"]["before"]) == {"1", "2", "4"}
    assert s["pass_at_k"]["before"]["2"]["before"]["mean"] == pytest.approx((0 + 0.5 + (1 - 1 / 6) + 1) / 4)
    assert s["pass_at_k"]["rejection_sampling"]["4"]["rejection_sampling"]["mean"] == 1.0


def test_arms_on_other_tasks_than_the_report_are_refused():
    other = {**ARMS, "more_cloning": {**ARMS["more_cloning"], "held_out": {"per_task": counts([0, 1, 2])}}}
    with pytest.raises(ConfigError, match="held-out tasks differ"):
        baselines.summary(other, RECORD)


def test_an_unknown_arm_is_one_line_naming_the_allowed_ones():
    with pytest.raises(ConfigError, match=r"^labbaselines --arms: unknown value 'dpo'; allowed: more_cloning, "
                                          r"more_cloning_tokens, rejection_sampling, rejection_sampling_grpo_lr$"):
        baselines.check_arms(["rejection_sampling", "dpo"])


def test_the_arm_at_grpos_lr_is_labelled_with_its_lr():
    from agentrl.labs.report import interval
    at_lr = {**ARMS, "rejection_sampling_grpo_lr": {
        "held_out": {"per_task": counts([0, 2, 2, 4])},
        "training": {"steps": 32, "policy_tokens": 2048, "sampled": 512, "passed": 300, "lr": 1e-5}}}
    md = "\n".join(baselines.table(baselines.summary(at_lr, RECORD, n_boot=200), interval))
    assert "| rejection sampling at GRPO's lr (300 of 512 sampled episodes passed and were cloned at lr 1e-05) |" in md


def test_the_table_names_each_arm_its_steps_tokens_and_what_rejection_sampling_kept():
    from agentrl.labs.report import interval
    md = "\n".join(baselines.table(baselines.summary(ARMS, RECORD, n_boot=500), interval))
    for row in ("| the cold start |", "| more cloning |", "| rejection sampling |", "| GRPO |",
                "300 of 512 sampled episodes passed", "| 32 | 4,096 |", "pass@4"):
        assert row in md, row


@pytest.mark.slow
@pytest.mark.usefixtures("qwen3_tokenizer")
def test_both_arms_train_from_the_kept_cold_start_for_grpos_steps(tmp_path, monkeypatch):
    """The menu lab on a shortened config, then its baselines: each arm loads the kept cold start, takes as many
    Adam steps as GRPO did, and rejection sampling clones exactly the sampled episodes that passed."""
    from agentrl.core.config import load_section
    from agentrl.core.lab_config import config_run
    from agentrl.labs.instance import LabInstance
    from agentrl.labs.recipe import run_lab
    from agentrl.labs.report import lab_report
    from agentrl.starting import chat as chat_module
    from tests.test_labs import SHORT_LAB
    (tmp_path / "data" / "tokenizers").mkdir(parents=True)
    (tmp_path / "data" / "tokenizers" / "qwen3").symlink_to(REPO / "data" / "tokenizers" / "qwen3")
    monkeypatch.chdir(tmp_path)
    params = {"lab": load_section("lab", {"lab": SHORT_LAB}), "rl": load_section("rl", {"rl": {}}),
              "run": load_section("run", {"run": {}})}
    inst = LabInstance("menu", 0, dict(SHORT_LAB["configs"]["menu"]))
    record = run_lab("menu", config_run(params["lab"].configs, "menu"), 0, params, inst.work_dir,
                     tmp_path / "model", log=lambda *_: None)
    record["threads"] = 2
    numbers, _ = lab_report(record)
    numbers["training"]["steps_updated"] = 1   # whatever this tiny run's GRPO did, the budget is read from here
    baselines.report_of(inst).parent.mkdir(parents=True)
    baselines.report_of(inst).write_text(json.dumps(numbers))

    from agentrl.rl import rollout
    original_sample, real_clone, cloned = rollout.sample_groups, chat_module.clone, []

    def sample_with_passes(*args, **kwargs):   # a random-init model passes nothing: mark every other episode passed
        out = original_sample(*args, **kwargs)
        for i, t in enumerate(out):
            t.reward = 1.0 if i % 2 == 0 else 0.0
        return out
    monkeypatch.setattr(rollout, "sample_groups", sample_with_passes)

    def recording_clone(model, demos, *args, **kwargs):
        cloned.append(list(demos))
        return real_clone(model, demos, *args, **kwargs)
    monkeypatch.setattr(chat_module, "clone", recording_clone)
    out = baselines.train_arms(params, inst, log=lambda *_: None)

    steps = baselines.grpo_optimizer_steps(numbers)
    assert steps == record["rl"]["epochs"] * record["rl"]["minibatches"]
    assert out["more_cloning"]["training"]["steps"] == steps
    rs = out["rejection_sampling"]["training"]
    assert rs["sampled"] == out["budget_episodes"] == 1 * 2 * 2 and rs["passed"] == 2 and rs["steps"] == steps
    # the report counts GRPO's tokens, so every arm ran: more cloning in steps, in tokens, then rejection sampling
    assert list(out)[-4:] == list(baselines.ARMS) and out["grpo_policy_tokens"] == baselines.grpo_policy_tokens(numbers)
    assert len(cloned) == 4 and len(cloned[2]) == 2 and all(t.reward == 1.0 for t in cloned[2])
    # at GRPO's lr: the same sampled episodes cloned (the same stream), only the step size differs
    assert [t.ids for t in cloned[3]] == [t.ids for t in cloned[2]]
    at_lr = out["rejection_sampling_grpo_lr"]["training"]
    assert (at_lr["lr"], rs["lr"]) == (record["config"]["lr"], record["config"]["clone_lr"]) and at_lr["lr"] != rs["lr"]
    # --arms: one arm run again keeps the others' results of the same budget
    again = baselines.train_arms(params, inst, log=lambda *_: None, arms=["more_cloning"])
    assert again["rejection_sampling"] == json.loads(json.dumps(out["rejection_sampling"]))
    for arm in baselines.ARMS:
        assert sum(v["n"] for v in out[arm]["held_out"]["per_task"].values()) == 10   # 10 tasks x 1 episode
    assert json.loads(baselines.path_of(inst).read_text())["grpo_optimizer_steps"] == steps
    s = baselines.summary(out, numbers, n_boot=200)
    assert set(s) >= {"more_cloning", "rejection_sampling", "pass", "pass_at_k"}


def test_grpos_policy_tokens_are_its_updated_steps_tokens_times_epochs():
    record = {**RECORD, "training": {"steps_updated": 2, "trained_tokens_per_step": [100, 0, 50]},
              "rl": {"epochs": 2, "minibatches": 2}}
    assert baselines.grpo_policy_tokens(record) == 300
    assert baselines.budget_of(record) == {"grpo_optimizer_steps": 8, "grpo_policy_tokens": 300}
    assert baselines.grpo_policy_tokens(RECORD) is None   # a report from before they were counted
    partial = {**record, "training": {"steps_updated": 2, "trained_tokens_per_step": [100, None]}}
    assert baselines.grpo_policy_tokens(partial) is None


def test_token_matched_cloning_is_refused_before_compute_where_the_report_counted_no_tokens():
    budget = {"grpo_optimizer_steps": 32, "grpo_policy_tokens": None}
    with pytest.raises(ConfigError, match=r"^LabRun.baselines: more_cloning_tokens needs GRPO's policy tokens, .*; "
                                          r"allowed for it: more_cloning, rejection_sampling, "
                                          r"rejection_sampling_grpo_lr$"):
        baselines.check_arms(["more_cloning", "more_cloning_tokens"], budget, "LabRun.baselines")
    assert baselines.check_arms(["more_cloning_tokens"], {**budget, "grpo_policy_tokens": 9}) == ["more_cloning_tokens"]


def test_the_config_names_the_same_arms_as_the_registry():
    from agentrl.core.lab_config import BASELINE_ARMS
    assert BASELINE_ARMS == tuple(baselines.ARMS)


def test_the_table_gives_grpos_tokens_beside_the_token_matched_arm():
    from agentrl.labs.report import interval
    arms = {**ARMS, "grpo_policy_tokens": 6000,
            "more_cloning_tokens": {"held_out": {"per_task": counts([1, 1, 2, 4])},
                                    "training": {"steps": 47, "policy_tokens": 6016}}}
    s = baselines.summary(arms, RECORD, n_boot=200)
    assert s["grpo_policy_tokens"] == 6000
    md = "\n".join(baselines.table(s, interval))
    assert "| more cloning, as many tokens as GRPO |" in md and "| 47 | 6,016 |" in md
    assert md.count("| 32 | 6,000 |") == 1   # GRPO's row: its Adam steps and the tokens its updates trained on


def test_a_lab_runs_its_controls_after_grpo_and_the_report_and_files_carry_them(tmp_path, monkeypatch):
    """controls.after_grpo as run_lab calls it, on a stand-in for the model work: the temperature grid reuses the
    lab's own evaluations at T = 1 and runs the rest; the token-matched arm gets the budget the history holds."""
    from types import SimpleNamespace

    from agentrl.core.lab_config import LabRun
    from agentrl.labs import controls, temperatures
    from agentrl.labs.report import controls_lines
    run = LabRun(temperatures=[0.5], baselines=["more_cloning_tokens"], eval_per_task=4)
    seen = {}

    def fake_grid(run_, cfg, seed, device, batch, dirs, grid, log, label, known):
        seen["grid"], seen["known"] = grid, known
        out = {"temperatures": grid, "eval_per_task": 4, "seed": seed}
        for c, base in (("cold_start", "before"), ("final", "after")):
            out[c] = {"0.5": {"pass_rate": 0.5, "per_task": counts([1, 2, 2, 3])},
                      "1": {"pass_rate": 0, "per_task": record[base]["per_task"]}}
        return out

    def fake_arms(arms, run_, cfg, seed, device, batch, cold, budget, log, label):
        seen["budget"] = budget
        return {"more_cloning_tokens": {"held_out": {"per_task": counts([1, 1, 2, 4])},
                                        "training": {"steps": 3, "policy_tokens": budget["grpo_policy_tokens"]}}}
    monkeypatch.setattr(temperatures, "grid", fake_grid)
    monkeypatch.setattr(baselines, "run_arms", fake_arms)
    record = {**RECORD, "seed": 0, "config": {"clone_lr": 3e-3, "lr": 1e-5}}
    phases = []

    def phase(what, compute):
        phases.append(what)
        return compute()
    history = [{"updated": True, "trained_tokens": 120}, {"updated": False, "trained_tokens": 0}]
    cfg = SimpleNamespace(epochs=2, minibatches=2)
    record["controls"] = controls.after_grpo(run, cfg, 0, SimpleNamespace(device="cpu", eval_batch=8), tmp_path,
                                             {"before": record["before"], "after": record["after"]}, history, phase,
                                             print)
    assert phases == ["temperatures", "baselines"] and seen["grid"] == [0.5, 1.0]
    assert seen["known"]["cold_start"]["1"] is record["before"] and seen["known"]["final"]["1"] is record["after"]
    assert seen["budget"] == {"grpo_optimizer_steps": 4, "grpo_policy_tokens": 240}
    assert record["controls"]["baselines"]["budget_episodes"] == run.steps * run.tasks_per_step * run.episodes_per_task
    md = "\n".join(controls_lines(record))
    for line in ("## Temperature as a control", "GRPO over the tempered cold start", "## Compute-matched baselines",
                 "(4 Adam steps, 240 policy tokens", "| more cloning, as many tokens as GRPO |"):
        assert line in md, line
    # kept in the report's JSON, study labs reads them there as it reads the verbs' files
    from agentrl.studies.labs import baseline_tables, temperature_tables
    (tmp_path / "labs" / "menu").mkdir(parents=True)
    (tmp_path / "labs" / "menu" / "seed0.json").write_text(json.dumps(record))
    matched, md = baseline_tables(tmp_path / "labs")
    assert list(matched) == ["menu/seed0"] and matched["menu/seed0"]["grpo_policy_tokens"] == 240
    tempered, _ = temperature_tables(tmp_path / "labs")
    assert tempered["menu/seed0"]["best"] == "0.5"   # 8 passes at 0.5 against record["before"]'s 7 at 1
    # a verb's file run later wins over the lab's own record
    (tmp_path / "labs" / "menu" / "seed0.baselines.json").write_text(json.dumps(
        {**record["controls"]["baselines"], "grpo_policy_tokens": 999}))
    assert baseline_tables(tmp_path / "labs")[0]["menu/seed0"]["grpo_policy_tokens"] == 999
    # no update: no budget, so no baselines (and nothing to write for them)
    phases.clear()
    assert controls.after_grpo(LabRun(baselines=["more_cloning"]), cfg, 0, None, tmp_path, {}, [{"updated": False}],
                               phase, print) == {} and phases == []


@pytest.mark.slow
@pytest.mark.usefixtures("qwen3_tokenizer")
def test_a_lab_runs_its_controls_on_its_own_checkpoints(tmp_path, monkeypatch):
    """The menu lab on a shortened config asking for a temperature grid and two baselines: both run as phases of the
    lab on its saved checkpoints; the grid's T = 1 cells are the lab's evaluations, which the saved checkpoints give
    again on the same streams; the token-matched arm trains within half a cloning step of GRPO's tokens."""
    from agentrl.core.config import load_section
    from agentrl.core.lab_config import config_run
    from agentrl.labs import controls, temperatures
    from agentrl.labs.recipe import rl_config, run_lab
    from agentrl.labs.report import lab_report
    from tests.test_labs import SHORT_LAB
    monkeypatch.chdir(REPO)   # the tokenizer files under data/tokenizers/qwen3
    menu = {**SHORT_LAB["configs"]["menu"], "temperatures": [0.5],
            "baselines": ["more_cloning_tokens", "rejection_sampling"]}
    params = {"lab": load_section("lab", {"lab": {**SHORT_LAB, "configs": {"menu": menu}}}),
              "rl": load_section("rl", {"rl": {}}), "run": load_section("run", {"run": {}})}

    def after(run, cfg, seed, lab, out_dir, evaluations, history, phase, log):
        # a random-init model's groups rarely disagree, so its GRPO seldom updates: the budget is stated here
        history = [{**row, "updated": True, "trained_tokens": 64} for row in history]
        return controls.after_grpo(run, cfg, seed, lab, out_dir, evaluations, history, phase, log)
    run = config_run(params["lab"].configs, "menu")
    record = run_lab("menu", run, 0, params, tmp_path / "out", tmp_path / "model", log=lambda *_: None,
                     after_grpo=after)
    record["threads"] = 2
    grid, arms = record["controls"]["temperatures"], record["controls"]["baselines"]
    assert {"temperatures", "baselines"} <= set(record["timings_s"])
    assert grid["temperatures"] == [0.5, 1.0] and grid["cold_start"]["0.5"]["seconds"] > 0
    assert grid["cold_start"]["1"]["per_task"] == record["before"]["per_task"]
    assert grid["final"]["1"]["per_task"] == record["after"]["per_task"]
    assert grid["final"]["1"]["reused"] == "the lab's after" and grid["final"]["1"]["seconds"] == 0.0   # not rerun
    cfg = rl_config(params["rl"], run, 0)
    again = temperatures.grid(run, cfg, 0, "cpu", 10, {c: tmp_path / "out" / c for c in temperatures.CHECKPOINTS},
                              [1.0], log=lambda *_: None)   # the saved checkpoints, the same streams: the same counts
    assert again["cold_start"]["1"]["per_task"] == record["before"]["per_task"]
    assert again["final"]["1"]["per_task"] == record["after"]["per_task"]
    budget = 64 * len(record["history"]) * cfg.epochs
    assert arms["grpo_policy_tokens"] == budget
    t = arms["more_cloning_tokens"]["training"]
    per_step = t["policy_tokens"] / t["steps"]
    assert t["steps"] >= 1 and abs(t["policy_tokens"] - budget) <= max(per_step / 2, per_step - budget) + 1
    assert arms["rejection_sampling"]["training"]["sampled"] == arms["budget_episodes"]
    for arm in ("more_cloning_tokens", "rejection_sampling"):
        assert sum(v["n"] for v in arms[arm]["held_out"]["per_task"].values()) == 10   # 10 tasks x 1 episode
    numbers, md = lab_report(record)
    assert "## Temperature as a control" in md and "## Compute-matched baselines" in md
    assert numbers["controls"] == json.loads(json.dumps(record["controls"]))   # kept in the report's JSON
    json.dumps(numbers)
