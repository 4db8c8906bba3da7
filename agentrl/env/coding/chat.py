"""The coding-tools environment (agentrl.env.coding) in a model's chat template, as a conversation format and an
environment the project's rollout, trainer and evaluation drive.

- `CodingToolChat`: a ToolChat (agentrl.env.chat: prompt rendered once, sampled turns kept as sampled, each
  observation appended as the template's own tool-response block, the start-up assertion) with the four generic
  tools' schemas (Read, Edit, Write, Bash) and the episode's system and user messages. A turn with one
  `<tool_call>{...}</tool_call>` is that call (its arguments checked by the environment: anything wrong is a
  malformed call that uses the turn); a turn without a tool call is the final answer.
- `ChatToolsEnv`: a ToolsEnv whose `step` takes the format's action, timing the steps that ran the sandbox; its
  `record()` is the ToolsEnv's.
"""
from __future__ import annotations

import time

from agentrl.env.chat import ToolChat
from agentrl.env.coding.environment import make_tools_env_factory, opening_messages
from agentrl.env.coding.schemas import REPO_ROOT, TOOL_SCHEMAS

MALFORMED_CALL = {"malformed": True}   # refused by agentrl.env.coding.schemas.check_call: a malformed call


class CodingToolChat(ToolChat):
    """A chat template with the generic coding tools."""

    tools = TOOL_SCHEMAS

    def messages_for(self, name: str) -> list[dict]:
        return opening_messages(name)

    def probe_call(self) -> tuple[str, dict]:
        return "Read", {"file_path": f"{REPO_ROOT}/f.py"}

    def prompt(self, env) -> list[int]:
        return self.encode(self.render(env.reset(), generation_prompt=True))

    def action(self, turn: list[int]) -> tuple[str, object]:
        """("call", {"name", "arguments"}) for a turn with a tool call, ("answer", text) for one without."""
        kind, payload = self.parse(turn)
        return ("call", MALFORMED_CALL) if kind == "malformed" else (kind, payload)


class SandboxClock:
    """Seconds spent in environment steps that ran model-written code in the sandbox (test runs, scripts, the
    final grade)."""

    def __init__(self):
        self.seconds = 0.0
        self.runs = 0


class ChatToolsEnv:
    """A ToolsEnv driven by CodingToolChat actions."""

    def __init__(self, env, clock: SandboxClock):
        self.env, self.clock = env, clock
        self.task, self.name, self.operands = env.task, env.name, env.operands

    @property
    def done(self) -> bool:
        return self.env.done

    @property
    def reward(self) -> float:
        return self.env.reward

    def record(self):
        return self.env.record()

    def reset(self) -> list[dict]:
        return self.env.reset()

    def step(self, action) -> str | None:
        kind, payload = action
        info = self.env.info
        runs = info["test_runs"] + info["script_runs"]
        start = time.perf_counter()
        obs = self.env.step(None, payload) if kind == "answer" else self.env.step(payload)
        if self.env.done or info["test_runs"] + info["script_runs"] > runs:
            self.clock.seconds += time.perf_counter() - start
            self.clock.runs += 1
        return obs


def make_chat_tools_env_factory(max_turns: int, clock: SandboxClock, p_rename_operands: float = 0.0):
    factory = make_tools_env_factory(max_turns, p_rename_operands=p_rename_operands)
    return lambda task, generator: ChatToolsEnv(factory(task, generator), clock)
