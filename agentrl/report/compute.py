"""The report's inputs and the few numbers it works out itself from them (no model, no sampling).

    load_docs            every stage output the report renders
    compute              the pinned config as read, CI levels, dashboard window means, stopping signals, the thread
                         effect against the seed spread, the fault catalogue's tally, the library versions. They go to
                         reports/capstone.json and are cited from there like any other stage output.
"""
from __future__ import annotations

import math
from importlib import metadata
from pathlib import Path

BASE = "reports/base.json"
START = "reports/starting_policy.json"
PREFLIGHT = "reports/preflight.json"
TRAIN = "reports/train.json"
DASHBOARD = "reports/train_dashboard.json"
SELECTION = "reports/selection.json"
TEST = "reports/test.json"
ABLATION = "reports/ablation.json"
THREADS = "reports/threads.json"
FAULTS = "reports/faults.json"
BEHAVIOUR = "reports/behaviour.json"
FAULTS_MD = "reports/faults.md"
CAPSTONE = "reports/capstone.json"
SOURCES = "reports/capstone_sources.json"
MARKDOWN = "reports/capstone.md"
FIG_DIR = "reports/figures/capstone"          # on disk, relative to the project root
FIG_LINK = "figures/capstone"                 # as linked from reports/capstone.md
PREFLIGHT_FIGURE = "reports/figures/preflight_matrix.png"
JSON_INPUTS = (BASE, START, PREFLIGHT, TRAIN, DASHBOARD, SELECTION, TEST, ABLATION, THREADS, FAULTS, BEHAVIOUR)
# the stage that writes each input (tests/test_dvc_yaml.py checks it against dvc.yaml)
WRITTEN_BY = {BASE: "base", START: "sft", PREFLIGHT: "preflight", TRAIN: "train", DASHBOARD: "train",
              SELECTION: "select", TEST: "test", ABLATION: "ablate_summary", THREADS: "threads", FAULTS: "faults",
              BEHAVIOUR: "behaviour", CAPSTONE: "report"}

DASHBOARD_WINDOW = 4     # steps averaged at each end of the main run (train.json first4 / last4)
WINDOW_METRICS = ("reward", "pass_rate", "reads", "tests", "turns", "malformed", "hardcode", "entropy",
                  "zero_adv_frac", "all_pass_frac", "approx_kl", "clip_frac", "grad_norm", "logp_gap")
VERSIONED = ("torch", "numpy", "scipy", "dvc", "mlflow", "matplotlib")


def input_paths(root: Path | str = ".") -> list[Path]:
    """Everything the stage reads (a missing one stops it before any output)."""
    root = Path(root)
    return [root / f for f in JSON_INPUTS + (PREFLIGHT_FIGURE, FAULTS_MD)]


def load_docs(root: Path) -> dict:
    from agentrl.core.artifacts import read_json
    return {f: read_json(root / f) for f in JSON_INPUTS}


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else None


def dashboard_windows(rows: list[dict], train: dict, window: int = DASHBOARD_WINDOW) -> dict:
    first = {k: _mean(r.get(k) for r in rows[:window]) for k in WINDOW_METRICS}
    last = {k: _mean(r.get(k) for r in rows[-window:]) for k in WINDOW_METRICS}
    agree = all(abs(first[k] - v) < 1e-9 for k, v in train.get("first4", {}).items() if first.get(k) is not None) and \
        all(abs(last[k] - v) < 1e-9 for k, v in train.get("last4", {}).items() if last.get(k) is not None)
    return {"window": window, "first": first, "last": last, "steps": len(rows), "agrees_with_train_json": agree}


def stopping(rows: list[dict], checkpoints: list[dict], window: int = DASHBOARD_WINDOW) -> dict:
    """Validation at each checkpoint next to the share of gradient-free groups in the batch sampled at that step
    (the policy the checkpoint froze); the validation peak (ties to the earlier step)."""
    by_step = {r["step"]: r for r in rows}
    table = []
    for c in checkpoints:
        r = by_step.get(c["step"])
        table.append({"step": c["step"], "pass_rate": c["pass_rate"], "dashboard_step": r["step"] if r else None,
                      "zero_adv_frac": r.get("zero_adv_frac") if r else None,
                      "all_pass_frac": r.get("all_pass_frac") if r else None,
                      "all_fail_frac": r.get("all_fail_frac") if r else None})
    peak = max(range(len(table)), key=lambda i: (table[i]["pass_rate"], -table[i]["step"]))
    last = {k: _mean(r.get(k) for r in rows[-window:]) for k in ("zero_adv_frac", "all_pass_frac", "all_fail_frac")}
    first_full = next((r["step"] for r in rows if r.get("zero_adv_frac") == 1.0), None)
    return {"rows": table, "peak_index": peak, "peak": table[peak], "window": window, "last": last,
            "late_mostly_all_pass": (last["all_pass_frac"] or 0) > (last["all_fail_frac"] or 0),
            "first_step_all_groups_zero_adv": first_full}


def thread_effect(threads: dict, ablation: dict) -> dict:
    ref = ablation["power"]["reference_arm"]
    arm = ablation["arms"][ref]
    diff = threads["heldout_main"] - threads["heldout_compare"]
    sd = arm["seed_sd"]
    seeds = list(arm["per_seed"].values())
    return {"reference_arm": ref, "heldout_diff": diff, "abs_diff": abs(diff), "seed_sd": sd,
            "diff_in_seed_sds": abs(diff) / sd if sd > 0 else None, "within_seed_sd": abs(diff) <= sd,
            "seed_range": max(seeds) - min(seeds) if seeds else None,
            "within_seed_range": abs(diff) <= (max(seeds) - min(seeds)) if seeds else None,
            "bit_identical": threads["max_param_diff"] == 0 and threads.get("first_divergent_step") is None}


def faults_summary(faults: dict) -> dict:
    """How many failures the catalogue holds and how many of their signatures reproduced."""
    sig = faults["signatures"]
    return {"failures": len(sig), "all_checks_hold": sum(bool(v.get("holds")) for v in sig.values()),
            "required_hold": sum(v.get("required_holds") is not False for v in sig.values())}


def versions() -> dict:
    """The libraries the numbers were computed with (the same platform gives the same bytes)."""
    import platform
    out = {"python": platform.python_version()}
    for name in VERSIONED:
        try:
            out[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            out[name] = "not installed"
    return out


def compute(params: dict, docs: dict) -> dict:
    from agentrl.core.config import section_values
    st = docs[START]
    return {
        "config": {s: section_values(s, obj) for s, obj in params.items()},
        "versions": versions(),
        "ci_level": {"select": 1 - docs[SELECTION]["alpha"], "test": 1 - docs[TEST]["alpha"],
                     "ablate": 1 - docs[ABLATION]["alpha"]},
        "dashboard": dashboard_windows(docs[DASHBOARD], docs[TRAIN]),
        "stopping": stopping(docs[DASHBOARD], docs[TRAIN]["checkpoints"]),
        "threads": thread_effect(docs[THREADS], docs[ABLATION]),
        "faults": faults_summary(docs[FAULTS]),
        "starting": {"base_more_groups_with_gradient":
                     st["base"]["groups_with_gradient"] > st["sft"]["groups_with_gradient"],
                     "base_lower_pass_at_1": st["base"]["pass_at_1"] < st["sft"]["pass_at_1"]},
    }
