"""Hostile input and killable processes (issue: nothing silently wrong, nothing lost, one-line errors).

Every case here failed before: a non-finite param accepted, a CLI argument ending in a traceback, a missing
model silently replaced, a looping candidate program hanging the gym, an empty split looping forever, a corrupted
split or tokenizer file ending in a traceback, an unreachable tracking store retried for minutes."""
from __future__ import annotations

import json
import math
import subprocess
import sys
import time
from dataclasses import fields
from pathlib import Path

import pytest
import yaml

from agentrl.core.config import SECTIONS, ConfigError, ParamsError, load_params

REPO = Path(__file__).resolve().parents[1]


def _float_fields():
    for name, cls in SECTIONS.items():
        for f in fields(cls):
            spec = f.metadata.get("spec")
            if spec is not None and spec.kind is float:
                yield name, f.name


FLOATS = list(_float_fields())


@pytest.mark.parametrize("section,key", FLOATS, ids=[f"{s}.{k}" for s, k in FLOATS])
@pytest.mark.parametrize("value", [math.inf, -math.inf, math.nan, "1e999"])
def test_every_float_param_must_be_finite(tmp_path, monkeypatch, section, key, value):
    monkeypatch.chdir(tmp_path)
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw[section][key] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ParamsError) as err:
        load_params([section, "run"])
    msg = str(err.value)
    assert msg.startswith(f"params.yaml: {section}.{key}: ") and "\n" not in msg and "finite" in msg, msg


def test_the_float_fields_the_issue_named_are_among_them():
    # ablate.kl_coef is now the kl arm's rl.kl_coef (ablate.arms), checked as rl.kl_coef is (tests/test_research.py)
    named = {("base", "lr"), ("sft", "lr"), ("model", "emb_std"), ("base", "choice_weight"), ("preflight", "kl_coef"),
             ("rl", "kl_coef"), ("faults", "kl_coef"), ("faults", "high_lr"), ("rl", "lr")}
    assert named <= set(FLOATS)


CLI_BAD = [
    (["check", "--threads", "0"], "--threads"), (["check", "--threads", "abc"], "--threads"),
    (["bench", "--steps", "-3"], "--steps"), (["check", "--bug", "nonsense"], "nonsense"),
    (["check", "--kl-coef", "-5"], "--kl-coef"), (["bench", "--threads", "0,2"], "--threads"),
    (["check", "--model", "/nonexistent.pt"], "/nonexistent.pt"), (["bench", "--model", "/nonexistent.pt"],
                                                                  "/nonexistent.pt"),
    (["audit", "nocolon"], "<file>.json:<dotted.path>"), (["replay", "/nonexistent.pt"], "/nonexistent.pt"),
]


@pytest.mark.parametrize("argv,fragment", CLI_BAD, ids=[" ".join(a) for a, _ in CLI_BAD])
def test_cli_bad_arguments_are_one_line(argv, fragment):
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "agentrl", *argv], cwd=REPO, capture_output=True, text=True,
                         timeout=60)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], \
        (out.returncode, out.stderr)
    assert "Traceback" not in out.stderr and time.time() - t0 < 10


def test_a_looping_candidate_program_fails_its_tests_and_the_episode_goes_on():
    from agentrl.env.gym import environment as gym
    from agentrl.env.tasks import Task
    looping = Task("loop/forever", "loop", "spin", "def spin(n):\n    while True:\n        n += 1\n",
                   (((1,), 1),), (((2,), 2),), "fix_init", "train")
    t0 = time.time()
    report = gym.run_tests(looping, None)
    assert time.time() - t0 < 10
    assert not report.public_pass and not report.hidden_pass and report.public[0][2] == "timeout"
    env = gym.CodeEnv(looping, "alpha")
    obs = env.step(["<call>", "test", "</call>"])
    assert obs is not None and "timeout" in obs and not env.done


def test_an_empty_split_is_an_error_not_a_hang(tmp_path):
    from agentrl.core.artifacts import StageError
    from agentrl.env.tasks import load_split
    from agentrl.rl.rollout import choose_tasks
    (tmp_path / "split.json").write_text(json.dumps({"train": [], "validation": ["minmax/peak"],
                                                     "test": ["minmax/ceiling"]}))
    with pytest.raises(StageError, match="train: empty"):
        load_split(tmp_path / "split.json")
    with pytest.raises(ValueError, match="at least one task"):
        choose_tasks([], 4, None)


@pytest.mark.parametrize("content,fragment", [
    (b"\xff\xfe\x00garbage", "not UTF-8"), (b'{"train": "minmax/peak"}', "expected a list"),
    (b"[1, 2]", "expected an object"), (b'{"train": ["nope/x"], "validation": ["a"], "test": ["b"]}', "unknown task"),
])
def test_a_bad_split_file_is_one_line(tmp_path, content, fragment):
    from agentrl.core.artifacts import StageError
    from agentrl.env.tasks import load_split
    (tmp_path / "split.json").write_bytes(content)
    with pytest.raises(StageError) as err:
        load_split(tmp_path / "split.json")
    assert fragment in str(err.value) and "split.json" in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize("content", [b'{"vocab": 3}', b'{"vocab": ["a", "b"]}', b"{broken", b'{"vocab": [1, 2]}'])
def test_a_bad_tokenizer_file_is_one_line(tmp_path, content):
    from agentrl.core.artifacts import StageError
    from agentrl.env.gym.tokenizer import load_tokenizer
    (tmp_path / "tokenizer.json").write_bytes(content)
    with pytest.raises(StageError) as err:
        load_tokenizer(tmp_path / "tokenizer.json")
    assert "tokenizer.json" in str(err.value) and "\n" not in str(err.value)


def test_an_unreachable_or_corrupted_store_is_named_within_seconds(tmp_path):
    """audit (and every stage, through the same probe) names the store in one line instead of retrying."""
    from agentrl.tracking.store import StoreError, probe
    t0 = time.time()
    with pytest.raises(StoreError, match="127.0.0.1:9"):
        probe("http://127.0.0.1:9")
    corrupted = tmp_path / "mlflow.db"
    corrupted.write_bytes(b"\x00" * 4096)
    with pytest.raises(StoreError, match="mlflow.db"):
        probe(f"sqlite:///{corrupted}")
    assert time.time() - t0 < 10


def test_a_config_object_cannot_be_built_invalid():
    from agentrl.core.config import RLConfig
    with pytest.raises(ConfigError, match="RLConfig.lr"):
        RLConfig(lr=float("inf"))
