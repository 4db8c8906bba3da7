"""One way in for each extension, from a test file alone (no file of the package is touched): a new policy
backend, a new environment with its own episode record and conversation format, and a new policy-loss variant.
Each is registered, then runs through train() for two steps, evaluate(), the dashboard and the nine invariants
exactly as the project's own entries do; the registries are left as they were."""
from __future__ import annotations

import math
import re
from dataclasses import dataclass

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

from agentrl.backends.base import BackendSpec, PolicyBackend
from agentrl.backends.registry import BACKENDS, from_description, load_checkpoint, save_checkpoint
from agentrl.core.config import ConfigError, RLConfig
from agentrl.core.variants import POLICY_LOSSES
from agentrl.env.base import EnvironmentSpec, EpisodeRecord
from agentrl.env.formats import ConversationFormat
from agentrl.env.gym.spec import GYM
from agentrl.env.registry import ENVIRONMENTS, environment
from agentrl.eval.evaluation import evaluate
from agentrl.model.policy import ModelConfig, TinyAgent
from agentrl.rl.dashboard import METRIC_GROUPS
from agentrl.rl.invariants import CHECKS, failed_checks, sanity_checks
from agentrl.rl.rollout import sample_step
from agentrl.rl.trainer import train

CFG = RLConfig(group_size=4, tasks_per_step=2, max_call_tokens=5)


def run_everything(model, env_spec, tasks, fmt, cfg):
    """train() two steps, evaluate(), and the nine invariants on a fresh batch: what every entry must pass. A batch
    whose episodes all got the same reward gets alternating 1/0 rewards within each group, as the labs' probe batch
    does (the invariants test the trainer, and checks 8-9 need a reward signal)."""
    history = train(model, tasks, fmt, cfg, 2, env=env_spec.make(cfg))
    res = evaluate(model, tasks, fmt, 2, 1.0, torch.Generator().manual_seed(1), cfg,
                   env=env_spec.make(cfg, evaluation=True))
    batch, _ = sample_step(model, env_spec.make(cfg), tasks, fmt, cfg, torch.Generator().manual_seed(2))
    if len({t.reward for t in batch}) == 1:
        for i, t in enumerate(batch):
            t.reward = float(i % 2 == 0)
    checks = sanity_checks(model, batch, fmt, cfg)
    return history, res, checks


def assert_dashboard(history, extra=()):
    assert len(history) == 2
    for row in history:
        for key in ["reward", "pass_rate", *METRIC_GROUPS["behaviour"], "entropy", "approx_kl", "zero_adv_frac",
                    "logp_gap", *extra]:
            assert key in row and isinstance(row[key], float | int), key
        assert row["logp_gap"] < 1e-4   # the sampler draws from the distribution the trainer differentiates


# ---------------------------------------------------------------- a new backend: a bigram table

class BigramPolicy(nn.Module):
    """logits(next | history) = W[last token]: no attention, so its KV cache is the last token of each row."""

    kind = "bigram"

    def __init__(self, vocab_size: int):
        super().__init__()
        self.table = nn.Parameter(torch.randn(vocab_size, vocab_size, generator=torch.Generator().manual_seed(0)))

    def num_params(self) -> int:
        return self.table.numel()

    def describe(self) -> dict:
        return {"backend": self.kind, "parameters": self.num_params(), "config": {"vocab_size": self.table.shape[0]}}

    def logits(self, ids, at=None):
        out = self.table[ids]
        return out if at is None else out[at]

    def log_probs(self, ids, at=None, temperature=1.0, entropy=False):
        z = F.log_softmax(self.table[ids[:, :-1]] / temperature, -1)
        logp = z.gather(-1, ids[:, 1:, None]).squeeze(-1)
        return logp, (-(z.exp() * z).sum(-1) if entropy else None)

    def frozen_log_probs(self, ids, lengths, at=None, temperature=1.0, entropy=False):
        with torch.no_grad():
            return self.log_probs(ids, at, temperature, entropy)

    def sampler(self, pad_id: int):
        return BigramSampler(self)


class BigramSampler:
    def __init__(self, policy: BigramPolicy):
        self.policy, self.last = policy, None

    def append(self, chunks):
        self.last = torch.tensor([c[-1] for c in chunks])
        return self.policy.table[self.last]

    def step(self, tokens, active):
        self.last = torch.where(active, tokens[:, 0], self.last)
        return self.policy.table[self.last[active]]

    def keep(self, rows):
        self.last = self.last[rows]


def _save(model, path, tokenizer_hash, extra=None):
    torch.save({"config": model.describe()["config"], "tokenizer_hash": tokenizer_hash,
                "state_dict": model.state_dict(), "extra": extra or {}}, path)


def _read(path):
    return torch.load(path, weights_only=True)


def _load(path, tok, expect=None):
    payload = _read(path)
    model = BigramPolicy(**payload["config"])
    model.load_state_dict(payload["state_dict"])
    return model, payload["extra"]


@pytest.fixture
def bigram_backend():
    spec = BACKENDS.register("bigram", BackendSpec("bigram", "a bigram table (test)", lambda c: BigramPolicy(**c),
                                                   _save, _load, _read))
    yield spec
    BACKENDS.unregister("bigram")
    assert "bigram" not in BACKENDS


def test_a_new_backend_is_one_registry_entry(bigram_backend, tok, train_tasks, tmp_path):
    model = BigramPolicy(len(tok))
    assert isinstance(model, PolicyBackend)
    # a table of independent logits moves by about lr per Adam step: 1e-2 so that check 9's KL clears 1e-6
    history, res, checks = run_everything(model, GYM, train_tasks[:4], tok, RLConfig(group_size=4, tasks_per_step=2,
                                                                                     lr=1e-2))
    assert_dashboard(history, extra=GYM.counts)
    assert all(set(t.record.counts) == set(GYM.counts) for t in res["trajs"])   # the counts it declares
    assert 0.0 <= res["pass_rate"] <= 1.0 and sum(v["n"] for v in res["per_task"].values()) == 8
    assert failed_checks(checks) == set() and not checks.errors, {c: checks[c] for c in CHECKS}
    save_checkpoint(model, tmp_path / "bigram.pt", tok.hash, {"step": 2})     # through the registry, by kind
    loaded, extra = load_checkpoint("bigram", tmp_path / "bigram.pt", tok)
    assert extra == {"step": 2} and torch.equal(loaded.table, model.table)
    assert from_description(model.describe()).table.shape == model.table.shape


def test_an_unregistered_backend_is_one_line_naming_the_registered_ones(tok, tmp_path):
    with pytest.raises(ConfigError, match=r"^backend: unknown value 'bigram'; allowed: tinyagent, hf$"):
        load_checkpoint("bigram", tmp_path / "x.pt", tok)


# ---------------------------------------------------------------- a new environment: one-tool arithmetic

@dataclass(frozen=True)
class Sum:
    name: str
    a: int
    b: int


WORDS = ["<pad>", "<bos>", "what", "is", "+", "<answer>", "</answer>", "right", "wrong", "again"] + \
        [str(i) for i in range(10)]
SUMS = [Sum(f"sum_{a}_{b}", a, b) for a, b in ((1, 2), (2, 2), (3, 4), (0, 5), (4, 4), (2, 3))]


class AnswerWords:
    """The arithmetic environment's words: a turn is `<answer> D </answer>` (one digit), a reply `right`/`wrong`."""

    def __init__(self):
        self.vocab, self.index = WORDS, {w: i for i, w in enumerate(WORDS)}
        self.pad_id, self.stop_id, self.hash = 0, self.index["</answer>"], "answer-words"

    def __len__(self):
        return len(self.vocab)

    def prompt(self, env):
        return [self.index[w] for w in env.reset()]

    def action(self, turn):
        return " ".join(self.vocab[t] for t in turn)

    def reply(self, obs, closed):
        return [self.index[obs]]


class SumEpisode:
    """One question; `answer D` is the only tool; two turns."""

    def __init__(self, task: Sum, reward_kind: str = "exact"):
        self.task, self.reward_kind = task, reward_kind
        self.done, self.reward, self.turns, self.bad, self.calls, self.answers = False, 0.0, 0, 0, [], []

    def reset(self):
        return ["<bos>", "what", "is", str(self.task.a), "+", str(self.task.b)]

    def step(self, action):
        self.turns += 1
        m = re.fullmatch(r"<answer> (\d) </answer>", action)
        if m is None:
            self.bad += 1
            self.calls.append("invalid")
        else:
            self.calls.append("answer")
            self.answers.append(int(m.group(1)))
            if self.answers[-1] == self.task.a + self.task.b:
                self.reward, self.done = 1.0, True
                return None
        if self.turns >= 2:
            self.done = True
            return None
        return "again"

    def record(self):
        right = self.reward > 0
        return EpisodeRecord(self.task.name, "arith", self.task.name, turns=self.turns, malformed=self.bad,
                             finished=right, passed=right, calls=tuple(self.calls),
                             kinds=tuple("invalid" if c == "invalid" else "finish" for c in self.calls),
                             counts={"answers": len(self.answers)})


def make_sums(cfg, evaluation: bool = False):
    return lambda task, generator: SumEpisode(task)


@pytest.fixture
def arith_env():
    spec = ENVIRONMENTS.register("arith", EnvironmentSpec(
        "arith", "one-digit sums answered with one tool (test)", make=make_sums, tasks=lambda split: SUMS,
        formats={"words": lambda _: AnswerWords()}, knobs=(), counts=("answers",)))
    yield spec
    ENVIRONMENTS.unregister("arith")


def test_a_new_environment_is_one_registry_entry_with_its_own_record(arith_env):
    spec = environment("arith")
    assert spec is arith_env and "arith" in ENVIRONMENTS.names()
    fmt = spec.formats["words"](None)
    assert isinstance(fmt, ConversationFormat)
    model = TinyAgent(ModelConfig(vocab_size=len(fmt), d_model=16, n_layer=1, n_head=2, d_ff=32, max_len=64))
    cfg = RLConfig(group_size=4, tasks_per_step=2, max_call_tokens=3, max_turns=2)
    history, res, checks = run_everything(model, spec, spec.tasks("train"), fmt, cfg)
    assert_dashboard(history, extra=("answers",))
    assert not {"hardcode", "reads", "tests", "edits"} & set(history[0])   # no environment carries another's counts
    assert all(0 <= row["answers"] <= 2 for row in history)
    assert set(res["per_task"]) == {t.name for t in SUMS}
    assert all(t.record.family == "arith" and set(t.record.kinds) <= {"finish", "invalid"} for t in res["trajs"])
    assert failed_checks(checks) == set() and not checks.errors, {c: checks[c] for c in CHECKS}


def test_an_unregistered_environment_is_one_line_naming_the_registered_ones():
    with pytest.raises(ConfigError, match=r"^environment: unknown value 'arith'; allowed: gym, coding$"):
        environment("arith")


# ---------------------------------------------------------------- a new policy loss: plain importance-weighted PG

@pytest.fixture
def pg_loss():
    """`pg`: -r A per token, without a clip: the trainer's formula and the invariants' independent re-derivation
    (token by token, in float64), in one registration."""
    POLICY_LOSSES.register("pg", lambda ratio, adv, cfg: -(ratio * adv), reference=lambda r, a, cfg: -(r * a))
    yield "pg"
    POLICY_LOSSES.unregister("pg")
    with pytest.raises(ConfigError, match=r"^RLConfig.policy_loss: unknown value 'pg'; allowed: clip$"):
        RLConfig(policy_loss="pg")


def test_a_new_policy_loss_is_one_registered_function(pg_loss, quick_base, tok, train_tasks):
    import copy
    cfg = RLConfig(group_size=4, tasks_per_step=2, policy_loss=pg_loss)
    history, res, checks = run_everything(copy.deepcopy(quick_base), GYM, train_tasks[:4], tok, cfg)
    assert_dashboard(history, extra=GYM.counts)
    assert failed_checks(checks) == set() and not checks.errors, {c: checks[c] for c in CHECKS}
    # the variant is really the one trained: on ratios outside the clip range it differs from clip
    from agentrl.rl.objectives import policy_loss
    logp, old = torch.tensor([[0.0, -0.1]]), torch.tensor([[-1.0, -0.1]])
    adv, mask = torch.tensor([1.0]), torch.ones(1, 2)
    pg, _ = policy_loss(logp, old, adv, mask, cfg)
    clip, _ = policy_loss(logp, old, adv, mask, RLConfig())
    assert math.isclose(float(pg), -(math.e + 1) / 2, rel_tol=1e-6) and math.isclose(float(clip), -(1.2 + 1) / 2,
                                                                                      rel_tol=1e-6)


def test_a_variant_without_an_independent_rederivation_is_refused_by_the_invariants(quick_base, tok, train_tasks):
    POLICY_LOSSES.register("unchecked", lambda ratio, adv, cfg: -(ratio * adv))
    try:
        cfg = RLConfig(group_size=4, tasks_per_step=2, policy_loss="unchecked")
        batch, _ = sample_step(quick_base, GYM.make(cfg), train_tasks[:2], tok, cfg, torch.Generator().manual_seed(0))
        with pytest.raises(ConfigError, match=r"^rl.policy_loss: 'unchecked' has no independent re-derivation \(the "
                                              r"invariants need one: register the variant with reference="):
            sanity_checks(quick_base, batch, tok, cfg)
    finally:
        POLICY_LOSSES.unregister("unchecked")
