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
                                          r"rejection_sampling, rejection_sampling_grpo_lr$"):
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
    assert len(cloned) == 3 and len(cloned[1]) == 2 and all(t.reward == 1.0 for t in cloned[1])
    # at GRPO's lr: the same sampled episodes cloned (the same stream), only the step size differs
    assert [t.ids for t in cloned[2]] == [t.ids for t in cloned[1]]
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
