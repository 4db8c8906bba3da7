"""A lab's record -> its report's numbers and markdown (reports/labs/<lab>.{json,md}).

Held-out pass rates are per task then averaged, with a task-bootstrap interval; the gain is the paired bootstrap
difference after - before over the same tasks (agentrl.eval.stats). Training columns are means over GRPO steps.
"""
from __future__ import annotations

from agentrl.eval.stats import bootstrap_ci, paired_bootstrap_diff

N_BOOT = 10_000
HONEST_LABEL = ("A mechanism demonstration on a small random-init Qwen3 architecture (the real 151,936-token "
                "vocabulary and chat template, a {parameters:,}-parameter decoder) behaviour-cloned here on a "
                "scripted expert, then trained with GRPO on CPU. It is not Qwen3-0.6B, and its numbers say nothing "
                "about what Qwen3-0.6B would do; they show that the recipe's machinery runs end to end on a real "
                "model format, tokenizer and chat template.")


def per_task_rates(per_task: dict) -> list[float]:
    return [v["c"] / v["n"] for _, v in sorted(per_task.items())]


def held_out_stats(before: dict, after: dict, seed: int) -> dict:
    b, a = per_task_rates(before["per_task"]), per_task_rates(after["per_task"])
    return {"tasks": len(b), "episodes_per_task": next(iter(before["per_task"].values()))["n"],
            "before": dict(zip(("mean", "lo", "hi"), bootstrap_ci(b, N_BOOT, seed=seed))),
            "after": dict(zip(("mean", "lo", "hi"), bootstrap_ci(a, N_BOOT, seed=seed))),
            "gain": dict(zip(("mean", "lo", "hi"), paired_bootstrap_diff(b, a, N_BOOT, seed=seed)))}


def _mean(history: list, key: str) -> float | None:
    values = [row[key] for row in history if key in row and row[key] == row[key]]
    return sum(values) / len(values) if values else None


def training_stats(history: list) -> dict:
    return {"steps": len(history),
            "entropy_per_step": [row.get("entropy") for row in history],
            "zero_adv_share": _mean(history, "zero_adv_frac"),
            "sampler_trainer_gap_mean": _mean(history, "logp_gap"),
            "sampler_trainer_gap_max": max((row.get("logp_gap_max", 0.0) for row in history), default=None),
            "train_pass_rate": _mean(history, "pass_rate"), "malformed": _mean(history, "malformed"),
            "pass_per_step": [row.get("pass_rate") for row in history]}


def fmt(x, digits: int = 3) -> str:
    return "n/a" if x is None else f"{x:.{digits}f}"


def interval(d: dict) -> str:
    return f"{d['mean']:.3f} [{d['lo']:.3f}, {d['hi']:.3f}]"


def behaviour_table(before: dict, after: dict, rows: list[tuple[str, str]]) -> list[str]:
    out = ["| held-out, per episode | before GRPO | after GRPO |", "|---|---|---|"]
    out += [f"| {label} | {fmt(before[key])} | {fmt(after[key])} |" for label, key in rows]
    return out


def per_task_table(before: dict, after: dict) -> list[str]:
    out = ["| task | before (passed/episodes) | after |", "|---|---|---|"]
    for name in sorted(before["per_task"]):
        b, a = before["per_task"][name], after["per_task"][name]
        out.append(f"| {name} | {b['c']}/{b['n']} | {a['c']}/{a['n']} |")
    return out


def cost_lines(record: dict) -> list[str]:
    t = record["timings_s"]
    return [f"- Wall time {record['wall_s']:.0f} s ({', '.join(f'{k} {v:.0f} s' for k, v in t.items())}); "
            f"CPU time {record['cpu_s']:.0f} s at {record['threads']} threads on a shared machine.",
            f"- Peak memory (resident set) {record['peak_memory_mib']:.0f} MiB."]


def preflight_lines(gate: dict) -> list[str]:
    out = [f"The nine invariants (agentrl.rl.invariants) on a first batch of {gate['episodes']} episodes sampled "
           f"from the cloned policy (rewards: {gate['rewards']}): **{'passed' if gate['passed'] else 'failed'}**. "
           "The fault matrix on the same backend is a slow test (tests/test_labs.py).", "",
           "| invariant | value | passed |", "|---|---|---|"]
    out += [f"| {name} | {c['value']:.3g} | {c['passed']} |" for name, c in gate["checks"].items()]
    return out + ([f"- errors: {gate['errors']}"] if gate["errors"] else [])


MENU_BEHAVIOUR = [("malformed calls", "malformed"), ("share that submit", "submitted"),
                  ("share that read first", "read_first"), ("turns", "turns"),
                  ("action-token entropy (nats)", "entropy")]


def menu_report(record: dict) -> tuple[dict, str]:
    """(numbers, markdown) of the menu lab's record."""
    seed = record["seed"]
    held = held_out_stats(record["before"], record["after"], seed)
    training = training_stats(record["history"])
    numbers = {k: v for k, v in record.items() if k not in ("history", "before", "after")}
    numbers.update({"held_out": held, "training": training,
                    "before": {k: v for k, v in record["before"].items()},
                    "after": {k: v for k, v in record["after"].items()}})
    excludes_zero = held["gain"]["lo"] > 0 or held["gain"]["hi"] < 0
    md = ["# Menu lab: the recipe on a Qwen3 backend through Qwen3's chat template", "",
          "**" + HONEST_LABEL.format(parameters=record["parameters"]) + "**", "",
          f"Model: `{record['model_dir']}` ({record['backend']} backend, {record['parameters']:,} parameters, "
          f"device {record['device']}), seed {seed}. Cold start: {record['cold_start']['demos']} scripted-expert "
          f"conversations (expert pass {record['cold_start']['demo_pass']:.2f}), cross-entropy "
          f"{record['cold_start']['loss_first']:.2f} -> {record['cold_start']['loss_last']:.2f}. "
          f"GRPO: {training['steps']} steps.", "",
          "## Held-out pass (hidden tests)", "",
          f"{held['tasks']} held-out tasks x {held['episodes_per_task']} episodes, temperature 1; per-task means "
          "with a 95% task-bootstrap interval; gain = paired bootstrap difference after - before.", "",
          "| | pass rate [95% CI] |", "|---|---|",
          f"| after cold start (before GRPO) | {interval(held['before'])} |",
          f"| after GRPO | {interval(held['after'])} |",
          f"| paired gain | {interval(held['gain'])} |", "",
          f"The paired interval {'excludes' if excludes_zero else 'includes'} 0"
          + ("." if excludes_zero else ": at this budget the run does not show a gain; see the training columns "
             "below for why (groups without a gradient, entropy)."), "",
          *behaviour_table(record["before"], record["after"], MENU_BEHAVIOUR), "",
          "## Training (GRPO steps)", "",
          "| column | value |", "|---|---|",
          f"| action-token entropy per step (nats) | {', '.join(fmt(e) for e in training['entropy_per_step'])} |",
          f"| zero-advantage share (groups with equal rewards) | {fmt(training['zero_adv_share'])} |",
          f"| sampler-trainer gap, mean / max (nats per token) | {fmt(training['sampler_trainer_gap_mean'], 8)} / "
          f"{fmt(training['sampler_trainer_gap_max'], 8)} |",
          f"| malformed calls per training episode | {fmt(training['malformed'])} |",
          f"| training pass rate (mean; per step) | {fmt(training['train_pass_rate'])}; "
          f"{', '.join(fmt(p, 2) for p in training['pass_per_step'])} |", "",
          "## Per-task counts (held-out)", "", *per_task_table(record["before"], record["after"]), "",
          "## Preflight", "", *preflight_lines(record["preflight"]), "",
          "## Cost", "", *cost_lines(record), ""]
    return numbers, "\n".join(md)


TOOLS_BEHAVIOUR = [("malformed calls", "malformed"), ("Write calls", "writes"), ("test runs", "test_runs"),
                   ("share that answer (a turn without a tool call)", "answered"),
                   ("share that Read first", "read_first"),
                   ("final answers claiming success while the hidden tests fail", "false_success_claims"),
                   ("turns", "turns"), ("action-token entropy (nats)", "entropy")]
TOOLS_LABEL = HONEST_LABEL.replace("a scripted expert", "the generic-tools scripted expert (Read, Edit with whole "
                                   "lines, pytest, answer)")


def tools_tables(before: dict, after: dict) -> list[str]:
    out = ["| failed calls per episode, by kind | before GRPO | after GRPO |", "|---|---|---|"]
    out += [f"| {kind.replace('_', ' ')} | {fmt(before['failed_calls'][kind])} | {fmt(after['failed_calls'][kind])} |"
            for kind in before["failed_calls"]]
    out += ["", "| family (held-out) | before (passed/episodes) | after |", "|---|---|---|"]
    out += [f"| {fam} | {b['c']}/{b['n']} | {after['per_family'][fam]['c']}/{after['per_family'][fam]['n']} |"
            for fam, b in before["per_family"].items()]
    return out


def tools_report(record: dict) -> tuple[dict, str]:
    """(numbers, markdown) of the tools lab's record."""
    numbers, _ = menu_report(record)
    held, training = numbers["held_out"], numbers["training"]
    sandbox = record["sandbox"]
    md = ["# Tools lab: generic coding tools on a Qwen3 backend through Qwen3's chat template", "",
          "**" + TOOLS_LABEL.format(parameters=record["parameters"]) + "**", "",
          f"Model: `{record['model_dir']}` ({record['parameters']:,} parameters, device {record['device']}), seed "
          f"{record['seed']}. Cold start: {record['cold_start']['demos']} expert conversations (expert pass "
          f"{record['cold_start']['demo_pass']:.2f}), cross-entropy {record['cold_start']['loss_first']:.2f} -> "
          f"{record['cold_start']['loss_last']:.2f}. GRPO: {training['steps']} steps. Every test run, script and "
          "final grade of model-written code ran in the sandbox (docs/sandbox.md).", "",
          "## Held-out pass (hidden tests, graded in the sandbox)", "",
          f"{held['tasks']} held-out tasks x {held['episodes_per_task']} episodes, temperature 1.", "",
          "| | pass rate [95% CI] |", "|---|---|",
          f"| after cold start (before GRPO) | {interval(held['before'])} |",
          f"| after GRPO | {interval(held['after'])} |",
          f"| paired gain | {interval(held['gain'])} |", "",
          *behaviour_table(record["before"], record["after"], TOOLS_BEHAVIOUR), "",
          *tools_tables(record["before"], record["after"]), "",
          "A final answer 'claims success' by a word heuristic (agentrl.env.coding.environment.claims_success).", "",
          "## Training (GRPO steps)", "", "| column | value |", "|---|---|",
          f"| action-token entropy per step (nats) | {', '.join(fmt(e) for e in training['entropy_per_step'])} |",
          f"| zero-advantage share | {fmt(training['zero_adv_share'])} |",
          f"| training pass rate (mean; per step) | {fmt(training['train_pass_rate'])}; "
          f"{', '.join(fmt(p, 2) for p in training['pass_per_step'])} |",
          f"| sampler-trainer gap, mean / max (nats per token) | {fmt(training['sampler_trainer_gap_mean'], 8)} / "
          f"{fmt(training['sampler_trainer_gap_max'], 8)} |",
          f"| sandbox share of a training step | {fmt(sandbox['share'])} ({sandbox['runs']} sandboxed steps, "
          f"{sandbox['seconds']:.1f} s of {sandbox['step_seconds']:.1f} s) |", "",
          "## Per-task counts (held-out)", "", *per_task_table(record["before"], record["after"]), "",
          "## Preflight", "", *preflight_lines(record["preflight"]), "",
          "## Cost", "", *cost_lines(record), ""]
    numbers["sandbox"] = sandbox
    return numbers, "\n".join(md)
