"""What the agent learned: the starting policy and the chosen checkpoint re-evaluated on the held-out tasks from one
evaluation stream (paired), with behaviour statistics, the most frequent tool sequences, the first edit op per
task (the op confusion table) and one decoded failure transcript per bug family."""
from __future__ import annotations

from collections import Counter

from agentrl.core.seeding import generator as stream_generator
from agentrl.env.gym.environment import NL
from agentrl.env.gym.spec import GYM
from agentrl.env.ops import OPS
from agentrl.eval.evaluation import evaluate
from agentrl.rl.dashboard import behavior_stats
from agentrl.rl.rollout import OWNER, Trajectory

TOP_SEQUENCES = 5  # most frequent tool sequences reported
STREAM = "report-learned"


def tool_sequence(tr: Trajectory) -> str:
    return " ".join(tr.record.calls)


def top_sequences(trajs: list[Trajectory], k: int = TOP_SEQUENCES) -> list[tuple[str, int]]:
    return Counter(tool_sequence(t) for t in trajs).most_common(k)


def transcript(tr: Trajectory, tok) -> list[str]:
    """The decoded tokens of one episode as lines: the prompt, then each call and each observation."""
    names = {v: k for k, v in OWNER.items()}
    segments: list[tuple[str, list[str]]] = []
    for i, o in zip(tr.ids, tr.owner):
        if segments and segments[-1][0] == names[o]:
            segments[-1][1].append(tok.vocab[i])
        else:
            segments.append((names[o], [tok.vocab[i]]))
    lines, turn = [], 0
    for who, toks in segments:
        if who == "prompt":
            lines.append("prompt   " + " ".join(toks))
        elif who == "policy":
            turn += 1
            lines.append(f"call {turn:<3d} " + " ".join(toks))
        else:
            parts, cur = [], []
            for t in toks:
                if t == NL:
                    parts.append(cur)
                    cur = []
                else:
                    cur.append(t)
            parts.append(cur)
            lines.append("obs      " + " ".join(parts[0]))
            lines += ["         " + " ".join(p) for p in parts[1:]]
    return lines


def edit_ops(tr: Trajectory) -> list[str]:
    """The gym's repair ops an episode applied, in order (its `edit:<op>` calls)."""
    return [c.split(":", 1)[1] for c in tr.record.calls if c.startswith("edit:")]


def episode_record(tr: Trajectory) -> dict:
    r = tr.record
    return {"task": r.task, "family": r.family, "function_name": r.name, "reward": tr.reward,
            "submitted": r.finished, "hidden_pass": r.hidden_pass, "public_pass": r.public_pass,
            "ops": edit_ops(tr), "tools": list(r.calls), "n_turns": r.turns, "n_invalid": r.malformed}


def _mean(values) -> float | None:
    vals = list(values)
    return sum(vals) / len(vals) if vals else None


def describe_policy(model, tasks: list, tok, cfg, episodes_per_task: int, seed: int) -> tuple[dict, list]:
    """One policy on `tasks` from the behaviour stream of `seed` -> (summary, trajectories)."""
    res = evaluate(model, tasks, tok, episodes_per_task, cfg.temperature, stream_generator(seed, STREAM), cfg,
                   env=GYM.make(cfg, evaluation=True))
    trajs = res["trajs"]
    ops = list(OPS) + ["none"]
    first_ops = {t.name: {op: 0 for op in ops} for t in tasks}
    for tr in trajs:
        ops = edit_ops(tr)
        first_ops[tr.record.task][ops[0] if ops else "none"] += 1
    n = len(trajs)
    seqs = [{"sequence": s, "count": c, "share": c / n} for s, c in top_sequences(trajs)]
    per_task = {name: {**v, "rate": v["c"] / v["n"]} for name, v in res["per_task"].items()}
    oracle_share = {t.name: first_ops[t.name][t.oracle] / per_task[t.name]["n"] for t in tasks}
    return {"behavior": behavior_stats(trajs), "top_sequences": seqs, "first_ops": first_ops, "per_task": per_task,
            "oracle_first_share": oracle_share, "oracle_first_overall": _mean(oracle_share.values()),
            "episodes": n, "distinct_sequences": len({tool_sequence(t) for t in trajs})}, trajs


def failure_transcripts(trajs: list, tok, families: list[str], per_family: int) -> dict:
    fams = {}
    for fam in families:
        in_fam = [tr for tr in trajs if tr.record.family == fam]
        failed = [tr for tr in in_fam if tr.reward <= 0]
        fams[fam] = {"episodes": len(in_fam), "failures": len(failed),
                     "transcripts": [{**episode_record(tr), "lines": transcript(tr, tok)}
                                     for tr in failed[:per_family]]}
    return fams


def what_was_learned(start, chosen, tasks: list, tok, cfg, episodes_per_task: int, transcripts_per_family: int,
                     seed: int, families: list[str], checkpoint: str) -> dict:
    """The starting policy and the chosen checkpoint on the same held-out episodes' stream."""
    out = {"episodes_per_task": episodes_per_task, "generator": f"stream_seed(run.seed, '{STREAM}')",
           "top_k": TOP_SEQUENCES, "tasks": [t.name for t in tasks], "oracle": {t.name: t.oracle for t in tasks},
           "ops": list(OPS) + ["none"], "checkpoint": checkpoint}
    for label, model in (("start", start), ("chosen", chosen)):
        out[label], trajs = describe_policy(model, tasks, tok, cfg, episodes_per_task, seed)
        if label == "chosen":
            out[label]["families"] = failure_transcripts(trajs, tok, families, transcripts_per_family)
    out["families_with_failures"] = [f for f in families if out["chosen"]["families"][f]["failures"] > 0]
    return out
