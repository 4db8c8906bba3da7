"""Evaluation: sampling with its own generator, per-task counts, behaviour statistics, starting-policy description.
The statistics (pass@k, task bootstrap, paired differences, power) live in agentrl.stats."""
from __future__ import annotations

from collections import Counter

import torch

from agentrl.gym import make_env_factory
from agentrl.objectives import entropy_from_logits, masked_mean
from agentrl.rollout import Trajectory, collate, sample_episodes
from agentrl.stats import mean_pass_at_k


def evaluate(model, tasks: list, tok, n_per_task: int, temperature: float, generator: torch.Generator, cfg,
             env_factory=None, batch_episodes: int = 256) -> dict:
    """Sample n_per_task episodes per task with the given generator (never the training stream).
    Returns {"pass_rate", "per_task": {name: {"n", "c"}}, "trajs"} where c counts hidden-test successes.
    The reward is always the hidden tests' (cfg.reward only shapes training)."""
    if n_per_task < 1:
        raise ValueError(f"n_per_task: expected an integer >= 1, got {n_per_task!r}")
    env_factory = env_factory or make_env_factory(cfg.max_turns, "hidden", cfg.rename)
    envs = [env_factory(task, generator) for task in tasks for _ in range(n_per_task)]
    trajs: list[Trajectory] = []
    for i in range(0, len(envs), batch_episodes):
        trajs += sample_episodes(model, envs[i:i + batch_episodes], tok, generator, temperature, cfg.max_call_tokens)
    per_task = {t.name: {"n": 0, "c": 0} for t in tasks}
    for tr in trajs:
        per_task[tr.info["task"]]["n"] += 1
        per_task[tr.info["task"]]["c"] += int(tr.reward > 0)
    return {"pass_rate": sum(tr.reward for tr in trajs) / len(trajs), "per_task": per_task, "trajs": trajs}


def sample_counts(model, tasks: list, tok, n_per_task: int, generator: torch.Generator, cfg,
                  temperature: float = 1.0) -> dict:
    """Per-task (n, c): episodes and hidden-test successes, from the given generator."""
    res = evaluate(model, tasks, tok, n_per_task, temperature, generator, cfg)
    return {name: (v["n"], v["c"]) for name, v in res["per_task"].items()}


def tool_sequence(tr: Trajectory) -> str:
    return " ".join(tr.info["tools"])


def behavior_stats(trajs: list[Trajectory]) -> dict:
    """Per-episode averages of what the agent did, plus policy-token lengths split by outcome."""
    n = max(len(trajs), 1)
    passed = [t for t in trajs if t.reward > 0]
    failed = [t for t in trajs if t.reward <= 0]
    mean_len = lambda ts: sum(t.n_policy_tokens for t in ts) / len(ts) if ts else float("nan")  # noqa: E731
    return {
        "episodes": len(trajs),
        "pass_rate": sum(t.reward for t in trajs) / n,
        "hidden_pass": sum(t.info["hidden_pass"] and t.info["submitted"] for t in trajs) / n,
        "reads": sum(t.info["reads"] for t in trajs) / n,
        "tests": sum(t.info["tests"] for t in trajs) / n,
        "edits": sum(t.info["edits"] for t in trajs) / n,
        "turns": sum(t.info["n_turns"] for t in trajs) / n,
        "malformed": sum(t.info["n_invalid"] for t in trajs) / n,
        "submitted": sum(t.info["submitted"] for t in trajs) / n,
        "hardcode": sum("hardcode_tests" in t.info["ops"] for t in trajs) / n,
        "read_first": sum(bool(t.info["tools"]) and t.info["tools"][0] == "read" for t in trajs) / n,
        "length_pass": mean_len(passed),
        "length_fail": mean_len(failed),
        # failed episodes that ran out of turns (never submitted): length_fail is a mix of these long failures
        # and short submitted ones, so it moves when either kind's share does
        "fail_turn_limit": sum(not t.info["submitted"] for t in failed) / len(failed) if failed else float("nan"),
        "policy_tokens": mean_len(trajs),
    }


def top_sequences(trajs: list[Trajectory], k: int = 5) -> list[tuple[str, int]]:
    return Counter(tool_sequence(t) for t in trajs).most_common(k)


@torch.no_grad()
def action_entropy(model, trajs: list[Trajectory], tok) -> float:
    """Mean entropy (nats) of the policy's next-token distribution at policy tokens."""
    batch = collate(trajs, tok.pad_id)
    logits = model(batch["ids"])[:, :-1]
    return float(masked_mean(entropy_from_logits(logits), batch["action_mask"]))


def group_gradient_share(trajs: list[Trajectory], group_size: int) -> float:
    """Share of consecutive groups of `group_size` episodes whose rewards are not all equal."""
    groups = [trajs[i:i + group_size] for i in range(0, len(trajs), group_size)]
    return sum(len({t.reward for t in g}) > 1 for g in groups) / max(len(groups), 1)


def describe(model, tasks: list, tok, n_per_task: int, generator: torch.Generator, cfg, group_size: int = 8) -> dict:
    """A starting policy in numbers: pass@1 and pass@8 (unbiased, per task then averaged), the share of
    groups of `group_size` with a gradient (rewards not all equal), action-token entropy, reads per episode."""
    res = evaluate(model, tasks, tok, n_per_task, 1.0, generator, cfg)
    counts = [(v["n"], v["c"]) for v in res["per_task"].values()]
    trajs = res["trajs"]
    beh = behavior_stats(trajs)
    return {"pass_at_1": mean_pass_at_k(counts, 1), "pass_at_8": mean_pass_at_k(counts, min(8, n_per_task)),
            "groups_with_gradient": group_gradient_share(trajs, group_size),
            "entropy": action_entropy(model, trajs, tok), "reads": beh["reads"], "malformed": beh["malformed"],
            "hardcode": beh["hardcode"], "episodes": len(trajs), "per_task": res["per_task"]}
