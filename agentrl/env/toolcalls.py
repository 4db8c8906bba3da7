"""The gym's four tools as function schemas, and the strict parser of a model's `<tool_call>` turn.

A turn is well formed only if, once the end-of-turn token is removed and surrounding whitespace stripped, it is
exactly one `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` block: the name one of the four tools, the
arguments exactly the schema's (no missing or extra key, the right type, `op` one of the ops). Anything else
(prose, truncated or broken JSON, an unknown tool, two calls, a think block in non-thinking mode) is a malformed
call: the gym sees a call it cannot parse and the turn is used up. The parser never raises.
"""
from __future__ import annotations

import json
import re

from agentrl.env.gym.environment import CALL, END_CALL
from agentrl.env.ops import OPS

MALFORMED = ["<malformed>"]   # a call the gym cannot parse (CodeEnv.parse -> None): an invalid call, one turn used

TOOL_SCHEMAS = [
    {"type": "function", "function": {
        "name": "read", "description": "Show the current source of the function to repair.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
    {"type": "function", "function": {
        "name": "test", "description": "Run the function's public tests and show which pass.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
    {"type": "function", "function": {
        "name": "edit", "description": "Apply one repair op to the function (one edit per episode).",
        "parameters": {"type": "object", "properties": {"op": {"type": "string", "enum": list(OPS)}},
                       "required": ["op"]}}},
    {"type": "function", "function": {
        "name": "submit", "description": "Submit the function as it is now; the episode ends.",
        "parameters": {"type": "object", "properties": {}, "required": []}}},
]
ARGUMENTS = {t["function"]["name"]: t["function"]["parameters"]["properties"] for t in TOOL_SCHEMAS}

_BLOCK = re.compile(r"\A<tool_call>(.*)</tool_call>\Z", re.S)


def call_text(name: str, arguments: dict) -> str:
    """A call as Qwen3's chat template renders an assistant tool call."""
    return '<tool_call>\n{"name": "' + name + '", "arguments": ' + json.dumps(arguments, ensure_ascii=False) + \
        '}\n</tool_call>'


def parse_tool_call(text: str, end_of_turn: str = "<|im_end|>") -> list[str]:
    """A turn's text -> the gym's call words (`<call> edit fix_range </call>`), or MALFORMED."""
    if text.endswith(end_of_turn):
        text = text[:-len(end_of_turn)]
    text = text.strip()
    if "<think>" in text or "</think>" in text or text.count("<tool_call>") != 1:
        return MALFORMED
    block = _BLOCK.match(text)
    if block is None:
        return MALFORMED
    try:
        call = json.loads(block.group(1))
    except ValueError:
        return MALFORMED
    if not isinstance(call, dict) or set(call) != {"name", "arguments"}:
        return MALFORMED
    name, args = call["name"], call["arguments"]
    if not isinstance(name, str) or name not in ARGUMENTS or not isinstance(args, dict):
        return MALFORMED
    schema = ARGUMENTS[name]
    if set(args) != set(schema):
        return MALFORMED
    if name == "edit":
        op = args["op"]
        if not isinstance(op, str) or op not in OPS:
            return MALFORMED
        return [CALL, "edit", op, END_CALL]
    return [CALL, name, END_CALL]
