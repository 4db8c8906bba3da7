"""Scripted callers (reference policies) and the environment check: the keyword-rule expert against a uniformly
random caller."""
from __future__ import annotations

import torch

from agentrl.env.gym.environment import CALL, END_CALL, CodeEnv, make_env_factory
from agentrl.env.ops import OPS, keyword_rule
from agentrl.env.tasks import Task


def call_tokens(tool: str, arg: str | None = None) -> list[str]:
    return [CALL, tool] + ([arg] if arg else []) + [END_CALL]


ALL_CALLS = [call_tokens("read"), call_tokens("test"), call_tokens("submit")] + \
            [call_tokens("edit", op) for op in OPS]


class RandomCaller:
    """Each turn, a uniformly random well-formed call."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def __call__(self, obs: list[str] | None) -> list[str]:
        g = self.generator
        return list(ALL_CALLS[int(torch.randint(len(ALL_CALLS), (1,), generator=g, device=g.device))])


class ExpertCaller:
    """The keyword-rule expert: read, edit with the keyword rule's op, test, submit."""

    def __init__(self, generator: torch.Generator | None = None):
        self.turn = 0
        self.op = None

    def __call__(self, obs: list[str] | None) -> list[str]:
        self.turn += 1
        if self.turn == 1:
            return call_tokens("read")
        if self.turn == 2:
            self.op = keyword_rule(obs)
            return call_tokens("edit", self.op)
        if self.turn == 3:
            return call_tokens("test")
        return call_tokens("submit")


def run_scripted(env: CodeEnv, caller) -> tuple[list[str], list[int]]:
    """Play one episode with a scripted caller. Returns (tokens, owner) with owner 0/1/2 = prompt/policy/env."""
    toks = env.reset()
    owner = [0] * len(toks)
    obs = None
    while not env.done:
        call = caller(obs)
        toks += call
        owner += [1] * len(call)
        obs = env.step(call)
        if obs is not None:
            toks += obs
            owner += [2] * len(obs)
    return toks, owner


def play(caller_factory, tasks: list[Task], episodes_per_task: int, generator: torch.Generator,
         max_turns: int = 6, reward: str = "hidden", rename: bool = True) -> list[CodeEnv]:
    """Play scripted episodes (caller_factory(generator) -> caller); returns the finished environments."""
    factory = make_env_factory(max_turns, reward, rename)
    envs = []
    for task in tasks:
        for _ in range(episodes_per_task):
            env = factory(task, generator)
            run_scripted(env, caller_factory(generator))
            envs.append(env)
    return envs


def environment_check(tasks: list[Task], episodes: int = 200, seed: int = 0, max_turns: int = 6) -> dict:
    """'Weak expert vs random': play the keyword-rule expert and the uniformly random caller on renamed
    functions. Returns, per policy, the mean reward, the reward distribution and per-family means."""
    out = {}
    for label, caller in (("expert", ExpertCaller), ("random", RandomCaller)):
        gen = torch.Generator().manual_seed(seed)
        per_task = -(-episodes // len(tasks))
        played = play(caller, tasks, per_task, gen, max_turns=max_turns)  # task-major order
        interleaved = [played[t * per_task + i] for i in range(per_task) for t in range(len(tasks))]
        envs = interleaved[:max(episodes, len(tasks))]  # a cut drops the same share of every task
        rewards = [e.reward for e in envs]
        fams: dict[str, list[float]] = {}
        for e in envs:
            fams.setdefault(e.task.family, []).append(e.reward)
        out[label] = {"episodes": len(envs), "mean_reward": sum(rewards) / len(rewards),
                      "reward_counts": {"0": rewards.count(0.0), "1": rewards.count(1.0)},
                      "per_family": {f: sum(r) / len(r) for f, r in sorted(fams.items())},
                      "mean_turns": sum(e.info["n_turns"] for e in envs) / len(envs),
                      "invalid_per_episode": sum(e.info["n_invalid"] for e in envs) / len(envs)}
    return out
