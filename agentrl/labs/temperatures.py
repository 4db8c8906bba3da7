"""Temperature as a control: a lab's cold start and GRPO's checkpoint each evaluated on the held-out tasks over a grid
of sampling temperatures, so a gain can be told from what a cooler sampler gives the cold start for free.

`python -m agentrl labtemps --lab NAME --seed N [--temperatures 0.3,0.5,0.7,1.0]` loads the lab's kept checkpoints
(data/labs/<lab>/seed<N>/cold_start and final), evaluates each at every temperature (the lab's held-out tasks and
episodes per task; each its own generator stream: at temperature 1 the lab's own `before` and `after` streams, so
those cells repeat the report's counts) and writes the recipe's seed<N>.temperatures.json beside its report. From the
per-task counts:

    best            the cold start's best temperature (highest held-out pass; a tie goes to the higher temperature,
                    the one closer to what GRPO trains at)
    tempered gain   GRPO's checkpoint at temperature 1 - the cold start at its best temperature, paired over tasks:
                    the gain a cooler sampler cannot explain
    matched         at each temperature, GRPO's checkpoint - the cold start, paired
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

from agentrl.core.artifacts import write_json
from agentrl.core.config import ConfigError
from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff

TEMPERATURES = (0.3, 0.5, 0.7, 1.0)
CHECKPOINTS = {"cold_start": "before", "final": "after"}   # checkpoint -> the lab's evaluation stream at T = 1


def path_of(inst):
    return inst.report.with_suffix(".temperatures.json")


def stream_label(checkpoint: str, temperature: float) -> str:
    base = CHECKPOINTS[checkpoint]
    return base if temperature == 1.0 else f"{base}@T{temperature:g}"


def evaluate_grid(params: dict, inst, temperatures, log=print) -> dict:
    """{checkpoint: {temperature: {pass_rate, per_task}}} of the lab's kept checkpoints, written to path_of(inst)."""
    import torch

    from agentrl.core.config import lab_run
    from agentrl.labs.recipe import rl_config
    run, seed, lab = lab_run(inst.name, inst.spec), inst.seed, params["lab"]
    dirs = {c: inst.work_dir / c for c in CHECKPOINTS}
    missing = [str(d) for d in dirs.values() if not (d / "config.json").is_file()]
    if missing:
        how = f"--config {inst.config_file}" if inst.explored else f"--lab {inst.name}"
        raise ConfigError(f"labtemps: {', '.join(missing)} not found (run the lab first: python -m stages.lab {how} "
                          f"--seed {seed})")
    previous = torch.get_default_device()
    torch.set_default_device(lab.device)
    try:
        out = grid(run, rl_config(params["rl"], run, seed), seed, lab.device, lab.eval_batch, dirs, temperatures, log,
                   f"labtemps {inst.name}")
    finally:
        torch.set_default_device(previous)
    write_json(path_of(inst), out)
    return out


def grid(run, cfg, seed: int, device: str, eval_batch: int, dirs: dict, temperatures, log=print,
         label: str = "labtemps", known: dict | None = None) -> dict:
    """evaluate_grid's record for the checkpoints saved at dirs[checkpoint]; a cell known[checkpoint][T] (an
    evaluation the lab already ran on that checkpoint's stream) is taken as it is, not run again. The caller sets
    torch's default device."""
    from agentrl.core.seeding import generator
    from agentrl.eval.evaluation import evaluate
    from agentrl.labs.recipe import env_factory_for, lab_tasks, load_policy
    heldout, factory, known = lab_tasks(run, "heldout"), env_factory_for(run, evaluation=True), known or {}
    out: dict = {"temperatures": list(temperatures), "eval_per_task": run.eval_per_task, "seed": seed,
                 "tasks": run.tasks, "eval_tasks": run.eval_tasks, "eval_split": run.eval_split}
    for checkpoint, directory in dirs.items():
        out[checkpoint] = {}
        model = None
        for t in temperatures:
            if f"{t:g}" in known.get(checkpoint, {}):
                res = known[checkpoint][f"{t:g}"]
                out[checkpoint][f"{t:g}"] = {"pass_rate": res["pass_rate"], "per_task": res["per_task"],
                                            "seconds": 0.0, "reused": f"the lab's {stream_label(checkpoint, t)}"}
                continue
            if model is None:
                model, chat, _ = load_policy(replace(run, model=str(directory)), seed, directory, device)
                model.eval()
            t0 = time.time()
            res = evaluate(model, heldout, chat, run.eval_per_task, float(t),
                           generator(seed, "lab", "eval", stream_label(checkpoint, t)), cfg, env=factory,
                           batch_episodes=eval_batch)
            out[checkpoint][f"{t:g}"] = {"pass_rate": res["pass_rate"], "per_task": res["per_task"],
                                        "seconds": round(time.time() - t0, 1)}
            log(f"{label} seed {seed}: {checkpoint} at T={t:g}: {res['pass_rate']:.3f} ({time.time() - t0:.0f} s)")
    return out


def rates(per_task: dict) -> list[float]:
    return [v["c"] / v["n"] for _, v in sorted(per_task.items())]


def summary(grid: dict, seed: int, n_boot: int = 10_000) -> dict:
    """The cold start's best temperature, GRPO's gain over the tempered cold start, and the matched gains (see the
    module doc), from evaluate_grid's output."""
    def ci(values):
        return dict(zip(("mean", "lo", "hi"), bootstrap_ci(values, n_boot, seed=seed)))

    def gain(a, b):
        return dict(zip(("mean", "lo", "hi"), paired_bootstrap_diff(a, b, n_boot, seed=seed)))
    temps = [f"{t:g}" for t in grid["temperatures"]]
    cold = {t: rates(grid["cold_start"][t]["per_task"]) for t in temps}
    final = {t: rates(grid["final"][t]["per_task"]) for t in temps}
    best = max(temps, key=lambda t: (sum(cold[t]), float(t)))
    return {"tasks": len(cold[temps[0]]), "best": best,
            "cold_start": {t: ci(cold[t]) for t in temps}, "final": {t: ci(final[t]) for t in temps},
            "tempered_gain": gain(cold[best], final["1"]) if "1" in final else None,
            "matched": {t: gain(cold[t], final[t]) for t in temps}}


def table(s: dict, interval) -> list[str]:
    """Markdown of summary(): one row per temperature, then GRPO over the tempered cold start."""
    out = ["| temperature | cold start | GRPO's checkpoint | GRPO - cold start, same temperature (paired) |",
           "|---|---|---|---|"]
    for t in s["cold_start"]:
        mark = " (the cold start's best)" if t == s["best"] else ""
        out.append(f"| {t}{mark} | {interval(s['cold_start'][t])} | {interval(s['final'][t])} | "
                   f"{interval(s['matched'][t], True)} |")
    if s["tempered_gain"] is not None:
        out += ["", f"GRPO over the tempered cold start (GRPO's checkpoint at 1 - the cold start at {s['best']}, "
                    f"paired over {s['tasks']} tasks): **{interval(s['tempered_gain'], True)}**."]
    return out


def load(inst) -> dict | None:
    path = path_of(inst)
    return json.loads(path.read_text()) if path.is_file() else None
