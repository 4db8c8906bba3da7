"""The word-level tokenizer: complete over everything an episode can contain, deterministic."""
from __future__ import annotations

import pytest
import torch

from agentrl.env.gym import environment as gym
from agentrl.env.gym.callers import ExpertCaller, RandomCaller, call_tokens, run_scripted
from agentrl.env.gym.environment import (
    EDITED_OBS,
    ERROR_OBS,
    NAME_POOL,
    TOOLS,
    CodeEnv,
    make_env_factory,
    run_tests,
    source_observation,
)
from agentrl.env.gym.tokenizer import SPECIALS, Tokenizer, build_tokenizer
from agentrl.env.ops import OPS
from agentrl.env.tasks import make_tasks


def _no_unk(tok, tokens, what):
    ids = tok.encode(list(tokens))
    unknown = [t for t, i in zip(tokens, ids) if i == tok.unk_id]
    assert not unknown, f"{what}: tokens missing from the vocabulary: {unknown}"
    return ids


def test_covers_sources_under_every_op_with_every_name(tok, all_tasks):
    for task in all_tasks:
        for op in (None,) + OPS:
            for name in (task.func,) + NAME_POOL:
                _no_unk(tok, source_observation(task, op, name), f"{task.name} read after {op} as {name}")
            _no_unk(tok, gym.test_observation(run_tests(task, op)), f"{task.name} test after {op}")


def test_covers_sources_with_filler_operands(tok, all_tasks):
    from agentrl.env.gym.environment import filler_operands
    gen = torch.Generator().manual_seed(0)
    for task in all_tasks:
        for name in NAME_POOL[:4]:
            operands = filler_operands(task, name, gen)
            for op in (None,) + OPS:
                _no_unk(tok, source_observation(task, op, name, operands), f"{task.name} renamed operands")


def test_covers_calls_prompts_and_fixed_observations(tok, all_tasks):
    for tool in ("read", "test", "submit"):
        _no_unk(tok, call_tokens(tool), tool)
    for op in OPS:
        _no_unk(tok, call_tokens("edit", op), op)
    _no_unk(tok, list(TOOLS) + list(OPS), "tools and ops")
    _no_unk(tok, ERROR_OBS + EDITED_OBS, "fixed observations")
    for name in NAME_POOL:
        _no_unk(tok, CodeEnv(all_tasks[0], name).reset(), "prompt")
    for task in all_tasks:
        _no_unk(tok, CodeEnv(task, task.func).reset(), "prompt with the task's own name")


@pytest.mark.parametrize("caller", [RandomCaller, ExpertCaller])
def test_covers_every_token_of_played_episodes(tok, all_tasks, caller):
    gen = torch.Generator().manual_seed(0)
    for rename in (True, False):
        factory = make_env_factory(max_turns=6, rename=rename)
        for task in all_tasks:
            for _ in range(6):
                toks, owner = run_scripted(factory(task, gen), caller(gen))
                assert len(toks) == len(owner)
                _no_unk(tok, toks, f"{task.name} episode")


def test_specials_and_pad(tok):
    assert tok.pad_id == 0
    assert tok.vocab[0] == "<pad>"
    assert tok.vocab[:len(SPECIALS)] == list(SPECIALS)
    for s in ("<pad>", "<unk>", "<bos>", "<call>", "</call>", "<obs>", "</obs>", "<nl>"):
        assert s in tok.index
    assert len(set(tok.vocab)) == len(tok.vocab)
    assert tok.encode(["definitely-not-a-token"]) == [tok.unk_id]


def test_encode_decode_round_trip(tok, all_tasks):
    task = all_tasks[7]
    toks = CodeEnv(task, "alpha").reset() + call_tokens("read") + ["<obs>"] + \
        source_observation(task, "fix_range", "alpha") + ["</obs>"] + call_tokens("edit", "fix_range")
    ids = tok.encode(toks)
    assert tok.decode(ids) == " ".join(toks)
    assert tok.encode(tok.decode(ids)) == ids           # a string is split on whitespace
    assert tok.decode(torch.tensor(ids)) == " ".join(toks)
    every = list(range(len(tok)))
    assert tok.encode(tok.decode(every).split(" ")) == every


def test_vocabulary_and_hash_are_deterministic(tok):
    again = build_tokenizer(make_tasks("all"))
    shuffled = build_tokenizer(list(reversed(make_tasks("all"))))
    assert again.vocab == tok.vocab == shuffled.vocab
    assert again.hash == tok.hash == shuffled.hash
    assert isinstance(tok.hash, str) and len(tok.hash) >= 8
    smaller = build_tokenizer(make_tasks("train"))
    assert smaller.hash != tok.hash


def test_json_round_trip(tok):
    text = tok.to_json()
    back = Tokenizer.from_json(text)
    assert back.vocab == tok.vocab
    assert back.hash == tok.hash
    assert back.pad_id == tok.pad_id and back.unk_id == tok.unk_id
    assert back.to_json() == text


def test_bad_vocabularies_are_rejected():
    with pytest.raises(ValueError, match="special"):
        Tokenizer(["a", "b"])
    with pytest.raises(ValueError, match="duplicate"):
        Tokenizer(list(SPECIALS) + ["x", "x"])
