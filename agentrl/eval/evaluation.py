"""Evaluation: sampling with its own generator (never the training stream), per-task counts, the starting-policy
description, and the held-out evaluation hook of catalogue runs. The statistics (pass@k, task bootstrap, paired
differences, power) live in agentrl.eval.stats."""
from __future__ import annotations

import torch

from agentrl.core.seeding import generator as stream_generator
from agentrl.eval.stats import mean_pass_at_k
from agentrl.rl.dashboard import behavior_stats
from agentrl.rl.objectives import masked_mean
from agentrl.rl.rollout import Trajectory, collate, sample_episodes
from agentrl.rl.trainer import Hook, TrainState


def evaluate(model, tasks: list, tok, n_per_task: int, temperature: float, generator: torch.Generator, cfg, *,
             env, batch_episodes: int = 256, token_entropy: bool = False) -> dict:
    """Sample n_per_task episodes per task with the given generator (never the training stream) on the episodes
    `env(task, generator)` makes: an evaluation's (EnvironmentSpec.make(cfg, evaluation=True): the reward is the
    hidden tests' whatever cfg.reward trains on). Returns {"pass_rate", "per_task": {name: {"n", "c"}}, "trajs"}
    where c counts successes; with `token_entropy` the trajectories keep their sampled tokens' entropies
    (sample_entropy_mean)."""
    if n_per_task < 1:
        raise ValueError(f"n_per_task: expected an integer >= 1, got {n_per_task!r}")
    envs = [env(task, generator) for task in tasks for _ in range(n_per_task)]
    trajs: list[Trajectory] = []
    for i in range(0, len(envs), batch_episodes):
        trajs += sample_episodes(model, envs[i:i + batch_episodes], tok, generator, temperature, cfg.max_call_tokens,
                                 token_entropy)
    per_task = {t.name: {"n": 0, "c": 0} for t in tasks}
    for tr in trajs:
        per_task[tr.record.task]["n"] += 1
        per_task[tr.record.task]["c"] += int(tr.reward > 0)
    return {"pass_rate": sum(tr.reward for tr in trajs) / len(trajs), "per_task": per_task, "trajs": trajs}


def validator(tasks: list, tok, cfg, n_per_task: int, seed: int, *, env):
    """validate(model) for the main run's checkpoints: the validation tasks from the stream (seed, "validation")
    at the sampling temperature, the same episodes for every checkpoint."""
    def validate(model) -> dict:
        return evaluate(model, tasks, tok, n_per_task, cfg.temperature, stream_generator(seed, "validation"), cfg,
                        env=env)
    return validate


@torch.no_grad()
def action_entropy(model, trajs: list[Trajectory], tok) -> float:
    """Mean entropy (nats) of the policy's next-token distribution at policy tokens."""
    batch = collate(trajs, tok.pad_id)
    entropy = model.log_probs(batch["ids"], at=batch["action_mask"] > 0, entropy=True)[1]
    return float(masked_mean(entropy, batch["action_mask"]))


def sample_entropy_mean(trajs: list[Trajectory]) -> float:
    """action_entropy from the sampler's own distributions (trajectories sampled with token_entropy): the mean over
    every policy token of the entropy (nats) of the distribution it was drawn from. At temperature 1 this is
    action_entropy's quantity, computed while sampling instead of by a second pass over the episodes."""
    total = sum(e for t in trajs for e, m in zip(t.sample_entropy, t.action_mask) if m)
    return float(total / max(sum(t.n_policy_tokens for t in trajs), 1))


def group_gradient_share(trajs: list[Trajectory], group_size: int) -> float:
    """Share of consecutive groups of `group_size` episodes whose rewards are not all equal."""
    groups = [trajs[i:i + group_size] for i in range(0, len(trajs), group_size)]
    return sum(len({t.reward for t in g}) > 1 for g in groups) / max(len(groups), 1)


DESCRIBE_GROUP_SIZE = 8


def describe(model, tasks: list, tok, n_per_task: int, generator: torch.Generator, cfg, *, env,
             group_size: int = DESCRIBE_GROUP_SIZE) -> dict:
    """A starting policy in numbers: pass@1 and pass@8 (unbiased, per task then averaged), the share of
    groups of `group_size` with a gradient (rewards not all equal), action-token entropy, reads per episode."""
    res = evaluate(model, tasks, tok, n_per_task, 1.0, generator, cfg, env=env)
    counts = [(v["n"], v["c"]) for v in res["per_task"].values()]
    trajs = res["trajs"]
    beh = behavior_stats(trajs)
    return {"pass_at_1": mean_pass_at_k(counts, 1), "pass_at_8": mean_pass_at_k(counts, min(8, n_per_task)),
            "groups_with_gradient": group_gradient_share(trajs, group_size),
            "entropy": action_entropy(model, trajs, tok), "reads": beh["reads"], "malformed": beh["malformed"],
            "hardcode": beh["hardcode"], "episodes": len(trajs), "per_task": res["per_task"]}


class HeldOutEval(Hook):
    """Trainer hook: held-out pass rate before training (row 0's eval_pass_start), every `every` updates and after
    the last step (that row's eval_pass). Each evaluation draws from its own stream, (seed, stream, updates), so
    every run evaluated with the same seed and stream sees the same episodes at the same step (common random
    numbers)."""

    def __init__(self, tasks: list, tok, cfg, steps: int, every: int, per_task: int, seed: int, stream: str, *,
                 env):
        self.tasks, self.tok, self.cfg, self.steps, self.env = tasks, tok, cfg, steps, env
        self.every, self.per_task, self.seed, self.stream = every, per_task, seed, stream
        self.start = None

    def _pass_rate(self, model, updates: int) -> float:
        g = stream_generator(self.seed, self.stream, updates)
        return evaluate(model, self.tasks, self.tok, self.per_task, self.cfg.temperature, g, self.cfg,
                        env=self.env)["pass_rate"]

    def on_start(self, state: TrainState) -> None:
        self.start = self._pass_rate(state.model, 0)

    def on_row(self, step: int, state: TrainState, row: dict) -> None:
        if self.start is not None and step == state.start_step:
            row["eval_pass_start"] = self.start
        if (step + 1) % self.every == 0 or step + 1 == self.steps:
            row["eval_pass"] = self._pass_rate(state.model, step + 1)
