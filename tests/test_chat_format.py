"""Qwen3's chat template as the gym's conversation (agentrl.env.chat, agentrl.env.toolcalls): the strict tool-call
parser never crashes and calls everything but one well-formed call malformed; the tool-response block is the
template's own (a block that loses the `\\n` after `<|im_end|>`, or history re-rendered by the template, fails the
token-in/token-out assertions); the small Qwen3 plays the gym through it with the sampler and trainer agreeing."""
from pathlib import Path

import pytest
import torch

from agentrl.env.toolcalls import MALFORMED, call_text, parse_tool_call

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "data" / "tokenizers" / "qwen3"
needs_tokenizer = pytest.mark.usefixtures("qwen3_tokenizer")   # fails, never skips, when it is missing


@pytest.mark.parametrize("name, args, call", [
    ("read", {}, ["<call>", "read", "</call>"]), ("test", {}, ["<call>", "test", "</call>"]),
    ("submit", {}, ["<call>", "submit", "</call>"]),
    ("edit", {"op": "fix_range"}, ["<call>", "edit", "fix_range", "</call>"]),
    ("edit", {"op": "hardcode_tests"}, ["<call>", "edit", "hardcode_tests", "</call>"])])
def test_a_well_formed_call_is_the_gyms_call(name, args, call):
    assert parse_tool_call(call_text(name, args) + "<|im_end|>") == call
    assert parse_tool_call("  " + call_text(name, args) + "\n") == call


BAD = {
    "prose": "I will read the source first.",
    "prose around a call": "Let me look. " + call_text("read", {}),
    "truncated json": '<tool_call>\n{"name": "edit", "arguments": {"op": "fix_ra',
    "unclosed block": '<tool_call>\n{"name": "read", "arguments": {}}\n',
    "broken json": '<tool_call>\n{"name": "read", "arguments": {}\n</tool_call>',
    "unknown tool": call_text("delete", {}),
    "extra argument": call_text("read", {"path": "x"}),
    "missing argument": call_text("edit", {}),
    "extra key": '<tool_call>\n{"name": "read", "arguments": {}, "id": 1}\n</tool_call>',
    "wrong type": call_text("edit", {"op": 3}),
    "arguments not an object": '<tool_call>\n{"name": "read", "arguments": []}\n</tool_call>',
    "name not a string": '<tool_call>\n{"name": ["read"], "arguments": {}}\n</tool_call>',
    "unknown op": call_text("edit", {"op": "rewrite"}),
    "two calls": call_text("read", {}) + "\n" + call_text("test", {}),
    "call inside a think block": "<think>\n" + call_text("read", {}) + "\n</think>\n\n",
    "think then call": "<think>\nhmm\n</think>\n\n" + call_text("read", {}),
    "not json at all": "<tool_call>read</tool_call>",
    "a json list": "<tool_call>[1, 2]</tool_call>",
    "empty": "",
}


@pytest.mark.parametrize("label", sorted(BAD))
def test_anything_else_is_a_malformed_call(label):
    assert parse_tool_call(BAD[label]) == MALFORMED


def test_the_gym_counts_a_malformed_call_as_invalid_and_the_turn_is_used(train_tasks):
    from agentrl.env.gym.environment import make_env_factory
    env = make_env_factory()(train_tasks[0], torch.Generator().manual_seed(0))
    env.reset()
    assert env.step(parse_tool_call(BAD["two calls"])) is not None
    assert env.info["n_invalid"] == 1 and env.info["n_turns"] == 1


def test_the_parser_never_raises():
    g = torch.Generator().manual_seed(0)
    alphabet = list('<>/{}[]":, \n') + ["tool_call", "name", "arguments", "edit", "op", "read", "<think>", "null",
                                        "1e999", "\\u0000", "true"]
    for _ in range(2000):
        n = int(torch.randint(0, 30, (1,), generator=g))
        text = "".join(alphabet[int(i)] for i in torch.randint(len(alphabet), (n,), generator=g))
        assert isinstance(parse_tool_call(text), list)


# ---------------------------------------------------------------- the real template (slow: transformers)

@pytest.fixture(scope="module")
def chat():
    from agentrl.backends.qwen3 import transformers
    from agentrl.env.chat import Qwen3ToolChat
    tokenizer = transformers().AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    return Qwen3ToolChat(tokenizer)   # verify() ran at start-up


@pytest.mark.slow
@needs_tokenizer
def test_the_tool_response_block_keeps_the_newline_after_im_end(chat):
    assert chat.block_head.startswith("\n<|im_start|>user\n<tool_response>\n")
    assert chat.block_tail.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.slow
@needs_tokenizer
def test_a_block_that_loses_the_newline_fails_the_startup_assertion(chat):
    from agentrl.env.chat import Qwen3ToolChat, TokenInTokenOutError

    class CutAfterNewline(Qwen3ToolChat):   # verl issue 6501: the `\n` left with the history, never sampled
        def tool_block(self):
            head, tail = super().tool_block()
            return head[1:], tail
    with pytest.raises(TokenInTokenOutError, match="not the template's own"):
        CutAfterNewline(chat.tokenizer)


@pytest.mark.slow
@needs_tokenizer
def test_rerendering_the_history_is_not_the_sampled_conversation(chat, train_tasks):
    """Two turns played token-in/token-out, then the same conversation re-rendered by the template: the re-render
    drops the first turn's empty think block, so it would rewrite sampled ids, and assert_extends refuses it."""
    from agentrl.env.chat import TokenInTokenOutError, observation_text
    from agentrl.env.gym.environment import make_env_factory
    env = make_env_factory()(train_tasks[0], torch.Generator().manual_seed(0))
    ids = chat.prompt(env)
    turn = chat.turn_ids("read", {})
    ids = chat.assert_extends(ids, ids + turn)
    obs = env.step(chat.action(turn))
    ids = chat.assert_extends(ids, ids + chat.reply(obs, closed=True))
    messages = [chat.user_message(env.name),
                {"role": "assistant", "content": "", "tool_calls": [{"type": "function",
                                                                     "function": {"name": "read", "arguments": {}}}]},
                {"role": "tool", "content": observation_text(obs)}]
    rerendered = chat.encode(chat.render(messages, generation_prompt=True))
    assert len(rerendered) == len(ids) - 4   # the first turn's `<think>\n\n</think>\n\n` is gone
    with pytest.raises(TokenInTokenOutError, match="rewrote the history"):
        chat.assert_extends(ids, rerendered)


@pytest.mark.slow
@needs_tokenizer
def test_a_cut_off_turn_is_closed_by_the_environment(chat):
    assert chat.reply(["<obs>", "edited", "</obs>"], closed=False)[0] == chat.stop_id
    assert chat.reply(["<obs>", "edited", "</obs>"], closed=True)[0] != chat.stop_id


@pytest.mark.slow
@needs_tokenizer
def test_the_small_qwen3_plays_the_gym_through_the_template(chat, train_tasks, tmp_path):
    """Whole episodes sampled by the backend's cached sampler in the chat format: sampled ids kept as sampled, the
    sampler-trainer gap at most 1e-5 nats per token, and every episode ends on the policy's own token."""
    from agentrl.backends.qwen3 import make_small_qwen3
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.rl.rollout import OWNER, collate, sample_episodes
    from agentrl.rl.trainer import real_log_probs
    model = make_small_qwen3(tmp_path / "m", torch.Generator().manual_seed(0), TOKENIZER)
    g = torch.Generator().manual_seed(1)
    envs = [make_env_factory(max_turns=3)(t, g) for t in train_tasks[:3] for _ in range(2)]
    trajs = sample_episodes(model, envs, chat, g, 1.0, max_call_tokens=6)
    assert all(t.owner[-1] == OWNER["policy"] for t in trajs)
    assert all(t.record.malformed == t.record.turns == 3 for t in trajs)   # a random init calls no tool
    batch = collate(trajs, chat.pad_id)
    gap = (real_log_probs(model, batch) - batch["sample_logp"]).abs() * batch["action_mask"]
    assert float(gap.max()) <= 1e-5
