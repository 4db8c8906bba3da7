"""`python -m agentrl research <study>`: the research questions of docs/research.md, outside the default pipeline.

    entropy-collapse     default vs a lower learning rate vs clip-higher vs an entropy target vs a KL anchor
    rollout-efficiency   default vs dynamic sampling (keep: resample) vs a pass-rate curriculum
    stopping             the main run extended to 120 steps; stopping rules (a) and (b), fixed in advance, applied

An arm is a set of overrides in the ablate.arms format ({"rl.<key>": value, "start": base|sft}) on top of
params.yaml's rl section; each (arm, seed) run trains from its start for the study's steps and is evaluated, like its
start, on the 10 held-out tasks from the stream (seed, "research-eval"). Runs are cached in data/research/ under a
key of everything they depend on (config, steps, evaluation, threads, starting weights), so a re-run reuses finished
runs and the arms the studies share. Summaries: reports/research/<study>.json and .md (docs/research.md quotes them).
"""
from __future__ import annotations

import hashlib
import json
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path

from agentrl.core.artifacts import DATA, REPORTS, policy_path, read_json, write_json

RESEARCH_DIR = DATA / "research"
OUT_DIR = REPORTS / "research"
EVAL_PER_TASK = 16

KL_ANCHOR = {"rl.kl_coef": 0.05, "rl.kl_kind": "k3"}   # the ablation's kl arm


@dataclass(frozen=True)
class Study:
    arms: dict
    steps: int = 60
    seeds: tuple = (0, 1, 2)


STUDIES = {
    "entropy-collapse": Study({"default": {}, "lr_low": {"rl.lr": 1e-4}, "clip_higher": {"rl.clip_eps_high": 0.28},
                               "entropy_target": {"rl.entropy_target": 0.2}, "kl": KL_ANCHOR}),
    "rollout-efficiency": Study({"default": {}, "resample": {"rl.keep": "resample"},
                                 "curriculum": {"rl.curriculum": "pass_rate"}}),
}
# the stopping exercise: rules written down before the run (docs/research.md), as select.stop_* would set them
STOPPING = {"steps": 120, "stop_patience": 2, "stop_zero_adv": 0.75, "stop_zero_adv_steps": 5}


# ---------------------------------------------------------------- context and cache

class Context:
    """What every run needs: params, tokenizer, split, thread count and the starting weights' hashes."""

    def __init__(self):
        from agentrl.core.config import load_params
        from agentrl.env.gym.tokenizer import load_tokenizer
        from agentrl.env.tasks import load_split
        from agentrl.tracking.provenance import file_hash
        self.params = load_params(["run", "model", "rl", "train", "select", "test"])
        self.tok, self.split = load_tokenizer(), load_split()
        self.threads = self.params["run"].threads
        self.weights = {s: file_hash(policy_path(s)) for s in ("base", "sft") if policy_path(s).exists()}

    def arm_config(self, name: str, spec: dict, seed: int):
        from agentrl.core.config import arm_overrides
        overrides, start = arm_overrides(name, spec)
        return replace(self.params["rl"], seed=seed, **overrides), start

    def key(self, **what) -> str:
        blob = json.dumps({**what, "threads": self.threads, "model": self.params["model"].to_dict()},
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def cached(path: Path, key: str, compute) -> dict:
    """The JSON at `path` if it was written under `key`, else compute() written there."""
    if path.is_file():
        doc = read_json(path)
        if doc.get("key") == key:
            return doc
    t0 = time.time()
    doc = {**compute(), "key": key}
    doc["wall_seconds"] = round(time.time() - t0, 1)
    write_json(path, doc)
    return doc


def gym():
    """The environment every research run trains and is evaluated in."""
    from agentrl.env.gym.spec import GYM
    return GYM


def heldout_eval(model, ctx: Context, cfg, seed: int) -> dict:
    from agentrl.core.seeding import generator
    from agentrl.eval.evaluation import evaluate
    res = evaluate(model, ctx.split["heldout"], ctx.tok, EVAL_PER_TASK, cfg.temperature,
                   generator(seed, "research-eval"), cfg, env=gym().make(cfg, evaluation=True))
    return {"pass_rate": res["pass_rate"], "per_task": res["per_task"]}


def load_start(ctx: Context, start: str):
    from agentrl.backends.registry import load_checkpoint
    return load_checkpoint("tinyagent", policy_path(start), ctx.tok, ctx.params["model"])[0]


def start_result(ctx: Context, start: str, seed: int) -> dict:
    cfg = replace(ctx.params["rl"], seed=seed)
    key = ctx.key(what="start", start=ctx.weights[start], seed=seed, eval=EVAL_PER_TASK, rl=cfg.to_dict())
    return cached(RESEARCH_DIR / "runs" / f"start_{start}-{seed}.json", key,
                  lambda: heldout_eval(load_start(ctx, start), ctx, cfg, seed))


def arm_run(ctx: Context, name: str, spec: dict, seed: int, steps: int) -> dict:
    """One (arm, seed) run: trained from its start, evaluated on the held-out tasks (cached)."""
    from agentrl.rl.trainer import train
    cfg, start = ctx.arm_config(name, spec, seed)
    key = ctx.key(what="arm", rl=cfg.to_dict(), start=ctx.weights[start], steps=steps, eval=EVAL_PER_TASK)

    def compute():
        print(f"research: {name} seed {seed}: {steps} steps from {start}", file=sys.stderr, flush=True)
        model = load_start(ctx, start)
        history = train(model, ctx.split["train"], ctx.tok, cfg, steps, env=gym().make(cfg))
        res = heldout_eval(model, ctx, cfg, seed)
        return {"arm": name, "seed": seed, "start": start, "steps": steps, "config": cfg.to_dict(),
                "heldout_pass": res["pass_rate"], "per_task": res["per_task"], "history": history}

    run = cached(RESEARCH_DIR / "runs" / f"{name}-{seed}.json", key, compute)
    begin = start_result(ctx, start, seed)
    return {**run, "start_pass": begin["pass_rate"], "start_per_task": begin["per_task"]}


# ---------------------------------------------------------------- the two questions

def run_study(name: str, ctx: Context, seeds: list[int], steps: int) -> dict:
    from agentrl.studies.summary import compare_arms, gain_per_1k_value, heldout_value, per_arm_means, run_metrics
    study = STUDIES[name]
    arms = list(study.arms)
    runs = {(a, s): arm_run(ctx, a, study.arms[a], s, steps) for s in seeds for a in arms}
    metrics = {k: run_metrics(r) for k, r in runs.items()}
    scfg, seed = ctx.params["select"], ctx.params["run"].seed
    out = {"study": name, "arms": study.arms, "seeds": seeds, "steps": steps, "eval_per_task": EVAL_PER_TASK,
           "threads": ctx.threads, "alpha": scfg.alpha, "n_boot": scfg.n_boot,
           "heldout": compare_arms(runs, arms, seeds, heldout_value, scfg.n_boot, scfg.alpha, seed, "heldout"),
           "runs": {f"{a}-{s}": metrics[(a, s)] for a, s in runs},
           "wall_seconds": sum(r["wall_seconds"] for r in runs.values())}
    mean = lambda key: per_arm_means(metrics, arms, seeds, key)
    if name == "entropy-collapse":
        out["entropy"] = {str(s): mean(lambda m, s=s: m["entropy"].get(str(s))) for s in (10, 30, 60)}
        out["unsolved_families"] = mean(lambda m: len(m["unsolved"]))
        out["unsolved_by_family"] = {a: {f: sum(f in metrics[(a, s)]["unsolved"] for s in seeds) for f in
                                         metrics[(a, seeds[0])]["families"]} for a in arms}
    else:
        out["gain_per_1k"] = compare_arms(runs, arms, seeds, gain_per_1k_value, scfg.n_boot, scfg.alpha, seed,
                                          "gain_per_1k")
        out["rollouts"] = mean(lambda m: m["rollouts"])
        out["trained_episodes"] = mean(lambda m: m["trained_episodes"])
        out["start_pass"] = mean(lambda m: m["start_pass"])
        out["zero_adv_mean"] = mean(lambda m: m["zero_adv_mean"])
        out["zero_adv_thirds"] = {a: [per_arm_means(metrics, [a], seeds, lambda m, i=i: m["zero_adv_thirds"][i])[a]
                                      for i in range(3)] for a in arms}
    return out


# ---------------------------------------------------------------- the stopping exercise

def stopping_run(ctx: Context) -> dict:
    """The main run (params.yaml, run.seed) for STOPPING['steps'] steps, validated every train.checkpoint_every
    updates from the validation stream exactly as the train stage does (so its first train.steps steps are the main
    run's), each checkpoint's policy saved under data/research/stopping/."""
    from agentrl.backends.registry import save_checkpoint
    from agentrl.core.seeding import generator
    from agentrl.eval.evaluation import evaluate
    from agentrl.rl.trainer import Hook, train
    cfg, tcfg, seed = ctx.params["rl"], ctx.params["train"], ctx.params["run"].seed
    steps, folder = STOPPING["steps"], RESEARCH_DIR / "stopping"
    key = ctx.key(what="stopping", rl=cfg.to_dict(), start=ctx.weights["base"], steps=steps,
                  every=tcfg.checkpoint_every, eval=tcfg.eval_per_task)

    class Validate(Hook):
        def __init__(self):
            self.rows = []

        def _at(self, updates, state):
            if updates % tcfg.checkpoint_every and updates != steps:
                return
            res = evaluate(state.model, ctx.split["validation"], ctx.tok, tcfg.eval_per_task, cfg.temperature,
                           generator(seed, "validation"), cfg, env=gym().make(cfg, evaluation=True))
            self.rows.append({"step": updates, "pass_rate": res["pass_rate"], "per_task": res["per_task"]})
            save_checkpoint(state.model, folder / f"step_{updates:04d}.pt", ctx.tok.hash)
            print(f"research: stopping run step {updates}: validation {res['pass_rate']:.3f}", file=sys.stderr,
                  flush=True)

        def on_start(self, state):
            self._at(0, state)

        def after_step(self, updates, state):
            self._at(updates, state)

    def compute():
        hook = Validate()
        history = train(load_start(ctx, "base"), ctx.split["train"], ctx.tok, cfg, steps, env=gym().make(cfg),
                        hooks=[hook])
        return {"steps": steps, "checkpoints": hook.rows, "history": history}

    return cached(folder / "run.json", key, compute)


def stopping_study(ctx: Context) -> dict:
    from agentrl.backends.registry import load_checkpoint
    from agentrl.core.config import SelectConfig
    from agentrl.core.seeding import generator, stream_seed
    from agentrl.eval.evaluation import evaluate
    from agentrl.eval.selection import checkpoint_rows, choose
    from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff
    from agentrl.eval.stopping import stopping_report
    run = stopping_run(ctx)
    seed, cfg, tcfg = ctx.params["run"].seed, ctx.params["rl"], ctx.params["test"]
    base = ctx.params["select"]
    scfg = SelectConfig(n_boot=base.n_boot, alpha=base.alpha, **{k: v for k, v in STOPPING.items() if k != "steps"})
    rows = checkpoint_rows(run["checkpoints"], scfg.n_boot, scfg.alpha, seed)
    chosen = choose(rows)
    rules = stopping_report(rows, run["history"], chosen, scfg,
                            {r: stream_seed(seed, "select-stop", r) for r in ("patience", "zero_adv")})
    picks = sorted({chosen["step"], *(v["chosen_step"] for v in rules.values())})
    tasks = [t.name for t in ctx.split["test"]]
    test = {}
    for step in picks:  # one stream for every pick: paired comparisons
        path = RESEARCH_DIR / "stopping" / f"step_{step:04d}.pt"
        model = load_checkpoint("tinyagent", path, ctx.tok, ctx.params["model"])[0]
        res = evaluate(model, ctx.split["test"], ctx.tok, tcfg.episodes_per_task, cfg.temperature,
                       generator(seed, "test"), cfg, env=gym().make(cfg, evaluation=True))
        r = [res["per_task"][t]["c"] / res["per_task"][t]["n"] for t in tasks]
        _, lo, hi = bootstrap_ci(r, tcfg.n_boot, tcfg.alpha, seed=stream_seed(seed, "research-test", step))
        test[step] = {"pass_rate": res["pass_rate"], "ci_lo": lo, "ci_hi": hi, "per_task": dict(zip(tasks, r))}
    for name, v in rules.items():
        full, mine = test[chosen["step"]]["per_task"], test[v["chosen_step"]]["per_task"]
        d, lo, hi = paired_bootstrap_diff([mine[t] for t in tasks], [full[t] for t in tasks], tcfg.n_boot,
                                          tcfg.alpha, seed=stream_seed(seed, "test-stop", name))
        v["test_cost"] = {"mean": d, "ci_lo": lo, "ci_hi": hi}
    main = REPORTS / "train.json"
    same = None
    if main.is_file():  # the first train.steps steps are the main run's: its validation must come out equal
        mine = {r["step"]: r["pass_rate"] for r in run["checkpoints"]}
        same = all(mine.get(c["step"]) == c["pass_rate"] for c in read_json(main)["checkpoints"])
    return {"study": "stopping", "steps": run["steps"], "rules_fixed_in_advance": STOPPING, "threads": ctx.threads,
            "checkpoints": [{k: r[k] for k in ("step", "pass_rate", "ci_lo", "ci_hi")} for r in rows],
            "zero_adv_frac": [r["zero_adv_frac"] for r in run["history"]], "chosen": chosen, "rules": rules,
            "test": {str(k): v for k, v in test.items()}, "matches_main_run_validation": same,
            "wall_seconds": run["wall_seconds"]}


def main(name: str, seeds: list[int] | None = None, steps: int | None = None) -> int:
    from agentrl.core.config import UserError
    from agentrl.studies.markdown import render
    try:
        ctx = Context()
        names = list(STUDIES) + ["stopping"] if name == "all" else [name]
        for study in names:
            if study == "stopping":
                out = stopping_study(ctx)
            else:
                spec = STUDIES[study]
                out = run_study(study, ctx, list(seeds or spec.seeds), steps or spec.steps)
            stem = study.replace("-", "_")
            write_json(OUT_DIR / f"{stem}.json", out)
            text = render(out)
            (OUT_DIR / f"{stem}.md").write_text(text)
            print(text)
    except UserError as exc:
        print(f"error: {str(exc).splitlines()[0]}", file=sys.stderr)
        return 2
    return 0
