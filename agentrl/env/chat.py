"""A model's chat template with a set of tools, as a conversation format (agentrl.env.formats).

Everything the format needs is read off the tokenizer's own template at start-up, by rendering probes, never typed
in for one model family:

- the end-of-turn token (what the template writes after an assistant message: `<|im_end|>` for ChatML);
- whether the template takes the tools itself (Qwen3's renders a `# Tools` block from `tools=`); if not (plain
  ChatML, SmolLM2's), the tools go into the system message in the same Hermes words Qwen3's block uses, and an
  assistant's call is rendered as its content;
- whether it has a thinking switch (`enable_thinking`, passed as False only to a template that reads it);
- the tool-response block, as the difference of two renderings (below).

Token-in/token-out. A template is not prefix-preserving in general (Qwen3's drops the empty think block of earlier
assistant turns and re-serialises tool-call arguments), so history is never re-rendered: the prompt is rendered
once, the policy's turns are kept as sampled (ending on the end-of-turn token, the stop token), and each tool result
is appended as the ids of the template's own tool-response block: the difference of the renderings [user,
assistant] and [user, assistant, tool] with the generation prompt, cut after the first one's last end-of-turn
token, so what follows that token belongs to the block (the model stops at it and never samples it). `verify`
asserts at start-up that prompt + turn + block ids equal the template's own tokenized renderings; a template for
which they do not (or that cannot render a tool message) is refused in one line before any compute.

Parsing a turn (`parse_turn`), as Qwen's own tool parsers read one: text before the first `<tool_call>` is content
(it costs tokens but is not an error); one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block is the
call; text after its closing tag is ignored; a second call in the same turn makes the turn malformed (the
environments apply one call per turn, and dropping one silently would train on a call that was never made); a turn
without any `<tool_call>` is an answer (the coding environment's final answer; a malformed call in the gym).
"""
from __future__ import annotations

import hashlib
import json
import re

PLACEHOLDER = "\x00observation\x00"
_PROBE_TEXT = "\x00turn\x00"
_BLOCK = re.compile(r"<tool_call>(.*?)</tool_call>", re.S)


class TokenInTokenOutError(AssertionError):
    """Ids appended for a tool response are not the template's own, or appending rewrote sampled ids."""


class TemplateError(ValueError):
    """A chat template this format cannot drive (named in one line before any compute)."""


def call_text(name: str, arguments: dict) -> str:
    """A call as Qwen3's template renders an assistant tool call (and the Hermes system prompt asks for)."""
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(arguments, ensure_ascii=False) + \
        '}\n</tool_call>'


def hermes_system(tools: list[dict], system: str | None = None) -> str:
    """The tools block Qwen3's template writes, as a system message for a template without one."""
    lines = [system + "\n"] if system else []
    lines.append("# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided "
                 "with function signatures within <tools></tools> XML tags:\n<tools>")
    lines += [json.dumps(t, ensure_ascii=False) for t in tools]
    lines.append("</tools>\n\nFor each function call, return a json object with function name and arguments within "
                 "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                 "<args-json-object>}\n</tool_call>")
    return "\n".join(lines)


def parse_turn(text: str, end_of_turn: str) -> tuple[str, object]:
    """A turn's text -> ("call", {"name", "arguments"}), ("answer", content), or ("malformed", why)."""
    if text.endswith(end_of_turn):
        text = text[:-len(end_of_turn)]
    if "<tool_call>" not in text:
        return ("malformed", "a closing </tool_call> without its opening tag") if "</tool_call>" in text \
            else ("answer", text.strip())
    blocks = _BLOCK.findall(text)
    if len(blocks) != 1 or text.count("<tool_call>") != 1:
        return "malformed", "two calls in one turn" if len(blocks) > 1 else "an unclosed <tool_call>"
    try:
        call = json.loads(blocks[0])
    except ValueError:
        return "malformed", "the call is not JSON"
    if not isinstance(call, dict) or set(call) != {"name", "arguments"} or not isinstance(call["name"], str) \
            or not isinstance(call["arguments"], dict):
        return "malformed", "the call is not {\"name\": ..., \"arguments\": {...}}"
    return "call", call


def value_span(text: str, key: str) -> tuple[int, int] | None:
    """The character span of the first `"key": "value"` string value in text, or None."""
    match = re.search(r'"' + re.escape(key) + r'"\s*:\s*"([^"]*)"', text)
    return match.span(1) if match else None


class ToolChat:
    """A tokenizer's chat template with `tools` (function schemas). Subclasses give the episode's messages
    (`messages(env)`) and turn a parsed turn into the environment's action (`action`)."""

    tools: list[dict] = []
    decision_arguments: tuple = ()   # argument keys whose values decide the action, beside the tool's name

    def __init__(self, tokenizer, verify_at_start: bool = True):
        self.tokenizer = tokenizer
        if not getattr(tokenizer, "chat_template", None):
            raise TemplateError("the tokenizer has no chat template")
        template = tokenizer.chat_template
        self.thinking_switch = "enable_thinking" in template
        self.end_of_turn = self._end_of_turn()
        self.stop_id = tokenizer.convert_tokens_to_ids(self.end_of_turn)
        pad = tokenizer.pad_token_id
        self.pad_id = pad if pad is not None else self.stop_id
        self.native_tools = self._renders_tools()
        self.reasoning = "reasoning_content" in template
        vocab = "\n".join(f"{t}\t{i}" for t, i in sorted(tokenizer.get_vocab().items(), key=lambda kv: kv[1]))
        tools = json.dumps(self.tools, sort_keys=True)
        self.hash = hashlib.sha256((vocab + template + tools).encode()).hexdigest()[:16]
        self.block_head, self.block_tail = self.tool_block()
        if verify_at_start:
            self.verify()

    # ------------------------------------------------------------ what the template does, read off renderings

    def _apply(self, messages: list[dict], generation_prompt: bool, tools=None) -> str:
        kwargs = {"enable_thinking": False} if self.thinking_switch else {}
        try:
            return self.tokenizer.apply_chat_template(messages, tools=tools, tokenize=False,
                                                      add_generation_prompt=generation_prompt, **kwargs)
        except Exception as exc:   # a Jinja error: the template cannot render these messages
            raise TemplateError(f"the chat template cannot render a {messages[-1]['role']} message "
                                f"({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") from None

    def _end_of_turn(self) -> str:
        text = self._apply([{"role": "user", "content": "u"}, {"role": "assistant", "content": _PROBE_TEXT}], False)
        after = text.split(_PROBE_TEXT, 1)[-1]
        special = sorted(self.tokenizer.all_special_tokens + list(self.tokenizer.get_added_vocab()), key=len,
                         reverse=True)
        token = next((t for t in special if after.lstrip(" ").startswith(t)), None)
        if token is None:
            raise TemplateError(f"the chat template ends an assistant turn with {after[:20]!r}, not with a special "
                                "token the model could stop on")
        return token

    def _renders_tools(self) -> bool:
        probe = [{"type": "function", "function": {"name": "probe_tool_name", "description": "",
                                                   "parameters": {"type": "object", "properties": {}}}}]
        return "probe_tool_name" in self._apply([{"role": "user", "content": "u"}], True, probe)

    # ------------------------------------------------------------ rendering (the template's own text)

    def with_tools(self, messages: list[dict]) -> list[dict]:
        """The messages as rendered: a template without a tools block gets the tools in the system message."""
        if self.native_tools:
            return messages
        if messages and messages[0]["role"] == "system":
            return [{"role": "system", "content": hermes_system(self.tools, messages[0]["content"])}] + messages[1:]
        return [{"role": "system", "content": hermes_system(self.tools)}] + messages

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self._apply(self.with_tools(messages), generation_prompt, self.tools if self.native_tools else None)

    def encode(self, text: str) -> list[int]:
        return self.tokenizer.encode(text, add_special_tokens=False)

    def decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def assistant_call(self, name: str, arguments: dict, reasoning: str | None = None) -> dict:
        """An assistant message holding one tool call, as this template renders one."""
        if self.native_tools:
            message = {"role": "assistant", "content": "",
                       "tool_calls": [{"type": "function", "function": {"name": name, "arguments": arguments}}]}
        else:
            message = {"role": "assistant", "content": call_text(name, arguments)}
        if reasoning is not None and self.reasoning:
            message["reasoning_content"] = reasoning
        return message

    def probe_messages(self) -> list[dict]:
        """A conversation up to one assistant call, for the start-up renderings."""
        return self.messages_for("f") + [self.assistant_call(*self.probe_call(), reasoning="probe")]

    def tool_block(self) -> tuple[str, str]:
        """The text the template puts around a tool response after an assistant turn, up to the next generation
        prompt: the difference of two renderings, cut after the first one's last end-of-turn token. (A reasoning
        text keeps a thinking template's assistant turn rendered alike whether or not it is the last message.)"""
        history = self.probe_messages()
        before = self.render(history, generation_prompt=False)
        after = self.render(history + [{"role": "tool", "content": PLACEHOLDER}], generation_prompt=True)
        cut = before[:before.rindex(self.end_of_turn) + len(self.end_of_turn)]
        if not after.startswith(cut):
            raise TokenInTokenOutError("the template renders the history differently once a tool response follows")
        head, sep, tail = after[len(cut):].partition(PLACEHOLDER)
        if not sep:
            raise TokenInTokenOutError("the template does not show the tool response verbatim")
        return head, tail

    # ------------------------------------------------------------ the conversation format

    def messages_for(self, name: str) -> list[dict]:
        """The opening messages of an episode on a function called `name` (without an environment)."""
        raise NotImplementedError

    def probe_call(self) -> tuple[str, dict]:
        raise NotImplementedError

    def observation(self, obs) -> str:
        return obs

    def prompt(self, env) -> list[int]:
        raise NotImplementedError

    def reply(self, obs, closed: bool) -> list[int]:
        """The tool-response block's ids; a turn cut off at the token budget is first closed with the end-of-turn
        token (an environment token, never trained on), as the template would have closed it."""
        ids = self.encode(self.block_head + self.observation(obs) + self.block_tail)
        return ids if closed else [self.stop_id] + ids

    def turn_ids(self, name: str, arguments: dict) -> list[int]:
        """A well-formed turn as the policy would sample it: the call's ids, then the end-of-turn token."""
        return self.encode(call_text(name, arguments)) + [self.stop_id]

    def answer_ids(self, text: str) -> list[int]:
        return self.encode(text) + [self.stop_id]

    def parse(self, turn: list[int]) -> tuple[str, object]:
        return parse_turn(self.decode(turn), self.end_of_turn)

    def decision_tokens(self, turn: list[int]) -> dict[str, list[int]]:
        """Where a sampled turn decides its action: {"name": positions, <argument>: positions} of the tokens that
        overlap the call's tool name and the values of `decision_arguments` ({} for a turn with no call). The rest
        of a call is fixed text (`<tool_call>{"name": "`, ...) whose entropy says nothing about exploration."""
        pieces = [self.decode([t]) for t in turn]
        text = "".join(pieces)
        start = text.find("<tool_call>")
        if start < 0:
            return {}
        ends, at = [], 0
        for piece in pieces:
            at += len(piece)
            ends.append(at)
        out = {}
        for key in ("name",) + tuple(self.decision_arguments):
            span = value_span(text[start:], key)
            if span is not None:
                lo, hi = span[0] + start, span[1] + start
                out[key] = [i for i, end in enumerate(ends) if end > lo and end - len(pieces[i]) < hi]
        return out

    @staticmethod
    def assert_extends(history: list[int], conversation: list[int]) -> list[int]:
        """The conversation after a turn, which must start with every id of `history` (what was sampled and
        conditioned on so far); re-tokenizing history with the template fails this."""
        if list(conversation[:len(history)]) != list(history):
            raise TokenInTokenOutError("the conversation rewrote the history it was sampled from")
        return list(conversation)

    # ------------------------------------------------------------ the start-up assertion

    def verify(self, observations=("def f(x):\n    return x", "edited")) -> None:
        """Raise TokenInTokenOutError unless (1) prompt + a sampled turn tokenize as the template renders the
        conversation with that turn; (2) for each observation, the template's history (as sampled: up to its
        end-of-turn token) + this format's tool-response ids tokenize as the template renders the history with the
        tool message and the generation prompt."""
        opening = self.messages_for("f")
        prompt = self.encode(self.render(opening, generation_prompt=True))
        name, arguments = self.probe_call()
        turn = self.turn_ids(name, arguments)
        whole = self.encode(self.render(opening + [self.assistant_call(name, arguments)], generation_prompt=False))
        if whole[:len(prompt) + len(turn)] != prompt + turn:
            raise TokenInTokenOutError("prompt + sampled turn ids differ from the template's rendering of the turn")
        history = self.probe_messages()
        before = self.render(history, generation_prompt=False)
        sampled = self.encode(before[:before.rindex(self.end_of_turn) + len(self.end_of_turn)])
        for obs in observations:
            expected = self.encode(self.render(history + [{"role": "tool", "content": obs}], generation_prompt=True))
            if sampled + self.reply(obs, closed=True) != expected:
                raise TokenInTokenOutError(f"the tool-response ids for {obs!r} are not the template's own "
                                           f"(compare the block after {self.end_of_turn})")
