"""A lab's recipe on a Qwen3 backend through Qwen3's chat template: the menu lab (the gym's four tools) and the tools
lab (the generic coding tools of agentrl.env.coding, model-written code graded in the sandbox) differ only in their
`LabSpec` (chat format, environment, scripted expert).

    model      lab.model (a user's Qwen3 directory) or a small random-init Qwen3 written here with save_pretrained
               and loaded back with from_pretrained (agentrl.backends.qwen3)
    cold start behaviour cloning of the scripted expert's conversations (agentrl.starting.chat)
    preflight  the nine invariants on a first batch sampled from the cloned policy (agentrl.rl.invariants)
    evaluate   held-out pass before GRPO (its own generator stream)
    GRPO       agentrl.rl.trainer.train with the chat format and the gym's env factory
    evaluate   held-out pass after, paired with before per task (agentrl.eval.stats)
    report     agentrl.labs.report: reports/labs/menu.{json,md}

Every tensor and the model live on lab.device; every random stream is a generator derived from the lab's seed (the
instance's, agentrl.labs.instance).
"""
from __future__ import annotations

import resource
import time
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import torch

from agentrl.core.seeding import generator as stream_generator
from agentrl.env.registry import environment
from agentrl.env.tasks import make_tasks
from agentrl.eval.evaluation import evaluate, sample_entropy_mean
from agentrl.labs.precision import BF16_FLAGS, check_dtype
from agentrl.labs.progress import GRPOCheckpoint, LabProgress, load_weights
from agentrl.labs.signal import StepSignal, decision_entropy, signal_check
from agentrl.model import floors
from agentrl.rl.dashboard import behavior_stats
from agentrl.rl.invariants import sanity_checks
from agentrl.rl.rollout import informative, sample_episodes
from agentrl.rl.trainer import SEAMS, make_optimizer, train
from agentrl.starting.chat import clone, expert_demo, format_demo, tools_expert_demo

TOKENIZER_DIR = Path("data/tokenizers/qwen3")


EXPERTS = {"gym": expert_demo, "coding": tools_expert_demo}   # environment -> (env, chat) -> a scripted episode
FORMAT_ONLY = {"gym": format_demo}   # environment -> (env, chat, generator) -> a format-only episode


def demonstrations(run, tasks: list, chat, env_factory, g: torch.Generator) -> list:
    """The cold start's demonstrations: run.demos_per_task per training task, of the kind run.demos names."""
    if run.demos == "format":
        if run.environment not in FORMAT_ONLY:
            from agentrl.core.config import ConfigError
            raise ConfigError(f"LabRun.demos: format is defined for the environments "
                              f"{', '.join(FORMAT_ONLY)}, not {run.environment}; allowed here: expert")
        return [FORMAT_ONLY[run.environment](env_factory(task, g), chat, g) for task in tasks
                for _ in range(run.demos_per_task)]
    return [EXPERTS[run.environment](env_factory(task, g), chat) for task in tasks for _ in range(run.demos_per_task)]


def lab_tasks(run, part: str) -> list:
    """A lab's training tasks (part "train": the train split of run.tasks) or held-out tasks (part "heldout": the
    run.eval_split of run.eval_tasks)."""
    if part == "train":
        return make_tasks("train", run.tasks)
    return make_tasks(run.eval_split, run.eval_tasks)


def env_factory_for(run, clock=None, evaluation: bool = False):
    """The lab's episodes: run.max_turns turns, the hidden tests' reward, the function renamed per episode; a training
    episode shows its operands under filler names as often as the lab's rl.p_rename_operands says, an evaluation's
    never."""
    rules = SimpleNamespace(max_turns=run.max_turns, reward="hidden", rename=True,
                            p_rename_operands=run.rl.get("p_rename_operands", 0.0))
    if run.environment == "coding":
        return environment("coding").make(rules, evaluation=evaluation, clock=clock)
    return environment(run.environment).make(rules, evaluation=evaluation)


def check_device(device: str) -> None:
    """A one-line ConfigError, before anything is made or loaded, when lab.device names a device torch lacks."""
    from agentrl.core.config import ConfigError
    if device == "cuda" and not torch.cuda.is_available():
        raise ConfigError("lab.device: cuda, but torch sees no CUDA device here (torch.cuda.is_available() is "
                          "False); allowed on this machine: cpu")


def peak_memory_mib() -> float:
    """Peak resident set of this process (ru_maxrss is KiB on Linux)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def load_policy(run, seed: int, small_model_dir: Path, device: str = "cpu"):
    """(model, chat, model_dir): run.model if set, else the small Qwen3 made here (written, then loaded back), in
    run.dtype; the chat format is the environment's for the model's template. A converted directory's files are
    checked against the hashes its conversion recorded before it loads; `model.weights_sha256` names the weight
    files loaded."""
    from agentrl.backends.hf import check_model_dir, load_model, load_tokenizer, make_small_model
    from agentrl.backends.pretrained import verified_weights
    if run.model:
        model_dir = check_model_dir(run.model, "lab.model")
        weights = verified_weights(model_dir, "lab.model")
        model = load_model(model_dir, "lab.model")
    else:
        model_dir = small_model_dir
        model = make_small_model(model_dir, stream_generator(seed, "lab", "init"), TOKENIZER_DIR,
                                 hidden=run.hidden, layers=run.layers)
        weights = verified_weights(model_dir, "lab.model")
    model.weights_sha256 = weights
    chat = environment(run.environment).formats["chat"](load_tokenizer(model_dir, "lab.model"))
    model.set_precision(run.dtype)
    model.prefix_kv = run.prefix_kv
    return model.to(device), chat, str(model_dir)


def rl_config(rl, run, seed: int):
    """The project's GRPO config with the lab's knobs, its `rl` overrides and its seed."""
    cfg = replace(rl, **run.rl)
    return replace(cfg, lr=run.lr, tasks_per_step=run.tasks_per_step, group_size=run.episodes_per_task,
                   max_call_tokens=run.new_tokens, minibatches=min(cfg.minibatches, run.tasks_per_step),
                   microbatches=run.microbatches, max_turns=run.max_turns, seed=seed)


def held_out(model, tasks, chat, run, cfg, env_factory, seed: int, label: str, batch: int) -> dict:
    """Held-out episodes (hidden-test reward) from the evaluation stream `label`, with their behaviour."""
    model.eval()
    res = evaluate(model, tasks, chat, run.eval_per_task, 1.0, stream_generator(seed, "lab", "eval", label), cfg,
                   env=env_factory, batch_episodes=batch, token_entropy=True)
    beh = behavior_stats(res["trajs"])
    out = {"pass_rate": res["pass_rate"], "per_task": res["per_task"], "malformed": beh["malformed"],
           "submitted": beh["submitted"], "read_first": beh["read_first"], "turns": beh["turns"],
           "entropy": sample_entropy_mean(res["trajs"]),
           "decision_entropy": decision_entropy(res["trajs"])}
    if all("failed_malformed" in t.record.counts for t in res["trajs"]):
        out.update(tools_behaviour(res["trajs"]))
    return out


def tools_behaviour(trajs: list) -> dict:
    """Per episode of the generic-tools lab: failed calls by kind, Write calls, test runs, final answers that claim
    success while the hidden tests fail, reads first; and the hidden-test outcome per family."""
    n = len(trajs)
    kinds = [k[len("failed_"):] for k in trajs[0].record.counts if k.startswith("failed_")]
    families: dict = {}
    for t in trajs:
        fam = families.setdefault(t.record.family, {"n": 0, "c": 0})
        fam["n"] += 1
        fam["c"] += int(t.reward > 0)
    return {"failed_calls": {k: sum(t.record.counts[f"failed_{k}"] for t in trajs) / n for k in kinds},
            "writes": sum(t.record.counts["writes"] for t in trajs) / n,
            "test_runs": sum(t.record.tests for t in trajs) / n,
            "answered": sum(t.record.finished for t in trajs) / n,
            "false_success_claims": sum(t.record.counts["false_success_claim"] for t in trajs) / n,
            "read_first": sum(bool(t.record.kinds) and t.record.kinds[0] == "read" for t in trajs) / n,
            "per_family": dict(sorted(families.items()))}


PROBE_TRIES = 10   # pairs of training tasks the probe batch tries (the 20 training tasks once each)


def probe_batch(model, chat, tasks, cfg, env_factory, generator: torch.Generator,
                tries: int = PROBE_TRIES) -> tuple[list, str]:
    """A first batch of whole episodes sampled from the policy, two groups of cfg.group_size, and where its rewards
    came from. Invariant 8 needs a group whose rewards disagree (else every advantage is 0), so the batch is drawn from
    successive pairs of training tasks (tasks[0:2], tasks[2:4], ...) until one has such a group, at most `tries`
    pairs. Failing that, the last batch's rewards are set to alternate 1/0 within each group (the invariants test the
    trainer, not the environment); where a group's episodes took the same actions, check 8 then measures noise."""
    for attempt in range(tries):
        pair = [tasks[(2 * attempt + k) % len(tasks)] for k in range(2)]
        envs = [env_factory(task, generator) for task in pair for _ in range(cfg.group_size)]
        trajs = sample_episodes(model, envs, chat, generator, cfg.temperature, cfg.max_call_tokens)
        for i, t in enumerate(trajs):
            t.group = i // cfg.group_size
        if informative(trajs, cfg.group_size):
            return trajs, "sampled" if attempt == 0 else \
                f"sampled (tasks {', '.join(t.name for t in pair)}: the {attempt} pair(s) before had no group whose " \
                "rewards disagree)"
    for i, t in enumerate(trajs):
        t.reward = float(i % 2 == 0)
    return trajs, (f"alternating 1/0 within each group (no group of the {tries} pairs of tasks tried had rewards "
                   "that disagree)")


def preflight(model, chat, tasks, cfg, env_factory, seed: int) -> dict:
    """The nine invariants on the probe batch; the update's direction (8) with the config's own kl_coef. They check
    the recipe's code, so they run in fp32 whatever the lab's dtype: bf16's own rounding moves checks 2, 5 and 6
    past their fp32 tolerances (and check 6's clean value to the size of the fault it catches, docs/labs.md), while
    the sampler-trainer gap bf16 costs is measured at every GRPO step instead."""
    dtype = model.precision
    model.set_precision("fp32")
    try:
        trajs, rewards = probe_batch(model, chat, tasks, cfg, env_factory,
                                     stream_generator(seed, "lab", "preflight"))
        res = sanity_checks(model, trajs, chat, cfg, own_kl_direction=True)
    finally:
        model.set_precision(dtype)
    return {"checks": {name: {"value": float(v), "passed": bool(p)} for name, (v, p) in res.items()},
            "errors": res.errors, "passed": all(p for _, p in res.values()), "episodes": len(trajs),
            "rewards": rewards, "dtype": "fp32"}


def peak_device_memory_mib(device: str) -> float | None:
    """Peak memory allocated on a CUDA device by this process (None on the CPU: the resident set says it)."""
    if device != "cuda":
        return None
    return torch.cuda.max_memory_allocated() / 2**20


def weights_digest(model) -> str:
    """A digest of every parameter's bytes: equal before and after GRPO iff no step changed a weight."""
    import hashlib
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters()):
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()[:16]


def gate_failures(gate: dict, signal: dict | None, run) -> list[str]:
    """Why GRPO should not start: each failed preflight check, and a signal check below run.min_signal."""
    from agentrl.rl.invariants import CHECKS
    out = [f"preflight check {CHECKS.index(name) + 1} ({name}) failed: {c['value']:.4g}"
           for name, c in gate["checks"].items() if not c["passed"]]
    if signal is not None and signal["informative_share"] < run.min_signal:
        out.append(f"the signal check found {signal['informative_share']:.2f} of its {signal['groups']} groups "
                   f"with rewards that disagree, below min_signal {run.min_signal}")
    return out


def unwrap(kept: dict, reused: dict, what: str) -> dict:
    """A cacheable phase's result; where it was reused from, if it was, into `reused` (a resumed lab reads both
    back from its progress)."""
    if kept["reused"] is not None:
        reused[what] = kept["reused"]
    return kept["result"]


PHASES = ["eval_pretrained", "cold_start", "signal_check", "preflight", "eval_before", "grpo", "eval_after",
          "temperatures", "baselines"]


def progress_key(resume_key: str, digest: str) -> str:
    """The stage's fingerprint with the loaded model's weights digest: progress from other weights is never
    resumed."""
    import hashlib
    return hashlib.sha256(f"{resume_key}:{digest}".encode()).hexdigest()[:16]


def pretrained_eval_inputs(run, seed: int, weights: str, chat, tasks: list, eval_batch: int, device: str) -> dict:
    """What the pretrained model's as-is evaluation is a function of, besides the stage's code and machine
    (agentrl.labs.phase_cache): its weights, the held-out tasks, the evaluation's settings (prefix_kv among them:
    another floating-point order samples other episodes) and the seed."""
    from agentrl.labs.phase_cache import task_digest
    return {"weights": weights, "dtype": run.dtype, "device": device, "seed": seed, "chat": chat.hash,
            "environment": run.environment, "tasks": task_digest(tasks), "eval_per_task": run.eval_per_task,
            "new_tokens": run.new_tokens, "max_turns": run.max_turns, "eval_batch": eval_batch,
            "prefix_kv": run.prefix_kv}


def cold_start_inputs(run, seed: int, weights: str, chat, tasks: list, device: str) -> dict:
    """What the cold start is a function of, besides the stage's code and machine: the weights it starts from, the
    training tasks, the demonstrations' and the cloning's settings and the seed (never GRPO's knobs)."""
    from agentrl.labs.phase_cache import task_digest
    return {"weights": weights, "dtype": run.dtype, "device": device, "seed": seed, "chat": chat.hash,
            "environment": run.environment, "tasks": task_digest(tasks), "max_turns": run.max_turns,
            "p_rename_operands": run.rl.get("p_rename_operands", 0.0), "demos": run.demos,
            "demos_per_task": run.demos_per_task, "clone_steps": run.clone_steps, "clone_lr": run.clone_lr,
            "clone_batch": run.clone_batch}


def run_lab(name: str, run, seed: int, params: dict, out_dir: Path, small_model_dir: Path, log=print, hooks=(),
            clock=None, past_gates: bool = False, resume_key: str | None = None, cache=None, after_grpo=None) -> dict:
    """The lab `name` (its LabRun `run`) at `seed` -> the report's record; writes checkpoints under out_dir and, when
    its model is null, the small Qwen3 to small_model_dir. A failed preflight check or too little signal stops it
    before GRPO (the record says why, under `stopped`) unless past_gates. With a resume_key (the stage's fingerprint)
    every finished phase and GRPO step is kept under out_dir/progress and a lab killed part-way goes on from there
    (agentrl.labs.progress). With a cache (agentrl.labs.phase_cache.PhaseCache) the pretrained model's evaluation
    and the cold start are reused where an earlier lab computed them from the same inputs; the record's `reused`
    says which, and from where. after_grpo(run, cfg, seed, lab, out_dir, evaluations, history, phase, log) -> the
    record's `controls`, run once GRPO's checkpoint is evaluated (agentrl.labs.controls.after_grpo)."""
    lab, rl = params["lab"], params["rl"]
    environment(run.environment)   # an unknown environment: one line, before anything is made
    check_device(lab.device)
    check_dtype(run.dtype, lab.device, f"LabConfig.configs.{name}.dtype")
    timings = {}

    def lap(what, seconds, kept=False):
        timings[what] = round(seconds, 1)
        log(f"lab {name}: {what} {timings[what]} s" + (" (kept from an earlier attempt)" if kept else ""))
    previous_device = torch.get_default_device()
    torch.set_default_device(lab.device)   # every tensor the rollout, trainer and evaluation create
    history, changed, stopped, signal, reused, phase_floors, meter = [], False, None, {}, {}, {}, None
    controls = {}
    try:
        t0 = time.time()
        model, chat, model_dir = load_policy(run, seed, small_model_dir, lab.device)
        lap("load", time.time() - t0)
        loaded_digest = weights_digest(model)
        progress = LabProgress(out_dir / "progress", resume_key and progress_key(resume_key, loaded_digest))
        meter = floors.measured_meter(model.lm.config, model.num_params(), run.dtype) if lab.device == "cpu" \
            else None   # a GPU's floors would need its own bandwidth and GEMM, synchronised: not measured here

        def phase(what, compute, restore=None):
            kept = progress.done(what)
            if meter is not None:
                meter.phase = what
            with floors.metering(meter):
                result, seconds = progress.phase(what, compute, restore)
            lap(what, seconds, kept)
            work = None
            if meter is not None:
                work, meter.phase = meter.end(what), None
            if work is not None and not kept:   # a phase kept from an earlier attempt did its work then
                phase_floors[what] = {**work, "seconds": seconds, "ratio": round(seconds / work["floor_s"], 2)}
            return result

        def cached(what, inputs, compute, reuse=None, model_dir=None):
            """{"result": compute() or its cached result for these inputs, "reused": where from, or None}."""
            if cache is None:
                return {"result": compute(), "reused": None}
            result, came_from = cache.phase(what, inputs, compute, reuse, model_dir)
            return {"result": result, "reused": came_from}
        kept_grpo = progress.grpo_checkpoint()
        left = progress.first_phase_left([p for p in PHASES if (p != "eval_pretrained" or run.model)
                                          and (p != "signal_check" or run.signal_tasks)
                                          and (p != "temperatures" or run.temperatures)
                                          and (p != "baselines" or run.baselines)])
        progress.begin("the start" if not progress.state["phases"] else
                       f"GRPO step {kept_grpo[1]['step']}" if left == "grpo" and kept_grpo else left or "the record")
        train_tasks, heldout = lab_tasks(run, "train"), lab_tasks(run, "heldout")
        env_factory, eval_factory = env_factory_for(run, clock), env_factory_for(run, clock, evaluation=True)
        cfg = rl_config(rl, run, seed)
        evaluations = {}
        from agentrl.backends.hf import save_model
        if run.model:   # a pretrained model as it is: the column before any training
            evaluations["pretrained"] = unwrap(phase("eval_pretrained", lambda: cached(
                "eval_pretrained", pretrained_eval_inputs(run, seed, loaded_digest, chat, heldout, lab.eval_batch,
                                                          lab.device),
                lambda: held_out(model, heldout, chat, run, cfg, eval_factory, seed, "pretrained", lab.eval_batch))),
                reused, "eval_pretrained")

        def cold_start():
            g = stream_generator(seed, "lab", "cold_start")
            demos = demonstrations(run, train_tasks, chat, env_factory, g)
            losses = clone(model, demos, chat, run.clone_steps, run.clone_lr, run.clone_batch, g) \
                if run.clone_steps else []
            save_model(model, out_dir / "cold_start", chat.hash, tokenizer_dir=model_dir)
            return {"demos": len(demos), "kind": run.demos,
                    "demo_pass": sum(d.reward for d in demos) / max(len(demos), 1), "steps": run.clone_steps,
                    "loss_first": losses[0] if losses else None, "loss_last": losses[-1] if losses else None}
        from agentrl.labs.phase_cache import copy_model

        def reuse_cold_start(entry):
            copy_model(entry, out_dir / "cold_start")
            load_weights(model, out_dir / "cold_start")
        cold = unwrap(phase("cold_start", lambda: cached(
            "cold_start", cold_start_inputs(run, seed, loaded_digest, chat, train_tasks, lab.device), cold_start,
            reuse_cold_start, out_dir / "cold_start"),
            restore=lambda _: load_weights(model, out_dir / "cold_start")), reused, "cold_start")

        if run.signal_tasks:
            signal["before"] = phase("signal_check", lambda: signal_check(
                model, chat, train_tasks, run.signal_tasks, cfg, env_factory, seed, "before"))
        gate = phase("preflight", lambda: preflight(
            model, chat, train_tasks, replace(cfg, group_size=min(cfg.group_size, run.probe_group)), env_factory,
            seed))
        failures = gate_failures(gate, signal.get("before"), run)
        if failures:
            stopped = {"reasons": failures, "went_on": past_gates}
            log(f"lab {name}: " + ("gates failed, going on as asked: " if past_gates else "stopped before GRPO: ")
                + "; ".join(failures))
        evaluations["before"] = phase("eval_before", lambda: held_out(
            model, heldout, chat, run, cfg, eval_factory, seed, "before", lab.eval_batch))

        if not failures or past_gates:
            model.train()
            digest = weights_digest(model)

            def grpo():
                optimizer, generator = make_optimizer(model, cfg), stream_generator(seed, "lab", "grpo")
                ref = SEAMS.reference(model) if cfg.kl_coef > 0 else None   # the cold start's policy
                steps_before, seconds_before, history = 0, 0.0, []
                if kept_grpo is not None:
                    path, state = kept_grpo
                    load_weights(model, path)
                    optimizer.load_state_dict(state["optimizer"])
                    generator.set_state(state["generator"])
                    steps_before, seconds_before, history = state["step"], state["seconds"], list(state["history"])
                    log(f"lab {name}: GRPO goes on from step {steps_before} (kept from an earlier attempt)")
                history = train(model, train_tasks, chat, cfg, run.steps, env=env_factory, generator=generator,
                                optimizer=optimizer, ref=ref, history=history, start_step=steps_before,
                                hooks=[StepSignal(), *hooks, GRPOCheckpoint(progress, chat.hash, seconds_before)],
                                max_kl=run.max_kl, skip_empty=True)
                save_model(model, out_dir / "final", chat.hash, tokenizer_dir=model_dir)
                return {"history": history, "changed": weights_digest(model) != digest,
                        "seconds_before": seconds_before}
            trained = phase("grpo", grpo, restore=lambda _: load_weights(model, out_dir / "final"))
            history, changed = trained["history"], trained["changed"]
            timings["grpo"] = round(timings["grpo"] + trained["seconds_before"], 1)
            evaluations["after"] = phase("eval_after", lambda: held_out(
                model, heldout, chat, run, cfg, eval_factory, seed, "after", lab.eval_batch))
            if after_grpo is not None:   # the controls the config asks for (agentrl.labs.controls)
                controls = after_grpo(run, cfg, seed, lab, out_dir, evaluations, history, phase, log)
    finally:
        torch.set_default_device(previous_device)
    wall_s, cpu_s = progress.elapsed()
    from agentrl.backends.hf import honest_name
    from agentrl.core.numerics import cpu_info, machine_class
    kernels = machine_class()   # the ISA torch dispatched and the variables that capped or pinned the libraries
    return {"lab": name, "config": run.to_dict(), "model_dir": model_dir, "model": honest_name(model_dir),
            "weights_sha256": model.weights_sha256,
            "backend": model.describe()["backend"], "architecture": model.model_type,
            "parameters": model.num_params(), "device": lab.device, "dtype": run.dtype,
            "cpu": {"model": cpu_info()["model"], "bf16_flags": sorted(BF16_FLAGS & cpu_info()["flags"]),
                    "isa": kernels["isa"], "numerics": kernels["mode"], "env": kernels["env"]},
            "seed": seed, "rl": {k: v for k, v in vars(cfg).items() if not k.startswith("_")},
            "cold_start": cold,
            "signal": signal, "preflight": gate, "stopped": stopped, **evaluations, "history": history,
            "weights_changed": changed, "timings_s": timings, "reused": reused, "controls": controls,
            "floors": meter and {"bandwidth_gbs": round(meter.bandwidth_gbs, 2),
                                 "gemm_gflops": round(meter.gemm_gflops, 1), "dtype": meter.dtype,
                                 "phases": phase_floors}, "wall_s": round(wall_s, 1),
            "cpu_s": round(cpu_s, 1), "attempts": progress.state["attempts"],
            "peak_memory_mib": round(peak_memory_mib(), 1),
            "peak_device_memory_mib": peak_device_memory_mib(lab.device)}
