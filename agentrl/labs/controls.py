"""The controls a lab runs after GRPO when its config asks (LabRun.temperatures, LabRun.baselines): is the gain the
reward's, or what a cooler sampler or more training from the same cold start gives?

    temperatures  the cold start and GRPO's checkpoint evaluated on the held-out tasks at each temperature of the
                  config's grid and 1 (the lab's own evaluations, not run again): agentrl.labs.temperatures
    baselines     the config's arms, each from the kept cold start within GRPO's budget (Adam steps, or policy tokens
                  for more_cloning_tokens), evaluated on streams of their own: agentrl.labs.baselines

Each is a phase of the lab (kept for a rerun after a kill, timed against its floor). Its record, the one `labtemps`
and `labbaselines` write to files of their own, is kept under `controls` in the lab's report JSON (the stage's
declared output), where `study labs` reads it as it reads the verbs' files.
"""
from __future__ import annotations

from agentrl.labs import baselines, temperatures


def after_grpo(run, cfg, seed: int, lab, out_dir, evaluations: dict, history: list, phase, log) -> dict:
    """{"temperatures": grid, "baselines": arms}, each where the config asks for it (agentrl.labs.recipe.run_lab's
    after_grpo)."""
    from agentrl.labs.report import training_stats
    out = {}
    if run.temperatures:
        grid = sorted({float(t) for t in run.temperatures} | {1.0})
        known = {"cold_start": {"1": evaluations["before"]}, "final": {"1": evaluations["after"]}}
        out["temperatures"] = phase("temperatures", lambda: temperatures.grid(
            run, cfg, seed, lab.device, lab.eval_batch, {c: out_dir / c for c in temperatures.CHECKPOINTS}, grid,
            log, "lab temperatures", known))
    budget = baselines.budget_of({"training": training_stats(history), "rl": vars(cfg)})
    if run.baselines and budget["grpo_optimizer_steps"]:   # GRPO never updated: no budget to match
        baselines.check_arms(run.baselines, budget, "LabRun.baselines")
        out["baselines"] = phase("baselines", lambda: {
            **baselines.budget_record(run, seed, budget),
            **baselines.run_arms(run.baselines, run, cfg, seed, lab.device, lab.eval_batch, out_dir / "cold_start",
                                 budget, log, "lab baselines")})
    return out
