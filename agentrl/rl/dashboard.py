"""The dashboard row: one flat record per training step in the groups below, and the behaviour statistics of a set
of episodes that its behaviour group (and every evaluation) reports, read from the episodes' records
(agentrl.env.base.EpisodeRecord), so any environment's episodes make the same row.

    outcome       reward, pass_rate (and eval_pass, added by a held-out evaluation hook)
    behaviour     what every environment's episodes did (turns, malformed turns, the share finished); policy-token
                  lengths of passed and failed episodes; and the mean of each count the environment declares
                  (EnvironmentSpec.counts: the gym's reads, tests, edits and hardcode)
    optimizer     entropy, approx_kl, clipping, ratio extremes, gradient norm, KL to the reference, and the share
                  of groups with zero advantage (split into all-pass and all-fail)
    consistency   logp_gap: mean |trainer - sampler| log-prob on trained tokens (and its per-step max)
    schedule      rollouts: episodes the step played (also those keep drops); trained: episodes it trained on;
                  lr and entropy_coef when a schedule or an entropy target sets them per step
"""
from __future__ import annotations

import hashlib

METRIC_GROUPS = {
    "outcome": ["reward", "pass_rate", "eval_pass"],
    "behaviour": ["turns", "malformed", "submitted", "length_pass", "length_fail", "fail_turn_limit"],
                 # and the environment's declared counts
    "optimizer": ["entropy", "approx_kl", "approx_kl_max", "clip_frac", "clip_frac_max", "ratio_max", "ratio_min",
                  "grad_norm", "grad_norm_max", "kl_ref", "zero_adv_frac", "all_pass_frac", "all_fail_frac"],
    "consistency": ["logp_gap", "logp_gap_max"],
    "schedule": ["rollouts", "trained", "lr", "entropy_coef"],
}


def behavior_stats(trajs: list) -> dict:
    """Per-episode averages of what the agent did (from the episodes' records), plus policy-token lengths split by
    outcome, and the mean of each count the records carry (their environment's declared counts). `submitted`: the
    share that ended the episode themselves (a submit, a final answer); `hidden_pass`: the share that did and whose
    task's own check passed (the hidden tests)."""
    n = max(len(trajs), 1)
    recs = [t.record for t in trajs]
    passed = [t for t in trajs if t.reward > 0]
    failed = [t for t in trajs if t.reward <= 0]
    mean_len = lambda ts: sum(t.n_policy_tokens for t in ts) / len(ts) if ts else float("nan")
    out = {
        "episodes": len(trajs),
        "pass_rate": sum(t.reward for t in trajs) / n,
        "hidden_pass": sum(r.passed and r.finished for r in recs) / n,
        "turns": sum(r.turns for r in recs) / n,
        "malformed": sum(r.malformed for r in recs) / n,
        "submitted": sum(r.finished for r in recs) / n,
        "read_first": sum(bool(r.kinds) and r.kinds[0] == "read" for r in recs) / n,
        "length_pass": mean_len(passed),
        "length_fail": mean_len(failed),
        # failed episodes that ran out of turns (never submitted): length_fail is a mix of these long failures
        # and short submitted ones, so it moves when either kind's share does
        "fail_turn_limit": sum(not t.record.finished for t in failed) / len(failed) if failed else float("nan"),
        "policy_tokens": mean_len(trajs),
    }
    for name in sorted({k for r in recs for k in r.counts}):
        out[name] = sum(r.counts.get(name, 0) for r in recs) / n
    return out


def zero_adv_share(sampled: list) -> float:
    """Share of groups whose rewards are all equal (no gradient from the group)."""
    groups: dict[int, set] = {}
    for t in sampled:
        groups.setdefault(t.group, set()).add(t.reward)
    return sum(len(r) == 1 for r in groups.values()) / max(len(groups), 1)


def dashboard_row(sampled: list, update: dict) -> dict:
    """One flat dashboard row from the step's sampled episodes and its update statistics."""
    beh = behavior_stats(sampled)
    groups: dict[int, list[float]] = {}
    for t in sampled:
        groups.setdefault(t.group, []).append(t.reward)
    n_groups = max(len(groups), 1)
    row = {"reward": sum(t.reward for t in sampled) / len(sampled), "pass_rate": beh["hidden_pass"]}
    row.update({k: beh[k] for k in METRIC_GROUPS["behaviour"]})
    row.update({k: beh[k] for k in sorted({k for t in sampled for k in t.record.counts})})
    row["zero_adv_frac"] = zero_adv_share(sampled)
    row["all_pass_frac"] = sum(all(r > 0 for r in rs) for rs in groups.values()) / n_groups
    row["all_fail_frac"] = sum(all(r <= 0 for r in rs) for rs in groups.values()) / n_groups
    row.update(update)
    return row


def batch_hash(trajs: list) -> str:
    """Identity of a sampled batch (token ids of every episode), to find where two runs first diverge."""
    h = hashlib.sha256()
    for t in trajs:
        h.update(repr(t.ids).encode())
    return h.hexdigest()[:16]
