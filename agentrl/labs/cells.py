"""`python -m agentrl labcells --lab NAME|--config FILE [--seed N] [--set KEY=V] [--grid KEY=V1,V2] --steps N`: the
cold start and the GRPO update compared side by side, each cell at a fraction of a lab's cost.

A cell is the lab's config with some keys changed (a LabRun key, or `rl.<key>`): its cold start, the signal check
(agentrl.labs.signal) on training tasks, `steps` GRPO steps, and the same check again on the same tasks and random
stream. Before and after, a cell shows whether GRPO kept the signal (groups whose rewards disagree, decision entropy)
and which way the training pass moved, per family; no held-out evaluation (the lab's report does that). Cells that
share a cold start reuse it (saved once under data/labs/cells/). Results accumulate in the recipe's
seed<N>.cells.json (reports/labs/<lab>/, or beside an explored recipe's config), one entry per cell; `--table` prints
them as markdown.
"""
from __future__ import annotations

import hashlib
import itertools
import json
import time
from dataclasses import replace
from pathlib import Path

import torch
import yaml

from agentrl.core.artifacts import write_json
from agentrl.core.config import ConfigError, lab_run
from agentrl.core.seeding import generator as stream_generator
from agentrl.labs.precision import check_dtype
from agentrl.labs.recipe import demonstrations, env_factory_for, lab_tasks, load_policy, rl_config
from agentrl.labs.signal import StepSignal, signal_check
from agentrl.rl.trainer import train
from agentrl.starting.chat import clone

COLD_KEYS = ("model", "demos", "demos_per_task", "clone_steps", "clone_lr", "clone_batch", "new_tokens", "max_turns",
             "dtype")
COLD_DIR = Path("data/labs/cells")


def parse_assignment(text: str) -> tuple[str, object]:
    """KEY=VALUE, the value read as YAML (3e-6, true, informative)."""
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise ConfigError(f"--set/--grid: expected KEY=VALUE, got {text!r}")
    return key, yaml.safe_load(value)


def cell_spec(base: dict, changes: dict) -> dict:
    """The lab's spec with the changes (`rl.<key>` into its rl overrides)."""
    spec = {**base, "rl": dict(base.get("rl") or {})}
    for key, value in changes.items():
        if key.startswith("rl."):
            spec["rl"][key[3:]] = value
        else:
            spec[key] = value
    return spec


def grid(sets: list[str], grids: list[str]) -> list[dict]:
    """Every combination of the --grid values, each with the --set values."""
    fixed = dict(parse_assignment(s) for s in sets)
    axes = []
    for g in grids:
        key, _, values = g.partition("=")
        axes.append([(key, yaml.safe_load(v)) for v in values.split(",")])
    return [{**fixed, **dict(combo)} for combo in itertools.product(*axes)] if axes else [fixed]


def key_of(changes: dict) -> str:
    return ", ".join(f"{k}={v}" for k, v in sorted(changes.items())) or "(the lab as it is)"


def cold_start(run, seed: int, model_dir_for_small: Path, device: str, log):
    """(model, chat, seconds, losses): the cell's cold start, cloned once per cold-start config and reloaded after."""
    from agentrl.backends.hf import save_model
    renamed = run.rl.get("p_rename_operands", 0.0)   # the demonstrations' sources (keyed only when set: old keys hold)
    digest = hashlib.sha256(json.dumps({k: getattr(run, k) for k in COLD_KEYS} | {"seed": seed}
                                       | ({"p_rename_operands": renamed} if renamed else {}),
                                       sort_keys=True).encode()).hexdigest()[:12]
    saved = COLD_DIR / f"cold-{digest}"
    if (saved / "cold.json").is_file():
        info = json.loads((saved / "cold.json").read_text())
        model, chat, _ = load_policy(replace(run, model=str(saved)), seed, model_dir_for_small, device)
        log(f"cold start {digest}: reloaded")
        return model, chat, info
    model, chat, model_dir = load_policy(run, seed, model_dir_for_small, device)
    t0 = time.time()
    g = stream_generator(seed, "lab", "cold_start")
    demos = demonstrations(run, lab_tasks(run, "train"), chat, env_factory_for(run), g)
    losses = clone(model, demos, chat, run.clone_steps, run.clone_lr, run.clone_batch, g) if run.clone_steps else []
    info = {"seconds": round(time.time() - t0, 1), "loss_first": losses[0] if losses else None,
            "loss_last": losses[-1] if losses else None, "digest": digest}
    save_model(model, saved, chat.hash, tokenizer_dir=model_dir)
    (saved / "cold.json").write_text(json.dumps(info))
    log(f"cold start {digest}: {info['seconds']} s, loss {info['loss_first']} -> {info['loss_last']}")
    return model, chat, info


def run_cell(inst, params: dict, changes: dict, steps: int, log=print) -> dict:
    lab, rl, seed = params["lab"], params["rl"], inst.seed
    run = lab_run(inst.name, cell_spec(inst.spec, changes))
    check_dtype(run.dtype, lab.device, f"labcells {inst.name}: dtype")
    if not run.signal_tasks:
        raise ConfigError("labcells: signal_tasks must be > 0 (the check before and after is the cell's result)")
    start = time.time()
    model, chat, cold = cold_start(run, seed, COLD_DIR / "small-model", lab.device, log)
    env_factory, cfg, tasks = env_factory_for(run), rl_config(rl, run, seed), lab_tasks(run, "train")
    t0 = time.time()
    before = signal_check(model, chat, tasks, run.signal_tasks, cfg, env_factory, seed, "cell")
    check_s = time.time() - t0
    log(f"  before: informative {before['informative_share']:.2f}, pass {before['pass_rate']:.3f}, decision "
        f"entropy {before['decision_entropy']}")
    t0 = time.time()
    model.train()
    history = train(model, tasks, chat, cfg, steps, env=env_factory, generator=stream_generator(seed, "lab", "grpo"),
                    hooks=[StepSignal()], max_kl=run.max_kl, skip_empty=True)
    grpo_s = time.time() - t0
    after = signal_check(model, chat, tasks, run.signal_tasks, cfg, env_factory, seed, "cell")
    log(f"  after {steps} steps: informative {after['informative_share']:.2f}, pass {after['pass_rate']:.3f}, "
        f"decision entropy {after['decision_entropy']}")
    keep = ("pass_rate", "zero_adv_frac", "decision_entropy", "decision_entropy_op", "approx_kl", "approx_kl_max",
            "clip_frac", "grad_norm", "malformed", "updated", "trained", "kl_stopped", "logp_gap")
    return {"cell": key_of(changes), "changes": changes, "config": run.to_dict(), "steps": steps,
            "cold_start": cold, "before": before, "after": after,
            "history": [{k: row.get(k) for k in keep if k in row} for row in history],
            "seconds": {"check": round(check_s, 1), "grpo": round(grpo_s, 1), "total": round(time.time() - start, 1)}}


def results_path(inst) -> Path:
    return inst.report.with_suffix(".cells.json")


def record(inst, result: dict) -> None:
    path = results_path(inst)
    cells = json.loads(path.read_text()) if path.is_file() else {}
    cells[result["cell"]] = result
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json(path, cells)


def table(inst) -> str:
    """The cells of a lab as markdown: before -> after per cell; the change in training pass (after - before, on the
    same tasks and stream) and the zero-advantage share averaged over the GRPO steps."""
    path = results_path(inst)
    if not path.is_file():
        raise ConfigError(f"labcells --table: {path} does not exist yet (run some cells first)")
    cells = json.loads(path.read_text())
    f = lambda x, d=3: "n/a" if x is None else f"{x:.{d}f}"
    out = ["| cell | steps (updated) | informative groups | training pass | change | zero-advantage share per step | "
           "decision entropy per call (nats) | op entropy (nats) | malformed per episode | approx KL max | seconds |",
           "|---|---|---|---|---|---|---|---|---|---|---|"]
    for key, c in cells.items():
        b, a, h = c["before"], c["after"], c["history"]
        kl = max((r.get("approx_kl_max") or 0.0 for r in h), default=None)
        zero = [r["zero_adv_frac"] for r in h if r.get("zero_adv_frac") is not None]
        out.append(f"| {key} | {c['steps']} ({sum(bool(r.get('updated')) for r in h)}) | "
                   f"{f(b['informative_share'], 2)} -> {f(a['informative_share'], 2)} | "
                   f"{f(b['pass_rate'])} -> {f(a['pass_rate'])} | {a['pass_rate'] - b['pass_rate']:+.3f} | "
                   f"{f(sum(zero) / len(zero) if zero else None, 2)} | "
                   f"{f(b['decision_entropy']['call'])} -> {f(a['decision_entropy']['call'])} | "
                   f"{f(b['decision_entropy'].get('op'))} -> {f(a['decision_entropy'].get('op'))} | "
                   f"{f(b['malformed'], 2)} -> {f(a['malformed'], 2)} | {f(kl, 4)} | {c['seconds']['total']:.0f} |")
    return "\n".join(out)


def labcells(params: dict, inst, sets: list[str], grids: list[str], steps: int, log=print) -> list[dict]:
    cells = grid(sets, grids)
    for changes in cells:   # every cell's config checked before the first one spends minutes
        lab_run(inst.name, cell_spec(inst.spec, changes))
    out = []
    previous = torch.get_default_device()
    torch.set_default_device(params["lab"].device)
    try:
        for changes in cells:
            log(f"cell {key_of(changes)}")
            result = run_cell(inst, params, changes, steps, log)
            record(inst, result)
            out.append(result)
    finally:
        torch.set_default_device(previous)
    return out

