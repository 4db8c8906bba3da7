"""Conversation formats: how an episode of the gym becomes token ids and how the policy's turn becomes a call.

A format gives the rollout
- `pad_id`, `stop_id` (the token that ends a policy turn) and `hash` (checkpoints are refused across formats);
- `prompt(env) -> ids`: the episode's opening;
- `action(turn_ids) -> call words`: the policy's turn as the gym's call (`<call> TOOL [ARG] </call>`); anything
  the gym cannot parse is a malformed call that uses up the turn;
- `reply(obs, closed) -> ids`: the observation as the ids appended after the turn (`closed`: the turn ended on
  `stop_id`, rather than being cut off at the token budget).
Ids are only ever appended: the ids a turn was sampled from are the ids trained on (token-in/token-out).

`GymWords` is the gym's own word-level conversation (TinyAgent's); agentrl.env.chat is Qwen3's chat template with
the gym's tools.
"""
from __future__ import annotations

from typing import Protocol

from agentrl.env.gym.environment import END_CALL


class ConversationFormat(Protocol):
    pad_id: int
    stop_id: int
    hash: str

    def prompt(self, env) -> list[int]: ...

    def action(self, turn: list[int]) -> list[str]: ...

    def reply(self, obs: list[str], closed: bool) -> list[int]: ...


class GymWords:
    """The gym's words: a turn is `<call> TOOL [ARG] </call>` (`</call>` ends it), a reply `<obs> ... </obs>`."""

    def __init__(self, tok):
        self.tok = tok
        self.pad_id, self.stop_id, self.hash = tok.pad_id, tok.id(END_CALL), tok.hash

    def prompt(self, env) -> list[int]:
        return self.tok.encode(env.reset())

    def action(self, turn: list[int]) -> list[str]:
        return [self.tok.vocab[t] for t in turn]

    def reply(self, obs: list[str], closed: bool) -> list[int]:
        return self.tok.encode(obs)


def conversation(fmt) -> ConversationFormat:
    """A conversation format as given, or the gym's words over a word-level tokenizer (what TinyAgent reads)."""
    return fmt if hasattr(fmt, "prompt") and hasattr(fmt, "reply") else GymWords(fmt)
