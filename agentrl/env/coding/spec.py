"""The coding-tools environment as a registered environment: the task catalogue's functions in a two-file
repository, Read/Edit/Write/Bash tools graded in the sandbox (agentrl.env.coding.environment), driven through a
chat template with the tools' schemas (agentrl.env.coding.chat)."""
from __future__ import annotations

from agentrl.env.base import EnvironmentSpec
from agentrl.env.coding.calls import FAILED_KINDS
from agentrl.env.registry import ENVIRONMENTS
from agentrl.env.tasks import make_tasks


def make(cfg, evaluation: bool = False, clock=None):
    """Episodes of at most cfg.max_turns tool calls, each chat turn's action applied (reward: the hidden tests in
    training and evaluation alike), the source file's operands under filler names in cfg.p_rename_operands of the
    training episodes (an evaluation's file is the authored source); `clock` (a SandboxClock) accumulates the
    seconds spent in the sandbox."""
    from agentrl.env.coding.chat import SandboxClock, make_chat_tools_env_factory
    return make_chat_tools_env_factory(cfg.max_turns, clock if clock is not None else SandboxClock(),
                                       0.0 if evaluation else cfg.p_rename_operands)


def chat_format(tokenizer):
    from agentrl.env.coding.chat import CodingToolChat
    return CodingToolChat(tokenizer)


CODING = ENVIRONMENTS.register("coding", EnvironmentSpec(
    "coding", "generic coding tools (Read, Edit, Write, Bash) over a two-file repository; reward 1 iff the final "
    "source passes the hidden tests in the sandbox",
    make=make, tasks=make_tasks, formats={"chat": chat_format}, knobs=("max_turns", "p_rename_operands"),
    counts=("reads", "tests", "edits", "writes", "script_runs", "claims_success", "false_success_claim",
            *(f"failed_{kind}" for kind in FAILED_KINDS))))
