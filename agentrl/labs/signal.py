"""Where a lab's exploration goes: the decision's entropy, the groups that carry a gradient, per-family outcomes.

- **Decision entropy.** A call's text is mostly fixed (`<tool_call>{"name": "edit", "arguments": {"op": "`); only
  the tokens of the tool's name and, for an edit, of its op decide the action. The sampler records, per call, the
  entropy of its distribution summed over those tokens (the format's `decision_tokens`), which by the chain rule
  estimates the entropy of the decision itself in nats: about log 5 = 1.61 for an op drawn uniformly from the five
  repair ops, 0 for a policy that always picks the same one.
- **The signal check.** Right after the cold start, groups of the lab's size on training tasks: the share of
  groups whose rewards disagree (GRPO's gradient comes only from those), the decision entropy, malformed calls.
  A lab whose cold start leaves too little signal says so before it spends its GRPO budget (`min_signal`).
- **Per step**: `StepSignal`, a trainer hook, adds the same numbers for every GRPO step's sampled episodes, and
  whether the step made an update, to the step's dashboard row.
"""
from __future__ import annotations

from agentrl.core.seeding import generator as stream_generator
from agentrl.rl.dashboard import behavior_stats
from agentrl.rl.rollout import choose_tasks, sample_groups
from agentrl.rl.trainer import Hook


def decision_entropy(trajs: list) -> dict:
    """Mean decision entropy (nats) per call, over every call with a decision, and per decision key (`name`: which
    tool; `op`: which repair, over edit calls)."""
    per_call, per_key = [], {}
    for t in trajs:
        for call in t.decisions:
            if call:
                per_call.append(sum(call.values()))
            for key, nats in call.items():
                per_key.setdefault(key, []).append(nats)
    mean = lambda xs: sum(xs) / len(xs) if xs else None
    return {"call": mean(per_call), **{key: mean(v) for key, v in sorted(per_key.items())}}


def informative_share(trajs: list) -> float:
    """Share of the episodes' groups whose rewards are not all equal."""
    groups: dict[int, set] = {}
    for t in trajs:
        groups.setdefault(t.group, set()).add(t.reward)
    return sum(len(r) > 1 for r in groups.values()) / max(len(groups), 1)


def per_family(trajs: list) -> dict:
    """{family: [passed, episodes]}."""
    out: dict[str, list[int]] = {}
    for t in trajs:
        counts = out.setdefault(t.record.family, [0, 0])
        counts[0] += int(t.reward > 0)
        counts[1] += 1
    return dict(sorted(out.items()))


def signal_summary(trajs: list) -> dict:
    beh = behavior_stats(trajs)
    return {"episodes": len(trajs), "groups": len({t.group for t in trajs}),
            "informative_share": informative_share(trajs), "pass_rate": sum(t.reward > 0 for t in trajs) / len(trajs),
            "malformed": beh["malformed"], "submitted": beh["submitted"],
            "decision_entropy": decision_entropy(trajs), "per_family": per_family(trajs)}


def signal_check(model, chat, tasks: list, n_tasks: int, cfg, env_factory, seed: int, label: str) -> dict:
    """Groups of cfg.group_size episodes on n_tasks training tasks, from the stream lab/signal/<label>."""
    g = stream_generator(seed, "lab", "signal", label)
    model.eval()
    trajs = sample_groups(model, env_factory, choose_tasks(tasks, n_tasks, g), chat, cfg, g)
    model.train()
    return signal_summary(trajs)


class StepSignal(Hook):
    """Adds to each GRPO step's row: the decision entropy of its sampled episodes, the share of groups that
    disagree, per-family passes, whether the step changed a weight (`updated`) and the policy tokens its update
    trained on (`trained_tokens`: those of every sampled episode when it updated, else 0; each passes rl.epochs
    times), the budget a token-matched baseline clones (agentrl.labs.baselines)."""

    def on_row(self, step: int, state, row: dict) -> None:
        trajs = state.sampled or []
        entropy = decision_entropy(trajs)
        row["decision_entropy"] = entropy["call"]
        row["decision_entropy_op"] = entropy.get("op")
        row["informative_share"] = informative_share(trajs)
        row["per_family"] = per_family(trajs)
        row["updated"] = bool(state.update)
        row["trained_tokens"] = policy_tokens(trajs) if state.update else 0


def policy_tokens(trajs: list) -> int:
    """The tokens the policy wrote in `trajs` (the ones a loss is taken on)."""
    from agentrl.rl.rollout import OWNER
    return sum(o == OWNER["policy"] for t in trajs for o in t.owner)
