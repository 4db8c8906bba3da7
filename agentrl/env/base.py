"""What every environment gives the rest of the pipeline.

An **episode** (one task, one environment instance) has `reset()`, `step(action)` -> observation or None when it has
ended, `done`, `reward`, and `record()` -> `EpisodeRecord`: what the episode did, in the terms every environment
shares (turns, malformed turns, whether the policy finished it, whether the task's own check passed, each call as
a kind), plus the numbers the environment declares (`counts`) and its other per-episode facts (`facts`). The
dashboard, evaluation, behaviour analysis and the reports read records, never an environment's own counters: the
gym's reads, tests, edits and hardcode are its declared counts, and a count another environment does not declare is
not in its rows.

An **environment** is an `EnvironmentSpec` registered by name (agentrl.core.variants.ENVIRONMENTS; the shipped
ones are declared in agentrl.env.registry): its tasks, how it makes episodes from a run's config (`make(cfg,
evaluation)` -> `factory(task, generator)`), its conversation formats, the knobs it reads and the counts its records
carry. `train()`, `evaluate()` and the checkpoint hook take the episode factory explicitly.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

from agentrl.env.formats import ConversationFormat

CALL_KINDS = ("read", "test", "edit", "run", "finish", "invalid")   # what a call does, whatever the tool's name


@dataclass(frozen=True)
class EpisodeRecord:
    task: str
    family: str
    name: str                    # what the episode worked on, in its own words (the gym: the renamed function)
    turns: int                   # policy turns taken (a final answer counts as one)
    malformed: int               # turns the environment could not parse (each used up its turn)
    finished: bool               # the policy ended the episode itself (a submit, a final answer)
    passed: bool                 # the task's own check holds at the end (the hidden tests), whatever the reward
    calls: tuple = ()            # each turn's call in the environment's own words ("invalid": malformed)
    kinds: tuple = ()            # each turn's call as one of CALL_KINDS
    counts: dict = field(default_factory=dict)   # the numbers the environment declares (EnvironmentSpec.counts),
                                                 # averaged per episode by the dashboard
    facts: dict = field(default_factory=dict)    # its other per-episode facts (the gym's public_pass), never averaged

    def __post_init__(self):
        if len(self.calls) != len(self.kinds) or not set(self.kinds) <= set(CALL_KINDS):
            raise ValueError(f"EpisodeRecord: kinds must name each call with one of {', '.join(CALL_KINDS)}")

    @property
    def tool_counts(self) -> dict:
        """Calls per tool name."""
        return dict(Counter(c.split(":")[0] for c in self.calls))

    # The gym's former fields, for the readers not yet reading counts and facts (agentrl.labs.recipe,
    # agentrl.eval.behaviour); each reads the declared count or fact of that name.
    reads = property(lambda self: self.counts["reads"])
    tests = property(lambda self: self.counts["tests"])
    edits = property(lambda self: self.counts["edits"])
    hidden_pass = property(lambda self: self.passed)
    public_pass = property(lambda self: self.facts["public_pass"])


class Episode(Protocol):
    done: bool
    reward: float

    def reset(self): ...

    def step(self, action): ...

    def record(self) -> EpisodeRecord: ...


@dataclass(frozen=True)
class EnvironmentSpec:
    name: str
    doc: str
    make: Callable               # (cfg, evaluation=False) -> factory(task, generator) -> Episode; evaluation: the
                                 # episodes of an evaluation (success by the hidden tests whatever cfg trains on)
    tasks: Callable              # split name -> tasks
    formats: dict[str, Callable[..., ConversationFormat]]   # format kind -> (tokenizer -> its format)
    knobs: tuple = ()            # the config keys `make` reads
    counts: tuple = ()           # the names of its records' counts (averaged per step by the dashboard)
