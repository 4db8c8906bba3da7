"""A chat template as the gym's conversation (agentrl.env.chat, agentrl.env.gym.chat): turns are parsed as Qwen's own
tool parsers read them (text before a call is content; one call per turn); everything the format needs is read off
the template (Qwen3's, with its tools block and thinking switch, and plain ChatML, without either); the
tool-response block is the template's own (a block that loses the `\\n` after the end-of-turn token, or history
re-rendered by the template, fails the token-in/token-out assertions); the small Qwen3 plays the gym through it with
the sampler and trainer agreeing."""
from pathlib import Path

import pytest
import torch

from agentrl.env.chat import call_text, parse_turn
from agentrl.env.gym.chat import MALFORMED, gym_call

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "data" / "tokenizers" / "qwen3"
needs_tokenizer = pytest.mark.usefixtures("qwen3_tokenizer")   # fails, never skips, when it is missing
# SmolLM2-135M-Instruct's template: plain ChatML, no tools block, no thinking switch
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\n"
          "You are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def gym_action(text: str) -> list[str]:
    kind, call = parse_turn(text, "<|im_end|>")
    return gym_call(call) if kind == "call" else MALFORMED


@pytest.mark.parametrize("name, args, call", [
    ("read", {}, ["<call>", "read", "</call>"]), ("test", {}, ["<call>", "test", "</call>"]),
    ("submit", {}, ["<call>", "submit", "</call>"]),
    ("edit", {"op": "fix_range"}, ["<call>", "edit", "fix_range", "</call>"]),
    ("edit", {"op": "hardcode_tests"}, ["<call>", "edit", "hardcode_tests", "</call>"])])
def test_a_well_formed_call_is_the_gyms_call(name, args, call):
    assert gym_action(call_text(name, args) + "<|im_end|>") == call
    assert gym_action("  " + call_text(name, args) + "\n") == call
    assert gym_action("Let me look at it first.\n" + call_text(name, args)) == call   # content before: fine
    assert gym_action(call_text(name, args) + "\nDone.") == call                        # text after: ignored


BAD = {
    "prose": "I will read the source first.",
    "truncated json": '<tool_call>\n{"name": "edit", "arguments": {"op": "fix_ra',
    "unclosed block": '<tool_call>\n{"name": "read", "arguments": {}}\n',
    "closing tag only": '{"name": "read", "arguments": {}}</tool_call>',
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
    "not json at all": "<tool_call>read</tool_call>",
    "a json list": "<tool_call>[1, 2]</tool_call>",
    "empty": "",
}


@pytest.mark.parametrize("label", sorted(BAD))
def test_anything_else_is_a_malformed_call(label):
    assert gym_action(BAD[label]) == MALFORMED


def test_what_a_turn_is_read_as():
    assert parse_turn("All fixed.<|im_end|>", "<|im_end|>") == ("answer", "All fixed.")
    assert parse_turn(BAD["two calls"], "<|im_end|>") == ("malformed", "two calls in one turn")
    assert parse_turn(BAD["unclosed block"], "<|im_end|>") == ("malformed", "an unclosed <tool_call>")
    kind, call = parse_turn("<think>\nhmm\n</think>\n\n" + call_text("read", {}), "<|im_end|>")
    assert kind == "call" and call == {"name": "read", "arguments": {}}   # a think block before is content


def test_the_gym_counts_a_malformed_call_as_invalid_and_the_turn_is_used(train_tasks):
    from agentrl.env.gym.environment import make_env_factory
    env = make_env_factory()(train_tasks[0], torch.Generator().manual_seed(0))
    env.reset()
    assert env.step(gym_action(BAD["two calls"])) is not None
    assert env.info["n_invalid"] == 1 and env.info["n_turns"] == 1


def test_the_parser_never_raises():
    g = torch.Generator().manual_seed(0)
    alphabet = list('<>/{}[]":, \n') + ["tool_call", "name", "arguments", "edit", "op", "read", "<think>", "null",
                                        "1e999", "\\u0000", "true", "<tool_call>", "</tool_call>"]
    for _ in range(2000):
        n = int(torch.randint(0, 30, (1,), generator=g))
        text = "".join(alphabet[int(i)] for i in torch.randint(len(alphabet), (n,), generator=g))
        assert isinstance(gym_action(text), list)


# ---------------------------------------------------------------- the real templates (slow: transformers)

def tokenizer(template: str | None = None):
    from agentrl.backends.hf import transformers
    tok = transformers().AutoTokenizer.from_pretrained(TOKENIZER, local_files_only=True)
    if template is not None:
        tok.chat_template = template
    return tok


@pytest.fixture(scope="module")
def chat():
    from agentrl.env.gym.chat import GymToolChat
    return GymToolChat(tokenizer())   # verify() ran at start-up


@pytest.fixture(scope="module")
def chatml():
    from agentrl.env.gym.chat import GymToolChat
    return GymToolChat(tokenizer(CHATML))


@pytest.mark.slow
@needs_tokenizer
def test_qwen3s_template_is_read_as_tools_block_and_thinking_switch(chat):
    assert chat.native_tools and chat.thinking_switch and chat.end_of_turn == "<|im_end|>"
    assert chat.stop_id == chat.tokenizer.convert_tokens_to_ids("<|im_end|>")
    assert chat.block_head.startswith("\n<|im_start|>user\n<tool_response>\n")
    assert chat.block_tail.endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


@pytest.mark.slow
@needs_tokenizer
def test_plain_chatml_gets_the_tools_in_its_system_message(chat, chatml):
    """SmolLM2's template takes no tools: the schemas go into the system message in Qwen3's words, a call is the
    assistant's content, a tool response is the template's own `tool` turn; the start-up assertion holds."""
    assert not chatml.native_tools and not chatml.thinking_switch and chatml.end_of_turn == "<|im_end|>"
    text = chatml.render(chatml.messages_for("golf"), generation_prompt=True)
    assert text.startswith("<|im_start|>system\n# Tools\n") and '"name": "edit"' in text
    assert "helpful AI assistant" not in text   # our system message replaces the template's default one
    assert text.endswith("Repair the Python function `golf` so that its hidden tests pass.<|im_end|>\n"
                         "<|im_start|>assistant\n")
    assert chatml.block_head == "\n<|im_start|>tool\n" and chatml.block_tail == "<|im_end|>\n<|im_start|>assistant\n"
    assert chatml.hash != chat.hash   # checkpoints are refused across templates


@pytest.mark.slow
@needs_tokenizer
def test_a_template_that_cannot_drive_the_format_is_one_line():
    from agentrl.env.chat import TemplateError
    from agentrl.env.gym.chat import GymToolChat
    no_stop = "{% for m in messages %}{{ m['role'] + ': ' + m['content'] + '\n' }}{% endfor %}"
    with pytest.raises(TemplateError, match="not with a special token the model could stop on"):
        GymToolChat(tokenizer(no_stop))
    no_tool = CHATML.replace("{% for message in messages %}", "{% for message in messages %}{% if message['role'] =="
                             " 'tool' %}{{ raise_exception('no tools here') }}{% endif %}")
    with pytest.raises(TemplateError, match="cannot render a tool message"):
        GymToolChat(tokenizer(no_tool))


@pytest.mark.slow
@needs_tokenizer
def test_a_block_that_loses_the_newline_fails_the_startup_assertion(chat):
    from agentrl.env.chat import TokenInTokenOutError
    from agentrl.env.gym.chat import GymToolChat

    class CutAfterNewline(GymToolChat):   # verl issue 6501: the `\n` left with the history, never sampled
        def tool_block(self):
            head, tail = super().tool_block()
            return head[1:], tail
    for template in (None, CHATML):
        with pytest.raises(TokenInTokenOutError, match="not the template's own"):
            CutAfterNewline(tokenizer(template))


@pytest.mark.slow
@needs_tokenizer
def test_rerendering_the_history_is_not_the_sampled_conversation(chat, train_tasks):
    """Two turns played token-in/token-out, then the same conversation re-rendered by the template: the re-render
    drops the first turn's empty think block, so it would rewrite sampled ids, and assert_extends refuses it."""
    from agentrl.env.chat import TokenInTokenOutError
    from agentrl.env.gym.chat import observation_text
    from agentrl.env.gym.environment import make_env_factory
    env = make_env_factory()(train_tasks[0], torch.Generator().manual_seed(0))
    ids = chat.prompt(env)
    turn = chat.turn_ids("read", {})
    ids = chat.assert_extends(ids, ids + turn)
    obs = env.step(chat.action(turn))
    ids = chat.assert_extends(ids, ids + chat.reply(obs, closed=True))
    messages = chat.messages_for(env.name) + [chat.assistant_call("read", {}),
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
@pytest.mark.parametrize("template", [None, CHATML], ids=["qwen3", "chatml"])
def test_the_small_qwen3_plays_the_gym_through_the_template(template, train_tasks, tmp_path):
    """Whole episodes sampled by the backend's cached sampler in the chat format: sampled ids kept as sampled, the
    sampler-trainer gap at most 1e-5 nats per token, and every episode ends on the policy's own token."""
    from agentrl.backends.hf import make_small_model
    from agentrl.env.gym.chat import GymToolChat
    from agentrl.env.gym.environment import make_env_factory
    from agentrl.rl.rollout import OWNER, collate, sample_episodes
    from agentrl.rl.trainer import real_log_probs
    chat = GymToolChat(tokenizer(template))
    model = make_small_model(tmp_path / "m", torch.Generator().manual_seed(0), TOKENIZER)
    g = torch.Generator().manual_seed(1)
    envs = [make_env_factory(max_turns=3)(t, g) for t in train_tasks[:3] for _ in range(2)]
    trajs = sample_episodes(model, envs, chat, g, 1.0, max_call_tokens=6)
    assert all(t.owner[-1] == OWNER["policy"] for t in trajs)
    assert all(t.record.malformed == t.record.turns == 3 for t in trajs)   # a random init calls no tool
    batch = collate(trajs, chat.pad_id)
    gap = (real_log_probs(model, batch) - batch["sample_logp"]).abs() * batch["action_mask"]
    assert float(gap.max()) <= 1e-5
