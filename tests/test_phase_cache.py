"""A lab's pure phases computed once (agentrl.labs.phase_cache): an entry is found only under the same inputs and
context, its files are checked before it is used, and -- slow tier, the small Qwen3 on a shortened config -- a lab
that reuses an earlier lab's pretrained evaluation and cold start ends with the record and the weights of one that
computed them, its report saying what it reused and from where."""
import json

import pytest
from conftest import REPO

from agentrl.labs.phase_cache import PhaseCache, task_digest

CONTEXT = {"code_hash": "c0de", "versions": {"torch": "2.13.0"}, "threads": 2, "numerics": {"mode": "portable"}}
INPUTS = {"weights": "w", "seed": 0, "tasks": "t"}


def _cache(root, log=None, **context):
    return PhaseCache(root, {**CONTEXT, **context}, "lab@menu-0 (test)", log=log or (lambda *_: None))


def _weights(directory, payload=b"weights"):
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "model.safetensors").write_bytes(payload)
    return directory


def test_a_phase_is_computed_once_and_reused_under_the_same_inputs(tmp_path):
    calls = []

    def compute():
        calls.append(1)
        return {"pass_rate": 0.25}
    model = _weights(tmp_path / "made")
    first, reused = _cache(tmp_path / "cache").phase("cold_start", INPUTS, compute, model_dir=model)
    assert (first, reused, len(calls)) == ({"pass_rate": 0.25}, None, 1)
    copied = []
    again, reused = _cache(tmp_path / "cache").phase("cold_start", INPUTS, compute, reuse=copied.append)
    assert again == first and len(calls) == 1
    assert reused["computed_by"] == "lab@menu-0 (test)" and copied == [tmp_path / "cache" / "cold_start" /
                                                                      _cache(tmp_path).key("cold_start", INPUTS)]
    assert (copied[0] / "model" / "model.safetensors").read_bytes() == b"weights"


@pytest.mark.parametrize("change", [
    {"inputs": {**INPUTS, "seed": 1}}, {"inputs": {**INPUTS, "weights": "other"}}, {"phase": "eval_pretrained"},
    {"context": {"code_hash": "edited"}}, {"context": {"threads": 1}}, {"context": {"numerics": {"mode": "native"}}}])
def test_any_other_input_code_thread_count_or_machine_class_is_another_entry(tmp_path, change):
    _cache(tmp_path).phase("cold_start", INPUTS, lambda: {"v": 1})
    calls = []
    result, reused = _cache(tmp_path, **change.get("context", {})).phase(
        change.get("phase", "cold_start"), change.get("inputs", INPUTS), lambda: calls.append(1) or {"v": 2})
    assert (result, reused, calls) == ({"v": 2}, None, [1])


def test_altered_cached_weights_are_not_used_and_the_phase_is_computed_again(tmp_path):
    """Fault injection: 16 bytes of the kept weights changed after the entry was written."""
    lines = []
    cache = _cache(tmp_path / "cache", log=lines.append)
    cache.phase("cold_start", INPUTS, lambda: {"v": 1}, model_dir=_weights(tmp_path / "made", bytes(64)))
    kept = cache.path("cold_start", INPUTS) / "model" / "model.safetensors"
    kept.write_bytes(bytes(48) + b"\x01" * 16)
    calls = []
    result, reused = cache.phase("cold_start", INPUTS, lambda: calls.append(1) or {"v": 1},
                                 model_dir=_weights(tmp_path / "made", bytes(64)))
    assert (reused, calls) == (None, [1]) and kept.read_bytes() == bytes(64)   # recomputed, the entry replaced
    assert any("model.safetensors differs" in line and "computing cold_start again" in line for line in lines)


def test_a_damaged_entry_file_is_not_used(tmp_path):
    cache = _cache(tmp_path)
    cache.phase("eval_pretrained", INPUTS, lambda: {"v": 1})
    (cache.path("eval_pretrained", INPUTS) / "entry.json").write_text('{"key": "someone else\'s"')
    result, reused = cache.phase("eval_pretrained", INPUTS, lambda: {"v": 2})
    assert (result, reused) == ({"v": 2}, None)


def test_a_failed_computation_leaves_no_entry_and_no_temporary(tmp_path):
    cache = _cache(tmp_path)

    def fails():
        raise RuntimeError("killed")
    with pytest.raises(RuntimeError):
        cache.phase("cold_start", INPUTS, fails)
    assert not (tmp_path / "cold_start").exists() or list((tmp_path / "cold_start").iterdir()) == []
    assert list(tmp_path.rglob("*.tmp")) == []


def test_the_task_digest_sees_every_field_of_every_task():
    from dataclasses import replace

    from agentrl.env.tasks import make_tasks
    tasks = make_tasks("heldout")
    assert task_digest(tasks) == task_digest(make_tasks("heldout")) != task_digest(make_tasks("train"))
    assert task_digest([replace(tasks[0], func="other"), *tasks[1:]]) != task_digest(tasks)
    assert task_digest(tasks[::-1]) != task_digest(tasks)


# ------------------------------------------------------------------ slow: labs on the small Qwen3

SHORT = {"demos_per_task": 1, "clone_steps": 2, "clone_batch": 4, "steps": 2, "tasks_per_step": 2,
         "episodes_per_task": 2, "max_turns": 2, "new_tokens": 24, "eval_per_task": 1, "signal_tasks": 0,
         "min_signal": 0, "rl": {"entropy_coef": 0.01}}
TIMES = ("timings_s", "wall_s", "cpu_s", "peak_memory_mib", "attempts", "reused", "floors")


def _lab(out, model, cache, **changes):
    from agentrl.core.config import lab_run, load_section
    from agentrl.labs.recipe import run_lab
    config = {**SHORT, "model": str(model), **changes}
    params = {"lab": load_section("lab", {"lab": {"eval_batch": 10, "configs": {"menu": config}}}),
              "rl": load_section("rl", {"rl": {}}), "run": load_section("run", {"run": {}})}
    return run_lab("menu", lab_run("menu", config), 0, params, out, out / "small", log=lambda *_: None, cache=cache)


@pytest.mark.slow
@pytest.mark.usefixtures("qwen3_tokenizer")
def test_a_grpo_sweep_pays_for_one_pretrained_evaluation_and_one_cold_start(tmp_path, monkeypatch):
    """Two labs that differ only in GRPO's learning rate: the second reuses the first's pretrained evaluation and
    cold start, and its record and final weights equal those of the same lab computed without a cache."""
    from agentrl.backends.hf import load_model, make_small_model
    from agentrl.core.seeding import generator
    from agentrl.labs.recipe import weights_digest
    from agentrl.labs.report import lab_report
    monkeypatch.chdir(REPO)   # the tokenizer files under data/tokenizers/qwen3
    model = tmp_path / "pretrained"
    make_small_model(model, generator(0, "test", "init"), REPO / "data" / "tokenizers" / "qwen3", hidden=64, layers=2)
    cache = _cache(tmp_path / "cache")
    first = _lab(tmp_path / "a", model, cache)
    assert first["reused"] == {}
    swept = _lab(tmp_path / "b", model, cache, lr=1e-3)
    assert set(swept["reused"]) == {"eval_pretrained", "cold_start"}
    assert all(r["from"].startswith(str(tmp_path / "cache")) for r in swept["reused"].values())
    fresh = _lab(tmp_path / "c", model, None, lr=1e-3)
    same = {k: json.dumps(v, sort_keys=True) for k, v in swept.items() if k not in TIMES}
    assert same == {k: json.dumps(v, sort_keys=True) for k, v in fresh.items() if k not in TIMES}
    for kept in ("cold_start", "final"):
        assert weights_digest(load_model(tmp_path / "b" / kept, kept)) == \
            weights_digest(load_model(tmp_path / "c" / kept, kept))
    swept["threads"] = 2
    md = lab_report(swept)[1]
    assert "- eval_pretrained reused, not computed: the result lab@menu-0 (test) computed in" in md
    assert "- cold_start reused, not computed" in md and str(tmp_path / "cache" / "cold_start") in md
