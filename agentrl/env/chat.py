"""Qwen3's chat template with the gym's tools, as a conversation format (agentrl.env.formats), non-thinking mode.

Token-in/token-out with a real template. Qwen3's template is not prefix-preserving: rendering the conversation
after a tool call drops the empty `<think>\\n\\n</think>\\n\\n` of earlier assistant turns and re-serialises the
tool-call arguments. So history is never re-rendered: the prompt is rendered once, the policy's turns are kept as
sampled (ending on `<|im_end|>`, the stop token), and each tool result is appended as the ids of the template's own
tool-response block. That block is derived as the difference of two renderings, [user, assistant] and [user,
assistant, tool] with the generation prompt, cut after the last `<|im_end|>` of the first, so the `\\n` after
`<|im_end|>` belongs to the block (the model stops at `<|im_end|>` and never samples it). `verify` asserts at
start-up that prompt + turn + block ids equal the template's own tokenized renderings; `assert_extends` refuses a
conversation that rewrites what was sampled.
"""
from __future__ import annotations

import hashlib

from agentrl.env.gym.environment import END_OBS, NL, OBS
from agentrl.env.toolcalls import TOOL_SCHEMAS, call_text, parse_tool_call

END_OF_TURN, PAD = "<|im_end|>", "<|endoftext|>"
PLACEHOLDER = "\x00observation\x00"
# a reasoning text keeps the assistant turn rendered alike whether or not it is the last message (the template drops
# an empty think block only when the turn is not the last): the two renderings then differ by the tool block alone
_PROBE_TURN = {"role": "assistant", "content": "", "reasoning_content": "probe",
               "tool_calls": [{"type": "function", "function": {"name": "read", "arguments": {}}}]}


class TokenInTokenOutError(AssertionError):
    """Ids appended for a tool response are not the template's own, or appending rewrote sampled ids."""


def observation_text(obs: list[str]) -> str:
    """The gym's observation words as the text of a tool response (line breaks restored)."""
    words = [w for w in obs if w not in (OBS, END_OBS)]
    return " ".join(words).replace(f" {NL} ", "\n").replace(NL, "\n")


class Qwen3ToolChat:
    """The gym's episodes in Qwen3's chat template, the four tools as function schemas (agentrl.env.toolcalls)."""

    def __init__(self, tokenizer, verify_at_start: bool = True):
        self.tokenizer = tokenizer
        self.stop_id = tokenizer.convert_tokens_to_ids(END_OF_TURN)
        self.pad_id = tokenizer.convert_tokens_to_ids(PAD)
        vocab = "\n".join(f"{t}\t{i}" for t, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]))
        self.hash = hashlib.sha256((vocab + (tokenizer.chat_template or "")).encode()).hexdigest()[:16]
        self.block_head, self.block_tail = self.tool_block()
        if verify_at_start:
            self.verify()

    # ------------------------------------------------------------ rendering (the template's own text)

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=TOOL_SCHEMAS, tokenize=False,
                                                  add_generation_prompt=generation_prompt, enable_thinking=False)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    @staticmethod
    def user_message(name: str) -> dict:
        return {"role": "user", "content": f"Repair the Python function `{name}` so that its hidden tests pass."}

    def tool_block(self) -> tuple[str, str]:
        """The text the template puts around a tool response after an assistant turn, up to the next generation
        prompt: the difference of two renderings, cut after the first one's last `<|im_end|>`."""
        history = [self.user_message("f"), _PROBE_TURN]
        before = self.render(history, generation_prompt=False)
        after = self.render(history + [{"role": "tool", "content": PLACEHOLDER}], generation_prompt=True)
        cut = before[:before.rindex(END_OF_TURN) + len(END_OF_TURN)]
        if not after.startswith(cut):
            raise TokenInTokenOutError("the template renders the history differently once a tool response follows")
        head, sep, tail = after[len(cut):].partition(PLACEHOLDER)
        if not sep:
            raise TokenInTokenOutError("the template does not show the tool response verbatim")
        return head, tail

    # ------------------------------------------------------------ the conversation format

    def prompt(self, env) -> list[int]:
        env.reset()
        return self.encode(self.render([self.user_message(env.name)], generation_prompt=True))

    def action(self, turn: list[int]) -> list[str]:
        return parse_tool_call(self.decode(turn), END_OF_TURN)

    def reply(self, obs: list[str], closed: bool) -> list[int]:
        """The tool-response block's ids; a turn cut off at the token budget is first closed with `<|im_end|>`
        (an environment token, never trained on), as the template would have closed it."""
        ids = self.encode(self.block_head + observation_text(obs) + self.block_tail)
        return ids if closed else [self.stop_id] + ids

    def turn_ids(self, name: str, arguments: dict) -> list[int]:
        """A well-formed turn as the policy would sample it: the call's ids, then `<|im_end|>`."""
        return self.encode(call_text(name, arguments)) + [self.stop_id]

    @staticmethod
    def assert_extends(history: list[int], conversation: list[int]) -> list[int]:
        """The conversation after a turn, which must start with every id of `history` (what was sampled and
        conditioned on so far); re-tokenizing history with the template fails this."""
        if list(conversation[:len(history)]) != list(history):
            raise TokenInTokenOutError("the conversation rewrote the history it was sampled from")
        return list(conversation)

    # ------------------------------------------------------------ the start-up assertion

    def verify(self, observations=(["<obs>", "def", "f", "(", "x", ")", ":", "<nl>", "return", "x", "</obs>"],
                                   ["<obs>", "edited", "</obs>"])) -> None:
        """Raise TokenInTokenOutError unless (1) prompt + a sampled turn tokenize as the template renders
        [user, assistant]; (2) for each observation, the template's [user, assistant] history (as sampled: up to its
        `<|im_end|>`) + this format's tool-response ids tokenize as the template renders [user, assistant, tool]
        with the generation prompt."""
        user = self.user_message("f")
        prompt = self.encode(self.render([user], generation_prompt=True))
        turn = self.turn_ids("edit", {"op": "fix_range"})
        assistant = {"role": "assistant", "content": "",
                     "tool_calls": [{"type": "function",
                                     "function": {"name": "edit", "arguments": {"op": "fix_range"}}}]}
        whole = self.encode(self.render([user, assistant], generation_prompt=False))
        if whole[:len(prompt) + len(turn)] != prompt + turn:
            raise TokenInTokenOutError("prompt + sampled turn ids differ from the template's rendering of the turn")
        history = [user, _PROBE_TURN]
        before = self.render(history, generation_prompt=False)
        sampled = self.encode(before[:before.rindex(END_OF_TURN) + len(END_OF_TURN)])
        for obs in observations:
            expected = self.encode(self.render(history + [{"role": "tool", "content": observation_text(obs)}],
                                               generation_prompt=True))
            if sampled + self.reply(obs, closed=True) != expected:
                raise TokenInTokenOutError(f"the tool-response ids for {observation_text(obs)!r} are not the "
                                           "template's own (compare the block after <|im_end|>)")
