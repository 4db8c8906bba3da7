"""A lab's record -> its report's numbers and markdown (reports/labs/<lab>/seed<N>.{json,md}).

Held-out pass rates are per task then averaged, with a task-bootstrap interval; each gain is the paired bootstrap
difference between two evaluations over the same tasks (agentrl.eval.stats). Columns: the model as it is (a
pretrained model only), after the cold start, after GRPO. A run whose GRPO steps changed no weight says so instead of
showing an "after" column as if it were another model; the reason line reads the measured zero-advantage share; an
interval [0, 0] says that no episode succeeded.
"""
from __future__ import annotations

from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff

N_BOOT = 10_000
RANDOM_INIT_LABEL = ("A mechanism demonstration on a small random-init Qwen3 architecture (the real 151,936-token "
                     "vocabulary and chat template, a {parameters:,}-parameter decoder) behaviour-cloned here on "
                     "{expert}, then trained with GRPO on {device}. It is not Qwen3-0.6B, and its numbers say nothing "
                     "about what Qwen3-0.6B would do; they show that the recipe's machinery runs end to end on a real "
                     "model format, tokenizer and chat template.")
PRETRAINED_LABEL = ("{model}: a pretrained instruct model ({parameters:,} parameters, {architecture}), "
                    "behaviour-cloned here on {expert} and then trained with GRPO on {device}.")
EXPERTS = {"gym": "a scripted expert (read, edit with the keyword rule's op, test, submit)",
           "coding": "the generic-tools scripted expert (Read, Edit with whole lines, pytest, answer)"}
DEVICE_NAMES = {"cpu": "CPU", "cuda": "a CUDA GPU"}


def kernels_text(cpu: dict) -> str:
    """', kernels AVX2 under native numerics (ONEDNN_MAX_CPU_ISA=AVX2, ...)': what the CPU's libraries ran; empty
    for a record from before it was kept."""
    if not cpu.get("isa"):
        return ""
    env = ", ".join(f"{k}={v}" for k, v in sorted(cpu.get("env", {}).items()))
    return f", kernels {cpu['isa']} under {cpu.get('numerics', '?')} numerics" + (f" ({env})" if env else "")
# the book's section 19.7 run on Qwen3-0.6B (menu lab), for the side-by-side table: reference figures, not targets
BOOK_QWEN3_06B = {"before": "0.20 [0.06, 0.39]", "after": "0.80 [0.50, 1.00]", "gain": "+0.60 [+0.33, +0.88]",
                  "malformed": "1.69 per episode -> 0 by step 10", "entropy": "0.55 -> 0.000 by step 15"}
COLUMNS = (("pretrained", "pretrained, as it is"), ("before", "after the cold start"), ("after", "after GRPO"))


def weights_text(record: dict) -> str:
    """' Weights loaded: model.safetensors sha256 9f3c...': the weight files the lab loaded, as verified (empty for a
    record from before they were kept)."""
    weights = record.get("weights_sha256") or {}
    return (" Weights loaded: " + ", ".join(f"{name} sha256 {digest[:16]}" for name, digest in sorted(weights.items()))
            + ".") if weights else ""


def per_task_rates(per_task: dict) -> list[float]:
    return [v["c"] / v["n"] for _, v in sorted(per_task.items())]


def _ci(values, seed):
    return dict(zip(("mean", "lo", "hi"), bootstrap_ci(values, N_BOOT, seed=seed)))


def _gain(a, b, seed):
    return dict(zip(("mean", "lo", "hi"), paired_bootstrap_diff(a, b, N_BOOT, seed=seed)))


def held_out_stats(record: dict, seed: int) -> dict:
    """Each evaluation's pass rate with its interval, and the paired gains of the cold start and of GRPO."""
    from agentrl.labs import passk
    rates = {k: per_task_rates(record[k]["per_task"]) for k, _ in COLUMNS if k in record}
    first = record["before"]["per_task"]
    out = {"tasks": len(first), "episodes_per_task": next(iter(first.values()))["n"],
           **{k: _ci(v, seed) for k, v in rates.items()},
           "pass_at_k": passk.stats({k: record[k]["per_task"] for k, _ in COLUMNS if k in record}, seed, N_BOOT)}
    if "after" in rates:
        out["gain"] = _gain(rates["before"], rates["after"], seed)
    if "pretrained" in rates:
        out["cold_start_gain"] = _gain(rates["pretrained"], rates["before"], seed)
        if "after" in rates:
            out["total_gain"] = _gain(rates["pretrained"], rates["after"], seed)
    return out


def _mean(history: list, key: str) -> float | None:
    values = [row[key] for row in history if key in row and row[key] == row[key]]
    return sum(values) / len(values) if values else None


def training_stats(history: list) -> dict:
    return {"steps": len(history), "steps_updated": sum(bool(row.get("updated", "entropy" in row)) for row in history),
            "entropy_per_step": [row.get("entropy") for row in history],
            "decision_entropy_per_step": [row.get("decision_entropy") for row in history],
            "op_entropy_per_step": [row.get("decision_entropy_op") for row in history],
            "informative_per_step": [row.get("informative_share") for row in history],
            "approx_kl_per_step": [row.get("approx_kl_max") for row in history],
            "gap_per_step": [row.get("logp_gap") for row in history],
            "per_family_per_step": [row.get("per_family") for row in history],
            "zero_adv_per_step": [row.get("zero_adv_frac") for row in history],
            "zero_adv_share": _mean(history, "zero_adv_frac"),
            "sampler_trainer_gap_mean": _mean(history, "logp_gap"),
            "sampler_trainer_gap_max": max((row.get("logp_gap_max", 0.0) for row in history), default=None),
            "train_pass_rate": _mean(history, "pass_rate"), "malformed": _mean(history, "malformed"),
            "malformed_per_step": [row.get("malformed") for row in history],
            "pass_per_step": [row.get("pass_rate") for row in history],
            "trained_tokens_per_step": [row.get("trained_tokens") for row in history]}


def fmt(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def interval(d: dict, signed: bool = False) -> str:
    f = "+.3f" if signed else ".3f"
    text = f"{d['mean']:{f}} [{d['lo']:{f}}, {d['hi']:{f}}]"
    return text + " (no episode succeeded)" if d["lo"] == d["hi"] == d["mean"] == 0 and not signed else text


def excludes_zero(d: dict) -> bool:
    return d["lo"] > 0 or d["hi"] < 0


def shown(record: dict) -> list[tuple[str, str]]:
    """The evaluation columns to show: "after GRPO" only when a step changed the weights."""
    cols = [(k, label) for k, label in COLUMNS if k in record]
    return cols if record["weights_changed"] else [c for c in cols if c[0] != "after"]


def steps_text(values: list, digits: int = 3) -> str:
    return ", ".join(fmt(v, digits) for v in values) if values else "n/a"


def behaviour_table(record: dict, rows: list[tuple[str, str]]) -> list[str]:
    cols = shown(record)
    out = ["| held-out, per episode | " + " | ".join(label for _, label in cols) + " |",
           "|---|" + "---|" * len(cols)]
    out += [f"| {label} | " + " | ".join(fmt(record[k].get(key)) for k, _ in cols) + " |" for label, key in rows]
    return out


def per_task_table(record: dict) -> list[str]:
    cols = shown(record)
    out = ["| task | " + " | ".join(f"{label} (passed/episodes)" for _, label in cols) + " |",
           "|---|" + "---|" * len(cols)]
    for name in sorted(record["before"]["per_task"]):
        out.append(f"| {name} | " + " | ".join(f"{record[k]['per_task'][name]['c']}/{record[k]['per_task'][name]['n']}"
                                              for k, _ in cols) + " |")
    return out


def task_source_lines(record: dict) -> list[str]:
    """Where the tasks came from, where that is not the authored catalogue (agentrl.env.tasks.TASK_SOURCES)."""
    config = record.get("config", {})
    train, held, split = (config.get("tasks", "authored"), config.get("eval_tasks", "authored"),
                          config.get("eval_split", "heldout"))
    if (train, held, split) == ("authored", "authored", "heldout"):
        return []
    return [f"Tasks: trained on the {train} tasks' train split; held out: the {held} tasks' {split} split"
            + (" (reports/humaneval.md: built from HumanEval's functions, split by problem)."
               if "humaneval" in (train, held) else "."), ""]


def held_out_lines(record: dict, held: dict, training: dict) -> list[str]:
    cols = shown(record)
    out = [*task_source_lines(record)]
    out += [f"{held['tasks']} held-out tasks x {held['episodes_per_task']} episodes, temperature 1; per-task means "
           "with a 95% task-bootstrap interval; each gain is the paired bootstrap difference over the same tasks.",
           "", "| | pass rate [95% CI] |", "|---|---|"]
    out += [f"| {label} | {interval(held[k])} |" for k, label in cols]
    if "cold_start_gain" in held:
        out.append(f"| cold start over the pretrained model (paired) | {interval(held['cold_start_gain'], True)} |")
    if record["weights_changed"]:
        out.append(f"| GRPO over the cold start (paired) | {interval(held['gain'], True)} |")
    out.append("")
    if held.get("pass_at_k"):
        from agentrl.labs import passk
        out += ["pass@k from the same episodes (the unbiased estimator, per task, then the task bootstrap; pass@1 is "
                "the pass rate; agentrl/labs/passk.py); the change is after GRPO - after the cold start, paired:", "",
                *passk.table(held["pass_at_k"], cols, interval), ""]
    if "after" not in record:
        out.append("GRPO did not run (see the first lines): no after-GRPO column.")
    elif not record["weights_changed"]:
        out.append(f"**No GRPO step changed a weight** ({training['steps']} steps, zero-advantage share "
                   f"{fmt(training['zero_adv_share'])}): every group's episodes had equal rewards, so the model after "
                   "GRPO is the cold-start model; no after-GRPO column is shown.")
    elif excludes_zero(held["gain"]):
        out.append(f"GRPO's paired gain over the cold start excludes 0 ({'up' if held['gain']['lo'] > 0 else 'down'}).")
    else:
        out.append(f"GRPO's paired gain over the cold start includes 0. Measured: {fmt(training['zero_adv_share'])} "
                   "of the training groups had equal rewards (no gradient); decision entropy per call "
                   f"{steps_text(training['decision_entropy_per_step'][:1])} -> "
                   f"{steps_text(training['decision_entropy_per_step'][-1:])} nats over the steps.")
    return out


def training_lines(record: dict, training: dict) -> list[str]:
    out = ["| column | value |", "|---|---|",
           f"| steps that made an update (of {training['steps']}) | {training['steps_updated']} |",
           f"| decision entropy per call, per step (nats: the tool's name and the op) | "
           f"{steps_text(training['decision_entropy_per_step'])} |",
           f"| op entropy per edit call, per step (nats; log 5 = 1.61 is uniform) | "
           f"{steps_text(training['op_entropy_per_step'])} |",
           f"| share of groups whose rewards disagree, per step | {steps_text(training['informative_per_step'], 2)} |",
           f"| action-token entropy per step (nats, all policy tokens; n/a: no update) | "
           f"{steps_text(training['entropy_per_step'])} |",
           f"| approximate KL to the sampling policy, max per step | {steps_text(training['approx_kl_per_step'], 4)} |",
           f"| sampler-trainer gap per step (mean nats per token, {record.get('dtype', 'fp32')}) | "
           f"{steps_text(training['gap_per_step'], 6)} |",
           f"| zero-advantage share per step | {', '.join(fmt(z, 2) for z in training['zero_adv_per_step'])} "
           f"(mean {fmt(training['zero_adv_share'])}) |",
           f"| malformed calls per training episode, per step | "
           f"{', '.join(fmt(m, 2) for m in training['malformed_per_step'])} |",
           f"| training pass rate (mean; per step) | {fmt(training['train_pass_rate'])}; "
           f"{', '.join(fmt(p, 2) for p in training['pass_per_step'])} |",
           f"| sampler-trainer gap, mean / max (nats per token) | {fmt(training['sampler_trainer_gap_mean'], 8)} / "
           f"{fmt(training['sampler_trainer_gap_max'], 8)} |",
           f"| weights changed by GRPO | {record['weights_changed']} |"]
    if "sandbox" in record:
        s = record["sandbox"]
        out.append(f"| sandbox share of a training step | {fmt(s['share'])} ({s['runs']} sandboxed steps, "
                   f"{s['seconds']:.1f} s of {s['step_seconds']:.1f} s) |")
    return out


def family_lines(training: dict) -> list[str]:
    """Training passes per family, per GRPO step (passed/episodes)."""
    steps = [row for row in training["per_family_per_step"] if row]
    if not steps:
        return []
    families = sorted({f for row in steps for f in row})
    out = ["| step | " + " | ".join(families) + " |", "|---|" + "---|" * len(families)]
    out += [f"| {i} | " + " | ".join("{}/{}".format(*row[f]) if f in row else "-" for f in families) + " |"
            for i, row in enumerate(training["per_family_per_step"]) if row]
    return out


def signal_lines(signal: dict) -> list[str]:
    """The signal check after the cold start (and any later one)."""
    if not signal:
        return []
    out = ["| signal check (training tasks) | " + " | ".join(signal) + " |", "|---|" + "---|" * len(signal)]
    rows = [("groups (episodes)", lambda s: f"{s['groups']} ({s['episodes']})"),
            ("share of groups whose rewards disagree", lambda s: fmt(s["informative_share"], 2)),
            ("pass rate", lambda s: fmt(s["pass_rate"])),
            ("malformed calls per episode", lambda s: fmt(s["malformed"], 2)),
            ("decision entropy per call (nats)", lambda s: fmt(s["decision_entropy"]["call"])),
            ("op entropy per edit call (nats)", lambda s: fmt(s["decision_entropy"].get("op"))),
            ("passed/episodes per family",
             lambda s: ", ".join(f"{f} {c[0]}/{c[1]}" for f, c in s["per_family"].items()))]
    out += [f"| {label} | " + " | ".join(get(s) for s in signal.values()) + " |" for label, get in rows]
    return out


def gate_lines(record: dict) -> list[str]:
    """The first lines of a report whose gates failed."""
    stopped = record.get("stopped")
    if not stopped:
        return []
    head = ("**The gates failed and the lab went on as asked (`--past-gates`)**: " if stopped["went_on"] else
            "**Stopped before GRPO**: ")
    return [head + "; ".join(stopped["reasons"]) + ".", ""]


def cost_lines(record: dict) -> list[str]:
    t = record["timings_s"]
    out = [f"- Wall time {record['wall_s']:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in t.items())}); "
           f"CPU time {record['cpu_s']:.0f} s at {record['threads']} threads.",
           f"- Peak memory (resident set) {record['peak_memory_mib']:.0f} MiB."]
    attempts = record.get("attempts") or []
    if len(attempts) > 1:   # a lab killed part-way and run again (agentrl.labs.progress)
        out.append(f"- Run in {len(attempts)} attempts (a kill and a rerun); they started at: {', '.join(attempts)}. "
                   "The times add up every attempt; the peak memory is the last one's.")
    for what, came in (record.get("reused") or {}).items():   # agentrl.labs.phase_cache
        out.append(f"- {what} reused, not computed: the result {came['computed_by']} computed in {came['seconds']:.0f} "
                   f"s from the same inputs (`{came['from']}`).")
    work = record.get("floors")
    if work and work["phases"]:   # agentrl.model.floors: each phase's operations at this machine's floor
        out += ["", "Each phase against its floor: the sum over its operations (sampler forwards, scoring and training "
                f"passes, Adam steps) of the larger of their bytes at the same-run read bandwidth "
                f"({work['bandwidth_gbs']:.1f} GB/s) and their FLOPs at a same-run {work['dtype']} GEMM of the "
                f"model's shapes ({work['gemm_gflops']:.1f} GFLOP/s); the sandbox's time is in the phase, not in "
                "its floor.", "", "| phase | s | floor (s) | GFLOP | GB read | x floor |", "|---|---|---|---|---|---|"]
        out += [f"| {what} | {w['seconds']:.1f} | {w['floor_s']:.1f} | {w['gflop']:,.0f} | {w['gbytes']:,.1f} | "
                f"x{w['ratio']:.1f} |" for what, w in work["phases"].items()]
        out.append("")
    if record.get("peak_device_memory_mib") is not None:
        out.append(f"- Peak {record['device']} memory allocated {record['peak_device_memory_mib']:.0f} MiB.")
    return out


def controls_lines(record: dict) -> list[str]:
    """The controls the lab ran after GRPO (agentrl.labs.controls), each table as `study labs` shows it."""
    controls, seed, out = record.get("controls") or {}, record["seed"], []
    if controls.get("temperatures"):
        from agentrl.labs import temperatures
        grid = controls["temperatures"]
        s = temperatures.summary(grid, seed)
        out += ["## Temperature as a control", "", f"Held-out pass of the cold start and GRPO's checkpoint at each "
                f"sampling temperature ({s['tasks']} tasks x {grid['eval_per_task']} episodes, each cell its own "
                "stream; at 1, the evaluations above):", "", *temperatures.table(s, interval), ""]
    if controls.get("baselines"):
        from agentrl.labs import baselines
        arms = controls["baselines"]
        s = baselines.summary(arms, record)
        tokens = f", {arms['grpo_policy_tokens']:,} policy tokens" if arms.get("grpo_policy_tokens") else ""
        out += ["## Compute-matched baselines", "", f"Each arm from the same cold start within GRPO's budget "
                f"({s['grpo_optimizer_steps']} Adam steps{tokens}, {arms['budget_episodes']} episodes sampled), at "
                f"the cold start's learning rate {record['config']['clone_lr']:g} unless named (GRPO's: "
                f"{record['config']['lr']:g}); held-out pass@k over {s['tasks']} tasks x {arms['eval_per_task']} "
                "episodes, each arm on its own stream (agentrl.labs.baselines):", "", *baselines.table(s, interval),
                ""]
    return out


def prefix_text(record: dict) -> str:
    """The sampler's shared prompt prefix, named where it is not the committed seeds' `repeat` (LabRun.prefix_kv)."""
    mode = record["config"].get("prefix_kv", "repeat")
    return "" if mode == "repeat" else f", sampler's shared prompt prefix kept {mode} (another floating-point order)"


def preflight_lines(gate: dict, dtype: str = "fp32") -> list[str]:
    out = [f"The nine invariants (agentrl.rl.invariants) on a first batch of {gate['episodes']} episodes sampled "
           f"from the cloned policy (rewards: {gate['rewards']}): **{'passed' if gate['passed'] else 'failed'}**. "
           + (f"They check the code in fp32 (this lab trains in {dtype}, whose sampler-trainer gap is measured at "
              "every GRPO step, under Training). " if gate.get("dtype") == "fp32" and dtype != "fp32" else "")
           + "The fault matrix on the same backend is a slow test (tests/test_labs.py).", "",
           "| invariant | value | passed |", "|---|---|---|"]
    out += [f"| {name} | {c['value']:.3g} | {c['passed']} |" for name, c in gate["checks"].items()]
    return out + ([f"- errors: {gate['errors']}"] if gate["errors"] else [])


def comparison_table(labs: list[tuple[str, dict]], book: bool = False) -> list[str]:
    """Labs' numbers, one row each ((label, numbers)), beside the book's Qwen3-0.6B run when `book`, on the same
    statistics."""
    def gain(n):
        if "gain" not in n["held_out"]:
            return "GRPO did not run"
        return interval(n["held_out"]["gain"], True) if n["weights_changed"] else "no weight changed"

    def after(n):
        if "after" not in n["held_out"]:
            return "n/a"
        return interval(n["held_out"]["after"]) if n["weights_changed"] else "(= after the cold start)"
    def widest(n):   # pass@k at the largest k the episodes allow: below 1, a task the cold start never solved
        from agentrl.labs import passk
        counts = n.get("before", {}).get("per_task")
        if not counts:
            return "n/a"
        k = passk.ks_for(counts)[-1]
        rate = lambda c: fmt(sum(passk.per_task(c, k)) / len(c))
        return f"{rate(counts)} -> {rate(n['after']['per_task'])} (k={k})" if "after" in n and n["weights_changed"] \
            else f"{rate(counts)} (k={k})"
    out = ["| run | model | as it is | after the cold start | after GRPO | GRPO's paired gain | pass@k at the largest "
           "k (cold start -> GRPO) | malformed calls per episode (cold start -> GRPO) | entropy (first -> last step) | "
           "zero-advantage share |",
           "|---|---|---|---|---|---|---|---|---|---|"]
    if book:
        out.append(f"| the book, section 19.7 | Qwen3-0.6B | n/a | {BOOK_QWEN3_06B['before']} | "
                   f"{BOOK_QWEN3_06B['after']} | {BOOK_QWEN3_06B['gain']} | n/a | {BOOK_QWEN3_06B['malformed']} | "
                   f"{BOOK_QWEN3_06B['entropy']} | n/a |")
    for name, n in labs:
        h, t = n["held_out"], n["training"]
        out.append(f"| {name} | {n['model']} | {interval(h['pretrained']) if 'pretrained' in h else 'n/a'} | "
                   f"{interval(h['before'])} | {after(n)} | {gain(n)} | {widest(n)} | "
                   f"{fmt(n['before']['malformed'], 2)} -> {fmt(n.get('after', {}).get('malformed'), 2)} | "
                   f"{steps_text(t['entropy_per_step'][:1])} -> {steps_text(t['entropy_per_step'][-1:])} | "
                   f"{fmt(t['zero_adv_share'])} |")
    return out


GYM_BEHAVIOUR = [("malformed calls", "malformed"), ("share that submit", "submitted"),
                 ("share that read first", "read_first"), ("turns", "turns"),
                 ("action-token entropy (nats)", "entropy")]
CODING_BEHAVIOUR = [("malformed calls", "malformed"), ("Write calls", "writes"), ("test runs", "test_runs"),
                    ("share that answer (a turn without a tool call)", "answered"),
                    ("share that Read first", "read_first"),
                    ("final answers claiming success while the hidden tests fail", "false_success_claims"),
                    ("turns", "turns"), ("action-token entropy (nats)", "entropy")]


def coding_tables(record: dict) -> list[str]:
    cols = shown(record)
    out = ["| failed calls per episode, by kind | " + " | ".join(label for _, label in cols) + " |",
           "|---|" + "---|" * len(cols)]
    out += [f"| {kind.replace('_', ' ')} | " + " | ".join(fmt(record[k]["failed_calls"][kind]) for k, _ in cols)
            + " |" for kind in record["before"]["failed_calls"]]
    out += ["", "| family (held-out) | " + " | ".join(f"{label} (passed/episodes)" for _, label in cols) + " |",
            "|---|" + "---|" * len(cols)]
    out += [f"| {fam} | " + " | ".join(f"{record[k]['per_family'][fam]['c']}/{record[k]['per_family'][fam]['n']}"
                                       for k, _ in cols) + " |" for fam in record["before"]["per_family"]]
    return out


def kl_penalty_text(rl: dict) -> str:
    """The KL penalty to the cold start's policy, where the lab sets one (rl.kl_coef above 0)."""
    coef = rl.get("kl_coef") or 0
    return f"KL penalty {coef:g} ({rl.get('kl_kind', '?')}, to the cold start), " if coef > 0 else ""


def episode_draw_text(rl: dict) -> str:
    """How a step's tasks were drawn and what their sources showed, where the lab changes it from the default."""
    out = "tasks drawn one per family in turn, " if rl.get("task_draw", "uniform") != "uniform" else ""
    share = rl.get("p_rename_operands") or 0
    episodes = "every training episode" if share == 1 else f"{share:.0%} of training episodes"
    return out + (f"operands under filler names in {episodes} (held-out: the authored source), " if share > 0 else "")


def grpo_steps_text(record: dict, steps_run: int) -> str:
    """The GRPO steps run, and of how many when the lab stopped short of its config's."""
    planned = record["config"].get("steps", steps_run)
    return f"{steps_run} steps" if steps_run == planned else f"{steps_run} of {planned} steps"


def lab_report(record: dict) -> tuple[dict, str]:
    """(numbers, markdown) of a lab's record."""
    seed, env = record["seed"], record["config"]["environment"]
    held = held_out_stats(record, seed)
    training = training_stats(record["history"])
    numbers = {k: v for k, v in record.items() if k != "history"}
    numbers.update({"held_out": held, "training": training})
    pretrained = "pretrained" in record
    label = (PRETRAINED_LABEL if pretrained else RANDOM_INIT_LABEL).format(
        model=record["model"], parameters=record["parameters"], architecture=record["architecture"],
        expert=EXPERTS.get(env, "a scripted expert"), device=DEVICE_NAMES.get(record.get("device", "cpu"), "CPU"))
    cold = record["cold_start"]
    kind = {"format": "format-only conversations (the op drawn uniformly)"}.get(cold.get("kind"),
                                                                               "scripted-expert conversations")
    cpu = record.get("cpu") or {}
    rl = record.get("rl") or {}
    md = [f"# Lab `{record['lab']}` seed {seed}: the recipe on {record['model']} ({env} environment)", "",
          *gate_lines(record), f"**{label}**", "",
          f"Model: `{record['model_dir']}` ({record['backend']} backend, {record['architecture']}, "
          f"{record['parameters']:,} parameters, device {record['device']}, dtype {record.get('dtype', 'fp32')}"
          f"{prefix_text(record)}; "
          f"CPU {cpu.get('model', '?')}, bf16 flags: {', '.join(cpu.get('bf16_flags', [])) or 'none'}"
          f"{kernels_text(cpu)}), seed {seed}.{weights_text(record)} "
          f"Cold start: {cold['demos']} {kind} (demonstration pass {cold['demo_pass']:.2f}), {cold['steps']} "
          f"steps, cross-entropy {fmt(cold['loss_first'], 2)} -> {fmt(cold['loss_last'], 2)}. GRPO: "
          f"{grpo_steps_text(record, training['steps'])} of {rl.get('tasks_per_step', '?')} tasks x "
          f"{rl.get('group_size', '?')} episodes, {episode_draw_text(rl)}Adam at lr {rl.get('lr', '?')} (warm-up "
          f"{rl.get('lr_warmup', 0)} steps), keep {rl.get('keep', '?')}, {rl.get('minibatches', '?')} minibatches, "
          f"temperature {rl.get('temperature', '?')}, {kl_penalty_text(rl)}KL bound {record['config'].get('max_kl')}.",
          "",
          "## Held-out pass (hidden tests)", "", *held_out_lines(record, held, training), "",
          *behaviour_table(record, GYM_BEHAVIOUR if env == "gym" else CODING_BEHAVIOUR), "",
          *controls_lines(record)]
    if env == "coding":
        md += [*coding_tables(record), "",
               "A final answer 'claims success' by a word heuristic (agentrl.env.coding.environment.claims_success).",
               ""]
    md += ["## Signal after the cold start", "", *signal_lines(record.get("signal") or {}), "",
           "## Training (GRPO steps)", "", *training_lines(record, training), "", *family_lines(training), "",
           "## Per-task counts (held-out)", "", *per_task_table(record), "",
           "## Preflight", "", *preflight_lines(record["preflight"], record.get("dtype", "fp32")), "",
           "## Cost", "", *cost_lines(record), ""]
    return numbers, "\n".join(md)
