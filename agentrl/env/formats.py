"""Conversation formats: how an episode becomes token ids and how the policy's turn becomes an action.

A format gives the rollout
- `pad_id`, `stop_id` (the token that ends a policy turn) and `hash` (checkpoints are refused across formats);
- `prompt(env) -> ids`: the episode's opening;
- `action(turn_ids) -> the environment's action`: anything the environment cannot parse is a malformed call that
  uses up the turn;
- `reply(obs, closed) -> ids`: the observation as the ids appended after the turn (`closed`: the turn ended on
  `stop_id`, rather than being cut off at the token budget).
Ids are only ever appended: the ids a turn was sampled from are the ids trained on (token-in/token-out).

Each environment names its formats (agentrl.env.base.EnvironmentSpec.formats): the gym's word-level tokenizer is
its own format (agentrl.env.gym.tokenizer); agentrl.env.chat drives a chat template with the gym's tools, and
agentrl.env.coding.chat with the generic coding tools.
"""
from __future__ import annotations

from typing import Protocol, runtime_checkable


@runtime_checkable
class ConversationFormat(Protocol):
    pad_id: int
    stop_id: int
    hash: str

    def prompt(self, env) -> list[int]: ...

    def action(self, turn: list[int]): ...

    def reply(self, obs, closed: bool) -> list[int]: ...
