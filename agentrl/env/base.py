"""What every environment gives the rest of the pipeline.

An **episode** (one task, one environment instance) has `reset()`, `step(action)` -> observation or None when it has
ended, `done`, `reward`, and `record()` -> `EpisodeRecord`: what the episode did, in the terms every environment
shares. The dashboard, evaluation, behaviour analysis and the reports read records, never an environment's own
counters; an environment-specific number travels in `counts` under its own name (the gym's `hardcode`).

An **environment** is an `EnvironmentSpec` registered by name in agentrl.env.registry: its tasks, how it makes
episodes from a run's config (`make(cfg, evaluation)` -> `factory(task, generator)`), its conversation formats, the
knobs it reads and the counts its records carry. `train()`, `evaluate()` and the checkpoint hook take the episode
factory explicitly.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Protocol

CALL_KINDS = ("read", "test", "edit", "run", "finish", "invalid")   # what a call does, whatever the tool's name


@dataclass(frozen=True)
class EpisodeRecord:
    task: str
    family: str
    name: str                    # the function's name in this episode
    turns: int                   # policy turns taken (a final answer counts as one)
    malformed: int               # turns the environment could not parse (each used up its turn)
    reads: int                   # calls that showed the code
    tests: int                   # calls that ran the tests
    edits: int                   # calls that changed the code
    finished: bool               # the policy ended the episode itself (a submit, a final answer)
    hidden_pass: bool            # the hidden tests pass on the code the episode ended with
    public_pass: bool
    calls: tuple = ()            # each turn's call in the environment's own words ("invalid": malformed)
    kinds: tuple = ()            # each turn's call as one of CALL_KINDS
    counts: dict = field(default_factory=dict)   # the environment's own per-episode numbers, by name

    def __post_init__(self):
        if len(self.calls) != len(self.kinds) or not set(self.kinds) <= set(CALL_KINDS):
            raise ValueError(f"EpisodeRecord: kinds must name each call with one of {', '.join(CALL_KINDS)}")

    @property
    def tool_counts(self) -> dict:
        """Calls per tool name."""
        return dict(Counter(c.split(":")[0] for c in self.calls))


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
    formats: dict                # format kind -> (tokenizer -> conversation format, agentrl.env.formats)
    knobs: tuple = ()            # the config keys `make` reads
    counts: tuple = ()           # the names of its records' counts (averaged per step by the dashboard)
