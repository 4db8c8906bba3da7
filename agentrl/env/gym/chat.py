"""The gym's four tools in a model's chat template (agentrl.env.chat): their function schemas, the episode's user
message, the gym's observations as tool responses, and a parsed turn as the gym's call words.

A call is well formed only if its name is one of the four tools and its arguments are exactly the schema's (no
missing or extra key, `op` one of the ops); anything else (an answer without a call, broken JSON, an unknown tool,
two calls) is a call the gym cannot parse, and the turn is used up.
"""
from __future__ import annotations

from agentrl.env.chat import ToolChat
from agentrl.env.gym.environment import CALL, END_CALL, END_OBS, NL, OBS
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


def observation_text(obs: list[str]) -> str:
    """The gym's observation words as the text of a tool response (line breaks restored)."""
    words = [w for w in obs if w not in (OBS, END_OBS)]
    return " ".join(words).replace(f" {NL} ", "\n").replace(NL, "\n")


def gym_call(call: dict) -> list[str]:
    """A parsed {"name", "arguments"} -> the gym's call words (`<call> edit fix_range </call>`), or MALFORMED."""
    name, args = call["name"], call["arguments"]
    if name not in ARGUMENTS or set(args) != set(ARGUMENTS[name]):
        return MALFORMED
    if name == "edit":
        op = args["op"]
        return [CALL, "edit", op, END_CALL] if isinstance(op, str) and op in OPS else MALFORMED
    return [CALL, name, END_CALL]


def user_message(name: str) -> dict:
    return {"role": "user", "content": f"Repair the Python function `{name}` so that its hidden tests pass."}


class GymToolChat(ToolChat):
    """The gym's episodes in a chat template, the four tools as function schemas."""

    tools = TOOL_SCHEMAS
    decision_arguments = ("op",)

    def messages_for(self, name: str) -> list[dict]:
        return [user_message(name)]

    def probe_call(self) -> tuple[str, dict]:
        return "edit", {"op": "fix_range"}

    def observation(self, obs) -> str:
        return obs if isinstance(obs, str) else observation_text(obs)

    def prompt(self, env) -> list[int]:
        env.reset()
        return self.encode(self.render(self.messages_for(env.name), generation_prompt=True))

    def action(self, turn: list[int]) -> list[str]:
        kind, call = self.parse(turn)
        return gym_call(call) if kind == "call" else MALFORMED

    def verify(self, observations=(["<obs>", "def", "f", "(", "x", ")", ":", "<nl>", "return", "x", "</obs>"],
                                   ["<obs>", "edited", "</obs>"])) -> None:
        super().verify(tuple(observation_text(o) for o in observations))
