"""The op probe: which repair the policy would choose right after reading the source, teacher-forced, per task.

The sampled decision entropy (agentrl.labs.signal) says how spread the policy's op is; it cannot say whether the
spread depends on the source. A policy that picks fix_range with 0.6 everywhere and one that picks each task's
repair with 0.6 have the same entropy, and GRPO can only sharpen the second into a skill: on the first it moves the
op's marginal, one family up and another down. The probe plays the scripted expert's first call (read) on a task,
and scores the five repair ops' edit turns after that conversation in one batch: the policy's distribution over the
ops for that source (no sampling; the same weights give the same numbers). Over the contexts:

    p_oracle      mean probability of the op that repairs the task
    accuracy      share of contexts whose most probable op repairs the task
    entropy       mean entropy of a context's distribution (nats; log 5 = 1.61 when uniform)
    marginal      the distribution averaged over contexts, and its entropy
    information   marginal entropy - mean entropy: the mutual information between the context and the op under
                  the policy (0 when the op ignores the source; at most log 5)

`python -m agentrl opprobe --lab NAME|--config FILE [--seed N]` probes a lab's saved checkpoints, or
(`--clone-curve`) reruns the lab's cold start and probes it every few cloning steps: the cold start sized by
measurement. Results accumulate in the recipe's seed<N>.probe.json beside its reports.
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import torch

from agentrl.core.artifacts import write_json
from agentrl.core.config import ConfigError, lab_run
from agentrl.core.seeding import generator as stream_generator
from agentrl.env.gym.callers import ExpertCaller
from agentrl.env.ops import REPAIR_OPS
from agentrl.env.tasks import make_tasks
from agentrl.starting.chat import call_arguments

SPLITS = ("heldout", "train")


def entropy(p: torch.Tensor) -> torch.Tensor:
    """Entropy (nats) of distributions on the last axis; 0 log 0 = 0."""
    return -(p * torch.where(p > 0, p.log(), torch.zeros_like(p))).sum(-1)


def summarize(dists: torch.Tensor, oracle: list[int], families: list[str], tasks: list[str] | None = None) -> dict:
    """The probe's numbers from per-context op distributions dists [N, n_ops], each context's oracle op index, family
    and task name (per_task: a task's p_oracle averaged over its contexts, for paired intervals)."""
    n = dists.shape[0]
    idx = torch.tensor(oracle)
    p_right = dists[torch.arange(n), idx]
    per_context = entropy(dists)
    marginal = dists.mean(0)
    per_family: dict[str, list[float]] = {}
    per_task: dict[str, list[float]] = {}
    for fam, task, p in zip(families, tasks or [None] * n, p_right.tolist()):
        per_family.setdefault(fam, []).append(p)
        per_task.setdefault(task, []).append(p)
    return {"contexts": n, "p_oracle": float(p_right.mean()),
            "accuracy": float((dists.argmax(-1) == idx).float().mean()),
            "entropy": float(per_context.mean()), "marginal": [round(float(x), 4) for x in marginal],
            "marginal_entropy": float(entropy(marginal)),
            "information": float(entropy(marginal) - per_context.mean()),
            "per_family": {f: round(sum(v) / len(v), 4) for f, v in sorted(per_family.items())},
            **({"per_task": {t: sum(v) / len(v) for t, v in sorted(per_task.items())}} if tasks else {})}


def change(before: dict, after: dict, seed: int) -> dict:
    """after - before in p_oracle with a 95% paired task-bootstrap interval (the tasks of both, in the same order)."""
    from agentrl.eval.stats import paired_bootstrap_diff
    if sorted(before["per_task"]) != sorted(after["per_task"]):
        raise ValueError("probe change: the two probes cover different tasks")
    names = sorted(before["per_task"])
    mean, lo, hi = paired_bootstrap_diff([before["per_task"][t] for t in names], [after["per_task"][t] for t in names],
                                         10_000, seed=seed)
    return {"mean": mean, "lo": lo, "hi": hi, "tasks": len(names)}


def read_contexts(chat, tasks: list, env_factory, renames: int, generator: torch.Generator) -> list[tuple]:
    """(task, ids): each task's conversation after the expert's read and its observation, `renames` times per task
    (the function renamed by the environment, drawn from the generator)."""
    out = []
    for task in tasks:
        for _ in range(renames):
            env = env_factory(task, generator)
            turn = chat.turn_ids(*call_arguments(ExpertCaller()(None)))
            obs = env.step(chat.action(turn))
            out.append((task, chat.prompt(env) + turn + chat.reply(obs, closed=True)))
    return out


@torch.no_grad()
def op_distribution(model, chat, context: list[int]) -> torch.Tensor:
    """[n_ops]: the policy's probability of each repair op's edit turn after the context, renormalized over the
    ops (the turns differ only in the op's tokens, so this is the distribution of the op itself)."""
    turns = [chat.turn_ids("edit", {"op": op}) for op in REPAIR_OPS]
    width = max(len(context) + len(t) for t in turns)
    ids = torch.full((len(turns), width), chat.pad_id, dtype=torch.long)
    at = torch.zeros(len(turns), width - 1, dtype=torch.bool)
    for i, t in enumerate(turns):
        ids[i, :len(context) + len(t)] = torch.tensor(context + t)
        at[i, len(context) - 1:len(context) + len(t) - 1] = True   # the positions that predict the turn's tokens
    logp, _ = model.log_probs(ids, at)
    return torch.softmax(logp.sum(-1).double(), 0)


def op_probe(model, chat, contexts: list[tuple]) -> dict:
    """The probe's numbers for the model over the contexts (read_contexts); the model's train/eval mode restored."""
    was_training = model.training
    model.eval()
    try:
        dists = torch.stack([op_distribution(model, chat, ctx) for _, ctx in contexts])
    finally:
        model.train(was_training)
    return summarize(dists, [REPAIR_OPS.index(t.oracle) for t, _ in contexts], [t.family for t, _ in contexts],
                     [t.name for t, _ in contexts])


def probe_contexts(chat, env_factory, seed: int, renames: int = 2) -> dict[str, list]:
    """{split: contexts} for the held-out and the training tasks, from the stream lab/probe/<split>."""
    return {split: read_contexts(chat, make_tasks(split), env_factory, renames,
                                 stream_generator(seed, "lab", "probe", split)) for split in SPLITS}


def _lab(inst, params):
    run = lab_run(inst.name, inst.spec)
    if run.environment != "gym":
        raise ConfigError(f"opprobe: lab {inst.name} runs the {run.environment} environment; the op probe is defined "
                          "for gym (its five repair ops)")
    return run, inst.seed, params["lab"].device


def probe_path(inst) -> Path:
    return inst.report.with_suffix(".probe.json")


def record(inst, key: str, value) -> Path:
    path = probe_path(inst)
    out = json.loads(path.read_text()) if path.is_file() else {}
    out[key] = value
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, out)
    return path


def probe_checkpoints(params: dict, inst, checkpoints: list[str], log=print) -> dict:
    """The probe on each of a lab's saved checkpoints (data/labs/<lab>/seed<N>/<checkpoint>), recorded under
    `checkpoints`."""
    from dataclasses import replace

    from agentrl.labs.recipe import env_factory_for, load_policy
    run, seed, device = _lab(inst, params)
    dirs = [inst.work_dir / c for c in checkpoints]
    missing = [str(d) for d in dirs if not (d / "config.json").is_file()]
    if missing:
        how = f"--config {inst.config_file}" if inst.explored else f"--lab {inst.name}"
        raise ConfigError(f"opprobe --checkpoint: {', '.join(missing)} not found (run the lab first: python -m "
                          f"stages.lab {how} --seed {seed})")
    out = {}
    for label, d in zip(checkpoints, dirs):
        model, chat, _ = load_policy(replace(run, model=str(d)), seed, d, device)
        contexts = probe_contexts(chat, env_factory_for(run, evaluation=True), seed)
        out[label] = {split: op_probe(model, chat, contexts[split]) for split in SPLITS}
        log(f"{label}: " + "; ".join(f"{s} p_oracle {out[label][s]['p_oracle']:.3f}, information "
                                     f"{out[label][s]['information']:.3f}" for s in SPLITS))
    previous = json.loads(probe_path(inst).read_text()).get("checkpoints", {}) if probe_path(inst).is_file() else {}
    both = {**previous, **out}
    record(inst, "checkpoints", both)
    if {"cold_start", "final"} <= set(both):   # what GRPO did to the choice, on the same contexts
        grpo = {split: change(both["cold_start"][split], both["final"][split], seed) for split in SPLITS}
        record(inst, "grpo_change", grpo)
        log("GRPO's change in p_oracle: " + "; ".join(f"{s} {grpo[s]['mean']:+.3f} [{grpo[s]['lo']:+.3f}, "
                                                    f"{grpo[s]['hi']:+.3f}]" for s in SPLITS))
    return out


def clone_curve(params: dict, inst, every: int, steps: int, log=print) -> list[dict]:
    """The lab's cold start rerun to `steps` cloning steps (the same demonstrations, stream and optimizer; its first
    clone_steps equal the lab's), probed every `every` steps; recorded under `clone_curve`."""
    from agentrl.labs.recipe import demonstrations, env_factory_for, load_policy
    from agentrl.starting.chat import clone
    run, seed, device = _lab(inst, params)
    model, chat, _ = load_policy(run, seed, Path("data/labs/cells/small-model"), device)
    contexts = probe_contexts(chat, env_factory_for(run, evaluation=True), seed)
    g = stream_generator(seed, "lab", "cold_start")
    demos = demonstrations(run, make_tasks("train"), chat, env_factory_for(run), g)
    rows, start = [], time.time()

    def on_step(step: int, loss: float) -> None:
        if step % every == 0:
            row = {"step": step, "loss": loss, "seconds": round(time.time() - start, 1),
                   **{split: op_probe(model, chat, contexts[split]) for split in SPLITS}}
            rows.append(row)
            log(f"step {step}: loss {loss:.4f}; " + "; ".join(
                f"{s} p_oracle {row[s]['p_oracle']:.3f}, entropy {row[s]['entropy']:.3f}" for s in SPLITS))

    clone(model, demos, chat, steps, run.clone_lr, run.clone_batch, g, on_step=on_step)
    record(inst, "clone_curve", {"config": run.to_dict(), "every": every, "steps": steps, "rows": rows})
    return rows


def table(inst) -> str:
    """The lab's probes as markdown: the clone curve, then the checkpoints."""
    path = probe_path(inst)
    if not path.is_file():
        raise ConfigError(f"opprobe --table: {path} does not exist yet (probe a checkpoint or run --clone-curve)")
    data = json.loads(path.read_text())
    head = ("| {what} | held-out p(oracle op) | accuracy | op entropy | information | training p(oracle op) | "
            "accuracy | op entropy | information |")
    line = lambda label, r: (f"| {label} | " + " | ".join(
        f"{r[s]['p_oracle']:.3f} | {r[s]['accuracy']:.2f} | {r[s]['entropy']:.3f} | {r[s]['information']:.3f}"
        for s in SPLITS) + " |")
    out = []
    if "clone_curve" in data:
        out += [head.format(what="cloning steps"), "|---" * 9 + "|"]
        out += [line(str(r["step"]), r) for r in data["clone_curve"]["rows"]]
    if "checkpoints" in data:
        out += ([""] if out else []) + [head.format(what="checkpoint"), "|---" * 9 + "|"]
        out += [line(k, r) for k, r in data["checkpoints"].items()]
    if "grpo_change" in data:
        g = data["grpo_change"]
        named = {"heldout": "held-out", "train": "training"}
        parts = [f"{named[s]} {g[s]['mean']:+.3f} [{g[s]['lo']:+.3f}, {g[s]['hi']:+.3f}] ({g[s]['tasks']} tasks)"
                 for s in SPLITS]
        out += ["", "GRPO's change in p(oracle op), final - cold start, 95% paired task-bootstrap interval: "
                + "; ".join(parts)]
    return "\n".join(out)
