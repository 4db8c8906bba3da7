"""A lab killed part-way resumes where it stopped (agentrl.labs.progress): its finished phases are read back, GRPO goes
on from its last step with the same weights, Adam state, generator and history, and the record equals an
uninterrupted lab's but for its timings and `attempts`. Slow tier: the small Qwen3 on a shortened config."""
import json

import pytest
from conftest import REPO

from agentrl.rl.trainer import Hook

needs_tokenizer = pytest.mark.usefixtures("qwen3_tokenizer")   # fails, never skips, when it is missing
# the shortened lab of tests/test_labs.py with three GRPO steps, an entropy bonus and a KL term: every step updates
# (a random-init model rarely has reward signal), so Adam's state, the generator and the KL reference all shape the
# steps after a resume
CONFIG = {"demos_per_task": 1, "clone_steps": 2, "clone_batch": 4, "steps": 3, "tasks_per_step": 2,
          "episodes_per_task": 2, "max_turns": 2, "new_tokens": 24, "eval_per_task": 1, "signal_tasks": 2,
          "min_signal": 0, "rl": {"entropy_coef": 0.01, "kl_coef": 0.05}}
# what differs between two runs of one lab in two directories: the times (the floors are measured beside them), and
# where its small model was written
TIMES = ("timings_s", "wall_s", "cpu_s", "peak_memory_mib", "attempts", "model", "model_dir", "floors")


class Killed(Exception):
    """Stands for the signal that ends a process part-way."""


class KillBefore(Hook):
    """A trainer hook that ends the lab before GRPO step `step` (0-based) starts."""

    def __init__(self, step):
        self.step = step

    def before_step(self, step, state):
        if step == self.step:
            raise Killed(f"before step {step}")


def _params():
    from agentrl.core.config import load_section
    return {"lab": load_section("lab", {"lab": {"eval_batch": 10, "configs": {"menu": CONFIG}}}),
            "rl": load_section("rl", {"rl": {}}), "run": load_section("run", {"run": {}})}


def _run(out, hooks=(), key="fingerprint"):
    from agentrl.core.config import lab_run
    from agentrl.labs.recipe import run_lab
    return run_lab("menu", lab_run("menu", CONFIG), 0, _params(), out, out.parent / f"{out.name}-model",
                   log=lambda *_: None, hooks=hooks, resume_key=key)


def _same(a: dict, b: dict):
    a, b = ({k: json.dumps(v, sort_keys=True) for k, v in r.items() if k not in TIMES} for r in (a, b))
    assert a.keys() == b.keys() and [k for k in a if a[k] != b[k]] == []


@pytest.fixture(scope="module")
def whole(tmp_path_factory):
    """One uninterrupted lab, and the digest of its final weights."""
    from agentrl.labs.recipe import weights_digest
    out = tmp_path_factory.mktemp("whole") / "lab"
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(REPO)
        record = _run(out)
    return record, _final_digest(out, weights_digest)


def _final_digest(out, digest):
    from agentrl.backends.hf import load_model
    return digest(load_model(out / "final", "final"))


@pytest.mark.slow
@needs_tokenizer
def test_a_lab_killed_during_grpo_goes_on_from_its_last_step_and_ends_as_an_uninterrupted_one(
        whole, tmp_path, monkeypatch):
    from agentrl.labs.recipe import weights_digest
    monkeypatch.chdir(REPO)
    record, digest = whole
    assert record["attempts"] == ["the start"] and sum(r["updated"] for r in record["history"]) == 3
    out = tmp_path / "lab"
    with pytest.raises(Killed):
        _run(out, hooks=[KillBefore(2)])
    assert sorted(p.name for p in (out / "progress").glob("grpo_step_*")) == ["grpo_step_002"]
    resumed = _run(out)
    assert resumed["attempts"] == ["the start", "GRPO step 2"]
    _same(record, resumed)
    assert _final_digest(out, weights_digest) == digest
    assert resumed["wall_s"] >= resumed["timings_s"]["grpo"] > 0   # the killed attempt's time is counted
    from agentrl.labs.report import lab_report
    md = lab_report({**resumed, "threads": 2})[1]
    assert "Run in 2 attempts (a kill and a rerun); they started at: the start, GRPO step 2." in md
    assert "attempts" not in lab_report({**record, "threads": 2})[1]


@pytest.mark.slow
@needs_tokenizer
def test_a_lab_killed_in_a_phase_keeps_the_phases_before_it(whole, tmp_path, monkeypatch):
    from agentrl.labs import recipe
    monkeypatch.chdir(REPO)
    record, digest = whole
    real, calls = recipe.held_out, []

    def dies_in_the_evaluation_before_grpo(*args):
        calls.append(args[7])
        if args[7] == "before":
            raise Killed("during eval_before")
        return real(*args)
    out = tmp_path / "lab"
    monkeypatch.setattr(recipe, "held_out", dies_in_the_evaluation_before_grpo)
    with pytest.raises(Killed):
        _run(out)
    monkeypatch.setattr(recipe, "held_out", real)
    kept = json.loads((out / "progress" / "progress.json").read_text())
    assert sorted(kept["phases"]) == ["cold_start", "preflight", "signal_check"] and calls == ["before"]
    resumed = _run(out)
    assert resumed["attempts"] == ["the start", "eval_before"]
    _same(record, resumed)
    assert _final_digest(out, recipe.weights_digest) == digest


@pytest.mark.slow
@needs_tokenizer
def test_progress_of_another_configuration_is_cleared_not_resumed(tmp_path, monkeypatch):
    """A kept phase that resumed under another key would hand the report numbers another config made: a different
    key (the stage's fingerprint: params, code, threads) starts over."""
    monkeypatch.chdir(REPO)
    out = tmp_path / "lab"
    with pytest.raises(Killed):
        _run(out, hooks=[KillBefore(1)], key="one")
    with pytest.raises(Killed):
        _run(out, hooks=[KillBefore(0)], key="two")
    kept = json.loads((out / "progress" / "progress.json").read_text())
    assert kept["attempts"] == ["the start"] and not list((out / "progress").glob("grpo_step_*"))


def test_a_damaged_progress_file_or_checkpoint_resumes_nothing_from_it(tmp_path):
    from agentrl.labs.progress import LabProgress
    progress = LabProgress(tmp_path, "k")
    assert progress.phase("a", lambda: {"x": (1, 2)})[0] == {"x": [1, 2]}   # through JSON, kept or not
    assert LabProgress(tmp_path, "k").done("a")
    (tmp_path / "progress.json").write_text("{not json")
    assert not LabProgress(tmp_path, "k").done("a")
    (tmp_path / "grpo_step_003").mkdir()
    (tmp_path / "grpo_step_003" / "training_state.pt").write_bytes(b"cut off")
    assert LabProgress(tmp_path, "k").grpo_checkpoint() is None
    (tmp_path / "grpo_step_009.123.tmp").mkdir()   # a write a kill cut short
    LabProgress(tmp_path, "k")
    assert not (tmp_path / "grpo_step_009.123.tmp").exists()
    nothing = LabProgress(tmp_path / "none", None)   # no key: nothing kept, nothing written
    assert nothing.phase("a", lambda: 1)[0] == 1 and not nothing.done("a") and not (tmp_path / "none").exists()
