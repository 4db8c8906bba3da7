"""`python -m agentrl labcheck --device cpu|cuda [--model DIR]`: a Hugging Face backend proven on a device in a few
minutes, before a lab spends hours on it.

    model        --model (a Qwen3 or Llama directory) or the small random-init Qwen3 made here
    cold start   one behaviour-cloning step on two scripted-expert conversations
    invariants   the nine invariants on a probe batch of two groups (agentrl.rl.invariants)
    GRPO         two steps of agentrl.rl.trainer.train on the gym
    verdict      PASS when the invariants pass and both steps ran with finite numbers; the peak memory of the
                 process and of the device

Every tensor is made on the device (torch.set_default_device) and every random draw comes from a CPU generator
derived from the seed, drawn on the generator's device and moved: the same draws on any device.
"""
from __future__ import annotations

import math
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import torch

from agentrl.core.config import LabRun, RLConfig
from agentrl.core.seeding import generator as stream_generator
from agentrl.env.tasks import make_tasks
from agentrl.labs.recipe import (
    EXPERTS,
    check_device,
    env_factory_for,
    load_policy,
    peak_device_memory_mib,
    peak_memory_mib,
    preflight,
    rl_config,
)
from agentrl.rl.trainer import train
from agentrl.starting.chat import clone

RUN = LabRun(demos_per_task=1, clone_steps=1, clone_batch=2, steps=2, tasks_per_step=2, episodes_per_task=2,
             max_turns=2, new_tokens=24, probe_group=2)


def labcheck(device: str, model: str | None = None, seed: int = 0, log=print) -> dict:
    run = replace(RUN, model=model)
    cfg = rl_config(RLConfig(seed=seed), run, seed)   # the knobs validated before anything is made
    check_device(device)
    start = time.time()
    previous = torch.get_default_device()
    torch.set_default_device(device)
    try:
        with tempfile.TemporaryDirectory(prefix="agentrl-labcheck-") as tmp:
            policy, chat, _ = load_policy(run, seed, Path(tmp) / "model", device)
            log(f"labcheck: {policy.model_type} backend with {policy.num_params():,} parameters on {device}")
            tasks = make_tasks("train")[:2]
            factory = env_factory_for(run)
            g = stream_generator(seed, "labcheck")
            demos = [EXPERTS[run.environment](factory(task, g), chat) for task in tasks]
            loss = clone(policy, demos, chat, run.clone_steps, run.clone_lr, run.clone_batch, g)[-1]
            log(f"labcheck: cold start step, cross-entropy {loss:.3f}")
            gate = preflight(policy, chat, tasks, replace(cfg, group_size=run.probe_group), factory, seed)
            failed = [n for n, c in gate["checks"].items() if not c["passed"]]
            log(f"labcheck: nine invariants {'pass' if not failed else 'fail: ' + ', '.join(failed)}")
            policy.train()
            history = train(policy, tasks, chat, cfg, run.steps, env=factory, generator=stream_generator(seed, "lc"))
            finite = all(math.isfinite(row.get("loss", 0.0)) and math.isfinite(row["entropy"]) for row in history
                         if "entropy" in row)
            rewards = ", ".join(f"{row['reward']:.2f}" for row in history)
            log(f"labcheck: {len(history)} GRPO steps, reward {rewards}")
    finally:
        torch.set_default_device(previous)
    passed = gate["passed"] and len(history) == run.steps and finite
    return {"device": device, "backend": policy.describe()["backend"], "architecture": policy.model_type,
            "parameters": policy.num_params(), "cold_start_loss": loss, "invariants": gate["checks"],
            "invariant_errors": gate["errors"], "grpo_steps": len(history), "finite": finite, "passed": passed,
            "seconds": round(time.time() - start, 1), "peak_memory_mib": round(peak_memory_mib(), 1),
            "peak_device_memory_mib": peak_device_memory_mib(device)}
