"""The generic-tools environment (agentrl.env.coding) in Qwen3's chat template, as a conversation format and an
environment the project's rollout, trainer and evaluation drive.

- `Qwen3CodingChat`: Qwen3ToolChat (agentrl.env.chat: prompt rendered once, sampled turns kept as sampled, each
  observation appended as the template's own tool-response block, the start-up assertion) with the four generic
  tools' schemas (Read, Edit, Write, Bash) and the episode's system and user messages. A turn with one
  `<tool_call>{...}</tool_call>` is that call (its arguments checked by the environment: anything wrong is a
  malformed call that uses the turn); a turn without a tool call is the final answer.
- `ChatToolsEnv`: a ToolsEnv whose `step` takes the format's action, timing the steps that ran the sandbox; its
  `record()` is the ToolsEnv's.
"""
from __future__ import annotations

import json
import re
import time

from agentrl.env.chat import END_OF_TURN, Qwen3ToolChat, observation_text
from agentrl.env.coding.environment import make_tools_env_factory
from agentrl.env.coding.schemas import TOOL_SCHEMAS

_BLOCK = re.compile(r"\A<tool_call>(.*)</tool_call>\Z", re.S)
MALFORMED_CALL = {"malformed": True}   # refused by agentrl.env.coding.schemas.check_call: a malformed call


class Qwen3CodingChat(Qwen3ToolChat):
    """Qwen3's chat template with the generic coding tools."""

    def render(self, messages: list[dict], generation_prompt: bool) -> str:
        return self.tokenizer.apply_chat_template(messages, tools=TOOL_SCHEMAS, tokenize=False,
                                                  add_generation_prompt=generation_prompt, enable_thinking=False)

    def prompt(self, env) -> list[int]:
        return self.encode(self.render(env.reset(), generation_prompt=True))

    def action(self, turn: list[int]) -> tuple[str, object]:
        """("call", {"name", "arguments"}) for a turn with a tool call, ("answer", text) for one without."""
        text = self.decode(turn)
        if text.endswith(END_OF_TURN):
            text = text[:-len(END_OF_TURN)]
        text = text.strip()
        if "<tool_call>" not in text and "</tool_call>" not in text and "<think>" not in text:
            return "answer", text
        block = _BLOCK.match(text)
        if block is None or text.count("<tool_call>") != 1:
            return "call", MALFORMED_CALL
        try:
            call = json.loads(block.group(1))
        except ValueError:
            return "call", MALFORMED_CALL
        return "call", call if isinstance(call, dict) and set(call) == {"name", "arguments"} else MALFORMED_CALL

    def reply(self, obs, closed: bool) -> list[int]:
        text = obs if isinstance(obs, str) else observation_text(obs)
        ids = self.encode(self.block_head + text + self.block_tail)
        return ids if closed else [self.stop_id] + ids

    def answer_ids(self, text: str) -> list[int]:
        return self.encode(text) + [self.stop_id]


class SandboxClock:
    """Seconds spent in environment steps that ran model-written code in the sandbox (test runs, scripts, the
    final grade)."""

    def __init__(self):
        self.seconds = 0.0
        self.runs = 0


class ChatToolsEnv:
    """A ToolsEnv driven by Qwen3CodingChat actions."""

    def __init__(self, env, clock: SandboxClock):
        self.env, self.clock = env, clock
        self.task, self.name = env.task, env.name

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


def make_chat_tools_env_factory(max_turns: int, clock: SandboxClock):
    factory = make_tools_env_factory(max_turns)
    return lambda task, generator: ChatToolsEnv(factory(task, generator), clock)
