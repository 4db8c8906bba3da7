"""Compute-matched baselines beside GRPO: is a lab's gain the reward's, or only more training from the same start?

`python -m agentrl labbaselines --lab NAME --seed N` starts each arm from the lab's kept cold start
(data/labs/<lab>/seed<N>/cold_start), trains it for as many Adam steps as GRPO took (its updated steps x rl.epochs x
rl.minibatches, read from the lab's report), and evaluates it on the held-out tasks on an evaluation stream of its own
(the lab's episodes per task, temperature 1). It writes the recipe's seed<N>.baselines.json beside the report. A lab
whose config lists `baselines` runs them itself after GRPO (agentrl.labs.recipe) and writes the same file.

    more_cloning        the cold start's cloning, continued: the same expert conversations (drawn again from the
                        lab's cold-start stream), lab.clone_lr, lab.clone_batch
    more_cloning_tokens the same, for as many steps as make its policy tokens trained equal GRPO's (the policy tokens
                        of every updated step's episodes x rl.epochs, read from the report's
                        training.trained_tokens_per_step): matched in tokens where more_cloning is in steps
    rejection_sampling  GRPO's episode budget (steps x tasks_per_step x episodes_per_task) sampled from the cold start
                        at temperature 1, tasks drawn as GRPO draws them; the episodes that passed their hidden tests
                        cloned at lab.clone_lr, lab.clone_batch (expert iteration, STaR, RAFT)
    rejection_sampling_grpo_lr
                        the same episodes and batches (the same stream), cloned at GRPO's learning rate (lab.lr):
                        rejection sampling with GRPO's step size, so that GRPO - it compares the two signals alone

`--arms` runs some of them; their results replace those arms' in an existing seed<N>.baselines.json of the same budget.

Each arm's policy tokens trained are counted beside GRPO's steps. summary() pairs every arm per task with the cold
start (arm - cold start) and with GRPO's checkpoint (GRPO - arm), at pass@1 and pass@k (agentrl.labs.passk).
"""
from __future__ import annotations

import json
import time
from dataclasses import replace

from agentrl.core.artifacts import write_json
from agentrl.core.config import ConfigError
from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff
from agentrl.labs.temperatures import rates


def path_of(inst):
    return inst.report.with_suffix(".baselines.json")


def report_of(inst):
    return inst.report.with_suffix(".json")


def grpo_optimizer_steps(record: dict) -> int:
    """The Adam steps GRPO took in a lab's record: each updated step runs rl.epochs passes of rl.minibatches."""
    return record["training"]["steps_updated"] * record["rl"]["epochs"] * record["rl"]["minibatches"]


def grpo_policy_tokens(record: dict) -> int | None:
    """The policy tokens GRPO's updates trained on in a lab's record (each pass of rl.epochs counted), or None for a
    report from before they were counted."""
    per_step = record["training"].get("trained_tokens_per_step")
    if not per_step or any(t is None for t in per_step):
        return None
    return sum(per_step) * record["rl"]["epochs"]


def budget_of(record: dict) -> dict:
    """What GRPO spent in a lab's record: Adam steps, policy tokens trained (None where not counted), episodes."""
    return {"grpo_optimizer_steps": grpo_optimizer_steps(record), "grpo_policy_tokens": grpo_policy_tokens(record)}


def more_cloning(model, run, seed: int, chat, tasks: list, env_factory, budget: dict,
                 match: str = "steps") -> dict:
    """The cold start cloned on its own demonstrations for GRPO's Adam steps (match="steps") or for as many steps as
    make its policy tokens GRPO's (match="tokens")."""
    from agentrl.core.seeding import generator
    from agentrl.labs.recipe import demonstrations
    from agentrl.labs.signal import policy_tokens
    from agentrl.starting.chat import clone
    demos = demonstrations(run, tasks, chat, env_factory, generator(seed, "lab", "cold_start"))
    per_step = policy_tokens(demos) / len(demos) * run.clone_batch
    steps = budget["grpo_optimizer_steps"] if match == "steps" else \
        max(1, round(budget["grpo_policy_tokens"] / per_step))
    losses = clone(model, demos, chat, steps, run.clone_lr, run.clone_batch,
                   generator(seed, "lab", "baseline", "more_cloning" if match == "steps" else "more_cloning_tokens"))
    return {"steps": steps, "examples": len(demos), "policy_tokens": round(per_step * steps),
            "loss_first": losses[0], "loss_last": losses[-1]}


def more_cloning_tokens(model, run, cfg, seed: int, chat, tasks: list, env_factory, budget: dict) -> dict:
    """more_cloning, matched to GRPO's policy tokens instead of its steps."""
    return more_cloning(model, run, seed, chat, tasks, env_factory, budget, match="tokens")


def rejection_sampling(model, run, cfg, seed: int, chat, tasks: list, env_factory, budget: dict,
                       lr: float | None = None) -> dict:
    """GRPO's episode budget sampled from the cold start, the passing episodes cloned for GRPO's Adam steps at `lr`
    (the cold start's clone_lr unless given)."""
    import torch

    from agentrl.core.seeding import generator
    from agentrl.labs.signal import policy_tokens
    from agentrl.rl.rollout import draw_tasks, sample_groups
    from agentrl.starting.chat import clone
    steps = budget["grpo_optimizer_steps"]
    g = generator(seed, "lab", "baseline", "rejection_sampling")
    model.eval()
    episodes = []
    with torch.no_grad():
        for _ in range(run.steps):
            chosen = draw_tasks(tasks, cfg.tasks_per_step, g, None, cfg.task_draw)
            episodes += sample_groups(model, env_factory, chosen, chat, cfg, g, 1.0)
    passed = [t for t in episodes if t.reward > 0]
    lr = run.clone_lr if lr is None else lr
    out = {"sampled": len(episodes), "passed": len(passed), "steps": 0, "policy_tokens": 0, "lr": lr}
    if passed:   # none passed: nothing to clone, the arm is the cold start
        losses = clone(model, passed, chat, steps, lr, run.clone_batch, g)
        out.update(steps=steps, policy_tokens=round(policy_tokens(passed) / len(passed) * run.clone_batch * steps),
                   loss_first=losses[0], loss_last=losses[-1])
    return out


def rejection_sampling_grpo_lr(model, run, cfg, seed: int, chat, tasks: list, env_factory, budget: dict) -> dict:
    """rejection_sampling's episodes and batches, cloned at GRPO's learning rate."""
    return rejection_sampling(model, run, cfg, seed, chat, tasks, env_factory, budget, lr=run.lr)


# arm -> (model, run, cfg, seed, chat, train tasks, env factory, budget_of(record)) -> its training record
ARMS = {"more_cloning": lambda model, run, cfg, *rest: more_cloning(model, run, *rest),
        "more_cloning_tokens": more_cloning_tokens,
        "rejection_sampling": rejection_sampling,
        "rejection_sampling_grpo_lr": rejection_sampling_grpo_lr}


def check_arms(names, budget: dict | None = None, where: str = "labbaselines --arms") -> list[str]:
    """`names` if each is an arm and the budget (where given) holds what each matches, else one line naming why."""
    unknown = [a for a in names if a not in ARMS]
    if unknown:
        raise ConfigError(f"{where}: unknown value {unknown[0]!r}; allowed: {', '.join(ARMS)}")
    if budget is not None and "more_cloning_tokens" in names and budget.get("grpo_policy_tokens") is None:
        raise ConfigError(f"{where}: more_cloning_tokens needs GRPO's policy tokens, which this lab's report does not "
                          "record (a report from before they were counted: run the lab again); allowed for it: "
                          f"{', '.join(a for a in ARMS if a != 'more_cloning_tokens')}")
    return list(names)


def run_arms(arms, run, cfg, seed: int, device: str, eval_batch: int, cold, budget: dict, log=print,
             label: str = "labbaselines") -> dict:
    """{arm: {training, held_out, seconds}}: each arm of `arms` trained from the cold start saved at `cold` within
    `budget` (budget_of) and evaluated on the held-out tasks on a stream of its own. The caller sets torch's default
    device."""
    from agentrl.labs.recipe import env_factory_for, held_out, lab_tasks, load_policy
    train_tasks, heldout = lab_tasks(run, "train"), lab_tasks(run, "heldout")
    env_factory, eval_factory = env_factory_for(run), env_factory_for(run, evaluation=True)
    out = {}
    for arm in arms:
        t0 = time.time()
        model, chat, _ = load_policy(replace(run, model=str(cold)), seed, cold, device)
        training = ARMS[arm](model, run, cfg, seed, chat, train_tasks, env_factory, budget)
        trained = time.time() - t0
        result = held_out(model, heldout, chat, run, cfg, eval_factory, seed, arm, eval_batch)
        out[arm] = {"training": training, "held_out": result,
                    "seconds": {"train": round(trained, 1), "eval": round(time.time() - t0 - trained, 1)}}
        log(f"{label} seed {seed}: {arm}: {result['pass_rate']:.3f} held-out ({training['steps']} Adam steps, "
            f"{time.time() - t0:.0f} s)")
    return out


def budget_record(run, seed: int, budget: dict) -> dict:
    """The head of a seed<N>.baselines.json: what the arms were matched to."""
    return {"seed": seed, **budget, "eval_per_task": run.eval_per_task,
            "budget_episodes": run.steps * run.tasks_per_step * run.episodes_per_task}


def train_arms(params: dict, inst, log=print, arms=None) -> dict:
    """{arm: {training, held_out, seconds}} for each arm of `arms` (default: every arm of ARMS the report's budget
    allows), written to path_of(inst) beside the arms an earlier run of the same budget kept there."""
    import torch

    from agentrl.core.config import lab_run
    from agentrl.labs.recipe import rl_config
    run, seed, lab = lab_run(inst.name, inst.spec), inst.seed, params["lab"]
    cold = inst.work_dir / "cold_start"
    how = f"--config {inst.config_file}" if inst.explored else f"--lab {inst.name}"
    if not (cold / "config.json").is_file() or not report_of(inst).is_file():
        raise ConfigError(f"labbaselines: {cold} or {report_of(inst)} not found (run the lab first: python -m "
                          f"stages.lab {how} --seed {seed})")
    record = json.loads(report_of(inst).read_text())
    if not record.get("training", {}).get("steps_updated"):
        raise ConfigError(f"labbaselines: {report_of(inst)} records no GRPO update, so there is no budget to match")
    budget = budget_of(record)
    if arms is None:
        arms = [a for a in ARMS if a != "more_cloning_tokens" or budget["grpo_policy_tokens"] is not None]
    arms = check_arms(arms, budget)
    out = budget_record(run, seed, budget)
    kept = load(inst)
    if kept is not None and all(kept.get(k) == out[k] for k in out):   # the same budget: its other arms stay
        out = {**kept, **out}
    previous = torch.get_default_device()
    torch.set_default_device(lab.device)
    try:
        out.update(run_arms(arms, run, rl_config(params["rl"], run, seed), seed, lab.device, lab.eval_batch, cold,
                            budget, log, f"labbaselines {inst.name}"))
    finally:
        torch.set_default_device(previous)
    write_json(path_of(inst), out)
    return out


def summary(arms: dict, record: dict, n_boot: int = 10_000) -> dict:
    """Each arm against the cold start and GRPO's checkpoint of the same lab seed, paired over tasks, with pass@k."""
    from agentrl.labs import passk
    seed = arms["seed"]
    counts = {"before": record["before"]["per_task"], "after": record["after"]["per_task"],
              **{arm: arms[arm]["held_out"]["per_task"] for arm in ARMS if arm in arms}}
    if len({tuple(sorted(c)) for c in counts.values()}) != 1:
        raise ConfigError("labbaselines: the arms' held-out tasks differ from the lab report's")

    def ci(values):
        return dict(zip(("mean", "lo", "hi"), bootstrap_ci(values, n_boot, seed=seed)))

    def diff(a, b):
        return dict(zip(("mean", "lo", "hi"), paired_bootstrap_diff(rates(a), rates(b), n_boot, seed=seed)))
    out = {"tasks": len(counts["before"]), "grpo_optimizer_steps": arms["grpo_optimizer_steps"],
           "grpo_policy_tokens": arms.get("grpo_policy_tokens"),
           "pass": {col: ci(rates(c)) for col, c in counts.items()},
           "pass_at_k": {col: passk.stats({col: c}, seed, n_boot) for col, c in counts.items()}}
    for arm in ARMS:
        if arm in arms:
            out[arm] = {"training": arms[arm]["training"], "over_cold_start": diff(counts["before"], counts[arm]),
                        "grpo_over_it": diff(counts[arm], counts["after"])}
    return out


LABELS = {"before": "the cold start", "more_cloning": "more cloning",
          "more_cloning_tokens": "more cloning, as many tokens as GRPO", "rejection_sampling": "rejection sampling",
          "rejection_sampling_grpo_lr": "rejection sampling at GRPO's lr", "after": "GRPO"}


def table(s: dict, interval) -> list[str]:
    """Markdown of summary(): held-out pass and pass@k per arm, then each arm paired with the cold start and GRPO."""
    cols = [c for c in LABELS if c in s["pass"]]
    ks = list(s["pass_at_k"]["before"])
    out = ["| | " + " | ".join(f"pass@{k}" for k in ks) + " | Adam steps | policy tokens trained |",
           "|---|" + "---|" * (len(ks) + 2)]
    for col in cols:
        steps = {"before": "", "after": str(s["grpo_optimizer_steps"])}.get(col)
        tokens = "" if col == "before" else f"{s[col]['training']['policy_tokens']:,}" if col != "after" else \
            f"{s['grpo_policy_tokens']:,}" if s.get("grpo_policy_tokens") is not None else ""
        if steps is None:
            steps = str(s[col]["training"]["steps"])
        out.append(f"| {LABELS[col]} | " + " | ".join(interval(s["pass_at_k"][col][k][col]) for k in ks)
                   + f" | {steps} | {tokens} |")
    out += ["", "| arm | arm - the cold start (paired) | GRPO - arm (paired) |", "|---|---|---|"]
    for arm in ARMS:
        if arm in s:
            extra = ""
            if arm.startswith("rejection_sampling"):
                t = s[arm]["training"]
                extra = f" ({t['passed']} of {t['sampled']} sampled episodes passed and were cloned" + \
                    (f" at lr {t['lr']:g})" if "lr" in t else ")")
            out.append(f"| {LABELS[arm]}{extra} | {interval(s[arm]['over_cold_start'], True)} | "
                       f"{interval(s[arm]['grpo_over_it'], True)} |")
    return out


def load(inst) -> dict | None:
    path = path_of(inst)
    return json.loads(path.read_text()) if path.is_file() else None
