"""The gym as a registered environment: its tasks (agentrl.env.tasks), its episodes (CodeEnv), its formats (the
word-level tokenizer for TinyAgent, a chat template with the gym's tools for a chat model) and the knobs it reads
from the rl section."""
from __future__ import annotations

from agentrl.env.base import EnvironmentSpec
from agentrl.env.gym.environment import make_env_factory
from agentrl.env.registry import ENVIRONMENTS
from agentrl.env.tasks import make_tasks


def make(cfg, evaluation: bool = False):
    """Episodes under cfg.max_turns and cfg.rename, rewarded by cfg.reward, showing operands under filler names in
    cfg.p_rename_operands of them; an evaluation's are rewarded by the hidden tests and show the authored source."""
    return make_env_factory(cfg.max_turns, "hidden" if evaluation else cfg.reward, cfg.rename,
                            0.0 if evaluation else cfg.p_rename_operands)


def chat_format(tokenizer):
    from agentrl.env.gym.chat import GymToolChat
    return GymToolChat(tokenizer)


GYM = ENVIRONMENTS.register("gym", EnvironmentSpec(
    "gym", "the coding gym: read, test, edit <op>, submit; reward 1 iff submitted and the hidden tests pass",
    make=make, tasks=make_tasks, formats={"words": lambda tok: tok, "chat": chat_format},
    knobs=("max_turns", "reward", "rename", "p_rename_operands"), counts=("reads", "tests", "edits", "hardcode")))
