"""The sandbox's share of a training step: a trainer hook that reads the SandboxClock of the lab's environments
(agentrl.env.coding.chat) around each GRPO step."""
from __future__ import annotations

import time

from agentrl.env.coding.chat import SandboxClock
from agentrl.rl.trainer import Hook


class SandboxShare(Hook):
    def __init__(self):
        self.clock = SandboxClock()
        self.step_seconds = self.sandbox_seconds = 0.0
        self.runs = 0
        self._start = None

    def before_step(self, step, state) -> None:
        self._start = (time.perf_counter(), self.clock.seconds, self.clock.runs)

    def after_step(self, updates, state) -> None:
        t0, s0, r0 = self._start
        self.step_seconds += time.perf_counter() - t0
        self.sandbox_seconds += self.clock.seconds - s0
        self.runs += self.clock.runs - r0

    def summary(self) -> dict:
        return {"seconds": self.sandbox_seconds, "step_seconds": self.step_seconds, "runs": self.runs,
                "share": self.sandbox_seconds / self.step_seconds if self.step_seconds else None}
