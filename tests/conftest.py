"""Shared, session-scoped fixtures: the task catalogue, the tokenizer and two small policies.

- `random_model`: a freshly initialised TinyAgent (seed 0). Its calls are mostly malformed, so every episode
  runs the full turn budget (all rows share one turn structure).
- `quick_base`: the same model after a few hard-target SFT steps on episodes of the uniformly random scripted
  caller. It knows the call format and picks tools at random, so episodes end after 1..max_turns turns and rows
  of one batch are at different points of their turn structure (what the KV-cache slot layout must handle).
Both are cheap (a couple of seconds), unlike the real behaviour-cloned base.
"""
from __future__ import annotations

import os
from pathlib import Path

import pytest

from agentrl.core.numerics import pin

# every DVC a test starts, in a repository of its own (`dvc init` writes no core.analytics) or the project's, sends
# nothing: no analytics daemon is spawned (the project's .dvc/config turns it off for users' own commands)
os.environ["DVC_NO_ANALYTICS"] = "1"

# the pipeline's default CPU numerics, before torch loads: byte-compared fixtures hold on every machine class
# (override: AGENTRL_TEST_NUMERICS=native)
pin(os.environ.get("AGENTRL_TEST_NUMERICS", "portable"))
import torch  # noqa: E402

# two threads, as the pipeline's default run.threads (override for a busy machine: AGENTRL_TEST_THREADS=1)
torch.set_num_threads(int(os.environ.get("AGENTRL_TEST_THREADS", "2")))

import agentrl.rl.variants  # noqa: E402,F401 (every variant a knob names, registered: any test may validate params)

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="session")
def repo_root() -> Path:
    return REPO


@pytest.fixture(scope="session")
def store_template(tmp_path_factory):
    """A migrated, empty MLflow sqlite store to copy (creating one from scratch runs the DB migrations: slow)."""
    from mlflow.tracking import MlflowClient
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    MlflowClient(tracking_uri=f"sqlite:///{db.as_posix()}").search_experiments()
    return db


@pytest.fixture(scope="session")
def qwen3_tokenizer() -> Path:
    """The real Qwen3 tokenizer files `make install` fetches (pinned, hash-checked): a test that needs them fails
    without them instead of being skipped."""
    path = REPO / "data" / "tokenizers" / "qwen3"
    if not (path / ".fetched").is_file():
        pytest.fail(f"{path}: the Qwen3 tokenizer is missing; `make install` fetches it")
    return path


@pytest.fixture(scope="session")
def all_tasks():
    from agentrl.env.tasks import make_tasks
    return make_tasks("all")


@pytest.fixture(scope="session")
def train_tasks():
    from agentrl.env.tasks import make_tasks
    return make_tasks("train")


@pytest.fixture(scope="session")
def tok(all_tasks):
    from agentrl.env.gym.tokenizer import build_tokenizer
    return build_tokenizer(all_tasks)


def _fresh_model(tok, seed: int = 0, **overrides):
    from agentrl.model.policy import ModelConfig, TinyAgent
    return TinyAgent(ModelConfig(len(tok), **overrides), generator=torch.Generator().manual_seed(seed))


@pytest.fixture(scope="session")
def make_model(tok):
    """Factory for fresh random-init models (tests that mutate a model get their own)."""
    return lambda seed=0, **overrides: _fresh_model(tok, seed, **overrides)


@pytest.fixture(scope="session")
def random_model(tok):
    model = _fresh_model(tok, 0)
    model.eval()
    return model


def _random_caller_trajectories(tok, tasks, per_task: int, seed: int):
    from agentrl.env.gym.callers import RandomCaller, run_scripted
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.rl.rollout import Trajectory
    gen = torch.Generator().manual_seed(seed)
    factory = make_env_factory(max_turns=6, reward="hidden", rename=True)
    out = []
    for task in tasks:
        for _ in range(per_task):
            env = factory(task, gen)
            toks, owner = run_scripted(env, RandomCaller(gen))
            ids = tok.encode(toks)
            out.append(Trajectory(ids, owner, [0.0] * (len(ids) - 1), env.reward, env.record()))
    return out


@pytest.fixture(scope="session")
def quick_base(tok, train_tasks):
    from agentrl.starting.tinyagent import train_sft
    model = _fresh_model(tok, 0, emb_std=1.0)
    demos = _random_caller_trajectories(tok, train_tasks, per_task=1, seed=0)
    train_sft(model, demos, tok, steps=30, lr=1e-2)
    model.eval()
    return model


@pytest.fixture(scope="session")
def rl_base(tok, train_tasks):
    """The pipeline's RL base: make_rl_base with the library defaults (which params.yaml pins, see
    test_params.py), seed 0. At 2 threads this is bit-identical to the base `dvc repro` builds."""
    from agentrl.starting.tinyagent import make_rl_base
    model, _ = make_rl_base(tok, train_tasks, seed=0)
    return model


@pytest.fixture(scope="session")
def length_start(tok, train_tasks):
    """The fault catalogue's length-pair start with the library defaults, seed 0 (as the faults stage builds it)."""
    from agentrl.core.config import BaseConfig, LengthConfig
    from agentrl.faults.length import length_start_config
    from agentrl.starting.tinyagent import make_rl_base
    model, _ = make_rl_base(tok, train_tasks, length_start_config(BaseConfig(), LengthConfig()), seed=0)
    return model


# Tests that need the real behaviour-cloned base (tens of seconds to build) or train for real are the slow tier;
# `make test-fast` (-m "not slow") runs the rest on small fixtures.
SLOW_FIXTURES = {"rl_base", "length_start", "short_catalogue", "healthy_run", "matrix", "mini"}


def pytest_collection_modifyitems(items):
    for item in items:
        if SLOW_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.slow)


# A CI log may keep only its last lines: the failed tests' ids are printed once more, on one line, after pytest's own
# summary (which names them higher up, where a short tail cuts them off).
_FAILED: list[str] = []


def pytest_runtest_logreport(report):
    if report.failed and report.nodeid not in _FAILED:
        _FAILED.append(report.nodeid)


def pytest_unconfigure(config):
    if _FAILED:
        print(f"\nfailed ({len(_FAILED)}): {' '.join(_FAILED)}", flush=True)
