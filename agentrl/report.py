"""The capstone report (SPEC §8 item 10): reports/capstone.md, its figures, and the two files that make it auditable.

Read top to bottom:
  fmt_value / Sources        every number in the markdown is read from `reports/<file>.json:<dotted.path>` and
                             formatted by `Sources`, which records (text, source, format) in order; the list is
                             written to reports/capstone_sources.json, and `python -m agentrl audit <source>`
                             answers for any of them
  compute(...)               the numbers the report works out itself (config as pinned, CI levels, dashboard
                             window means, stopping signals, thread effect vs seed spread, and what the agent
                             learned: the chosen checkpoint and the starting policy re-evaluated on the held-out
                             tasks). They go to reports/capstone.json, with this stage's provenance, and are cited
                             from there like any other stage output
  make_figures(...)          PNGs under reports/figures/capstone/ (plotting lives in agentrl.figures)
  render(...)                the markdown, section by section
  build(...)                 all of the above, in that order (capstone.json is written before anything cites it)

Paths in a source spec follow agentrl.tracking.extract: dotted keys, list indices as parts. Keys that contain dots
(provenance params such as "rl.lr") are never cited; the pinned config is cited from capstone.json
config.<section>.<key> instead.
"""
from __future__ import annotations

import math
from pathlib import Path
from typing import Any

SECTIONS = ["model", "base", "sft", "rl", "preflight", "train", "select", "test", "ablate", "faults", "threads",
            "report", "tasks"]

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
FAULTS_MD = "reports/faults.md"
CAPSTONE = "reports/capstone.json"
SOURCES = "reports/capstone_sources.json"
MARKDOWN = "reports/capstone.md"
FIG_DIR = "reports/figures/capstone"          # on disk, relative to the project root
FIG_LINK = "figures/capstone"                 # as linked from reports/capstone.md
PREFLIGHT_FIGURE = "reports/figures/preflight_matrix.png"

JSON_INPUTS = (BASE, START, PREFLIGHT, TRAIN, DASHBOARD, SELECTION, TEST, ABLATION, THREADS, FAULTS)

HEADINGS = ("Summary", "Pinned configuration", "Preflight", "Starting policy", "Training dashboard", "Checkpoints",
            "Test", "Ablation", "What the agent learned", "Power", "Stopping signals", "Thread-count experiment",
            "Fault catalogue", "Provenance")

# The nine invariants' pass rules as diagnostics.sanity_checks applies them (SPEC §6). preflight.json records each
# check's value and verdict but not its rule, so the rules are stated here once, written to capstone.json
# (thresholds.<check>) and cited from there; if preflight.json ever carries `thresholds`, those are used instead.
INVARIANT_RULES = {
    "mask_is_policy": ("=", 0), "sampler_trainer_gap": ("<", 1e-4), "ratio_is_one": ("<", 1e-4),
    "group_adv_mean": ("<", 1e-5), "padding_invariance": ("<", 1e-5), "accumulation": ("<", 1e-4),
    "old_logp_frozen": (">", 0), "update_direction": (">", 0), "kl_to_reference": (">", 0),
}
DASHBOARD_WINDOW = 4     # steps averaged at each end of the main run (train.json first4 / last4)
TOP_SEQUENCES = 5        # most frequent tool sequences shown
WINDOW_METRICS = ("reward", "pass_rate", "reads", "tests", "turns", "malformed", "hardcode", "entropy",
                  "zero_adv_frac", "all_pass_frac", "approx_kl", "clip_frac", "grad_norm", "logp_gap")
BEHAVIOUR_KEYS = ("pass_rate", "submitted", "reads", "read_first", "tests", "edits", "turns", "malformed",
                  "hardcode", "policy_tokens", "length_pass", "length_fail")


# ---------------------------------------------------------------------------------------------------------------
# formatting and the source record

def fmt_value(value: Any, fmt: str) -> str:
    """Text of one reported value. `fmt` is a Python format spec (".3f", "+.3f", ".0%", ".2e", "d", "g") or one of:
    "str" (as written in params.yaml: true/false, [a, b]), "yesno", "passfail", "list" (comma-separated, "none"
    when empty), "sha12" (first 12 characters). None is "n/a" in every format."""
    if value is None:
        return "n/a"
    if fmt == "str":
        if isinstance(value, bool):
            return "true" if value else "false"
        if isinstance(value, (list, tuple)):
            return "[" + ", ".join(fmt_value(v, "str") for v in value) + "]"
        return str(value)
    if fmt == "yesno":
        return "yes" if value else "no"
    if fmt == "passfail":
        return "pass" if value else "FAIL"
    if fmt == "list":
        return ", ".join(fmt_value(v, "str") for v in value) if value else "none"
    if fmt == "sha12":
        return str(value)[:12]
    if isinstance(value, float) and not math.isfinite(value):
        return "n/a"
    return format(value, fmt)


class Sources:
    """Formats values read from loaded stage outputs and records where each came from, in order."""

    def __init__(self, docs: dict[str, Any]):
        self.docs = docs
        self.entries: list[dict] = []

    def has(self, file: str, path: str) -> bool:
        try:
            self.get(file, path)
            return True
        except Exception:  # noqa: BLE001 - AuditError / KeyError: not there
            return False

    def get(self, file: str, path: str) -> Any:
        from agentrl.tracking import extract
        if file not in self.docs or self.docs[file] is None:
            raise KeyError(f"{file} not loaded")
        return extract(self.docs[file], path, file)

    def __call__(self, file: str, path: str, fmt: str = ".3f") -> str:
        text = fmt_value(self.get(file, path), fmt)
        self.entries.append({"text": text, "source": f"{file}:{path}", "format": fmt})
        return text

    def ci(self, file: str, lo: str, hi: str, fmt: str = ".3f") -> str:
        return f"[{self(file, lo, fmt)}, {self(file, hi, fmt)}]"


# ---------------------------------------------------------------------------------------------------------------
# inputs

def input_paths(root: Path | str = ".", require_faults: bool = True) -> list[Path]:
    """Everything the stage reads (hashed into its provenance; a missing one stops it before any output)."""
    root = Path(root)
    files = [f for f in JSON_INPUTS if require_faults or f != FAULTS]
    extra = [PREFLIGHT_FIGURE] + ([FAULTS_MD] if require_faults else [])
    return [root / f for f in files + extra] + [root / "data/tasks/tokenizer.json", root / "data/tasks/split.json",
                                                root / "data/models/base.pt", root / "data/train/checkpoints"]


def load_docs(root: Path, require_faults: bool = True) -> dict[str, Any]:
    from agentrl.pipeline import read_json
    docs = {}
    for f in JSON_INPUTS:
        if f == FAULTS and not (root / f).exists() and not require_faults:
            docs[f] = None
            continue
        docs[f] = read_json(root / f)
    return docs


# ---------------------------------------------------------------------------------------------------------------
# what the report computes itself

def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        name = f"{prefix}.{k}" if prefix else k
        if isinstance(v, dict) and v:
            out.update(_flatten(v, name))
        else:
            out[name] = v
    return out


def _same(a, b) -> bool:
    if a == b:
        return True
    try:
        return not isinstance(a, bool) and not isinstance(b, bool) and float(a) == float(b)
    except (TypeError, ValueError):
        return False


def _mean(values) -> float | None:
    vals = [float(v) for v in values if v is not None and math.isfinite(float(v))]
    return sum(vals) / len(vals) if vals else None


def config_check(config: dict, docs: dict) -> dict:
    """Do the params each stage output recorded agree with the params pinned now?"""
    pinned = _flatten(config)
    mismatches, checked = [], []
    for file, doc in docs.items():
        prov = doc.get("provenance") if isinstance(doc, dict) else None
        if not prov:
            continue
        checked.append(file)
        for key, old in sorted(prov.get("params", {}).items()):
            if key in pinned and not _same(old, pinned[key]):
                mismatches.append({"file": file, "key": key, "recorded": old, "pinned": pinned[key]})
    return {"files_checked": len(checked), "files": checked, "mismatches": mismatches,
            "n_mismatches": len(mismatches), "all_match": not mismatches}


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
    ref = ablation.get("power", {}).get("reference_arm", "default")
    arm = ablation["arms"][ref]
    diff = threads["heldout_main"] - threads["heldout_compare"]
    sd = arm["seed_sd"]
    seeds = list(arm["per_seed"].values())
    return {"reference_arm": ref, "heldout_diff": diff, "abs_diff": abs(diff), "seed_sd": sd,
            "diff_in_seed_sds": abs(diff) / sd if sd > 0 else None, "within_seed_sd": abs(diff) <= sd,
            "seed_range": max(seeds) - min(seeds) if seeds else None,
            "within_seed_range": abs(diff) <= (max(seeds) - min(seeds)) if seeds else None,
            "bit_identical": threads["max_param_diff"] == 0 and threads.get("first_divergent_step") is None}


def transcript(tr, tok) -> list[str]:
    """The decoded tokens of one episode as lines: the prompt, then each call and each observation."""
    from agentrl.gym import NL
    from agentrl.rollout import OWNER
    names = {v: k for k, v in OWNER.items()}
    segments: list[tuple[str, list[str]]] = []
    for i, o in zip(tr.ids, tr.owner):
        if segments and segments[-1][0] == names[o]:
            segments[-1][1].append(tok.vocab[i])
        else:
            segments.append((names[o], [tok.vocab[i]]))
    lines, turn = [], 0
    for who, toks in segments:
        if who == "prompt":
            lines.append("prompt   " + " ".join(toks))
        elif who == "policy":
            turn += 1
            lines.append(f"call {turn:<3d} " + " ".join(toks))
        else:
            parts, cur = [], []
            for t in toks:
                if t == NL:
                    parts.append(cur)
                    cur = []
                else:
                    cur.append(t)
            parts.append(cur)
            lines.append("obs      " + " ".join(parts[0]))
            lines += ["         " + " ".join(p) for p in parts[1:]]
    return lines


def _episode(tr) -> dict:
    info = tr.info
    return {"task": info["task"], "family": info["family"], "function_name": info["name"], "reward": tr.reward,
            "submitted": info["submitted"], "hidden_pass": info["hidden_pass"], "public_pass": info["public_pass"],
            "ops": list(info["ops"]), "tools": list(info["tools"]), "n_turns": info["n_turns"],
            "n_invalid": info["n_invalid"]}


def learned(params: dict, root: Path, chosen_path: str, families: list[str]) -> dict:
    """Re-evaluate the chosen checkpoint and the starting policy on every held-out task (same generator seed for
    both): behaviour statistics, most frequent tool sequences, first edit op per task, failure transcripts."""
    import torch

    from agentrl.evaluation import behavior_stats, evaluate, top_sequences
    from agentrl.gym import OPS
    from agentrl.pipeline import derive_seed, load_split, load_tokenizer
    from agentrl.policy import load_for
    from agentrl.trainer import RLConfig

    rcfg, seed = params["report"], params["run"].seed
    tok = load_tokenizer(root / "data/tasks/tokenizer.json")
    split = load_split(root / "data/tasks/split.json")
    tasks = split["heldout"]
    cfg = RLConfig(**params["rl"].to_dict() | {"seed": seed})
    out = {"episodes_per_task": rcfg.learned_per_task, "generator": "derive_seed(run.seed, 'report-learned')",
           "top_k": TOP_SEQUENCES, "tasks": [t.name for t in tasks],
           "oracle": {t.name: t.oracle for t in tasks}, "ops": list(OPS) + ["none"],
           "checkpoint": chosen_path}
    for label, path in (("start", root / "data/models/base.pt"), ("chosen", root / chosen_path)):
        model, _ = load_for(path, tok, params["model"])
        g = torch.Generator().manual_seed(derive_seed(seed, "report-learned"))
        res = evaluate(model, tasks, tok, rcfg.learned_per_task, cfg.temperature, g, cfg)
        trajs = res["trajs"]
        beh = behavior_stats(trajs)
        first_ops = {t.name: {op: 0 for op in out["ops"]} for t in tasks}
        for tr in trajs:
            first_ops[tr.info["task"]][tr.info["ops"][0] if tr.info["ops"] else "none"] += 1
        n = len(trajs)
        seqs = [{"sequence": s, "count": c, "share": c / n} for s, c in top_sequences(trajs, TOP_SEQUENCES)]
        per_task = {name: {**v, "rate": v["c"] / v["n"]} for name, v in res["per_task"].items()}
        oracle_share = {t.name: first_ops[t.name][t.oracle] / per_task[t.name]["n"] for t in tasks}
        entry = {"behavior": beh, "top_sequences": seqs, "first_ops": first_ops, "per_task": per_task,
                 "oracle_first_share": oracle_share, "oracle_first_overall": _mean(oracle_share.values()),
                 "episodes": n, "distinct_sequences": len({" ".join(t.info["tools"]) for t in trajs})}
        if label == "chosen":
            fams = {}
            for fam in families:
                in_fam = [tr for tr in trajs if tr.info["family"] == fam]
                failed = [tr for tr in in_fam if tr.reward <= 0]
                fams[fam] = {"episodes": len(in_fam), "failures": len(failed),
                             "transcripts": [{**_episode(tr), "lines": transcript(tr, tok)}
                                             for tr in failed[:rcfg.transcripts_per_family]]}
            entry["families"] = fams
        out[label] = entry
    out["families_with_failures"] = [f for f in families if out["chosen"]["families"][f]["failures"] > 0]
    return out


def compute(params: dict, docs: dict, root: Path) -> dict:
    from agentrl.pipeline import section_values
    config = {s: section_values(s, obj) for s, obj in params.items()}
    pre = docs[PREFLIGHT]
    thresholds = {}
    for check in pre["checks"]:
        rel, value = INVARIANT_RULES.get(check, ("?", None))
        thresholds[check] = {"relation": rel, "value": value}
    families = list(params["tasks"].families)
    st = docs[START]
    return {
        "config": config,
        "config_check": config_check(config, docs),
        "ci_level": {"select": 1 - docs[SELECTION]["alpha"], "test": 1 - docs[TEST]["alpha"],
                     "ablate": 1 - docs[ABLATION]["alpha"]},
        "thresholds": thresholds,
        "dashboard": dashboard_windows(docs[DASHBOARD], docs[TRAIN]),
        "stopping": stopping(docs[DASHBOARD], docs[TRAIN]["checkpoints"]),
        "threads": thread_effect(docs[THREADS], docs[ABLATION]),
        "faults": faults_summary(docs.get(FAULTS)),
        "power_assumptions": power_assumptions(),
        "describe": {"group_size": _default(describe_fn(), "group_size")},
        "starting": {"base_more_groups_with_gradient": st["base"]["groups_with_gradient"] > st["sft"]["groups_with_gradient"],
                     "base_lower_pass_at_1": st["base"]["pass_at_1"] < st["sft"]["pass_at_1"]},
        "learned": learned(params, root, docs[SELECTION]["chosen"]["checkpoint"], families),
    }


def _default(fn, name: str):
    import inspect
    return inspect.signature(fn).parameters[name].default


def describe_fn():
    from agentrl.evaluation import describe
    return describe


def power_assumptions() -> dict:
    """The power and level the ablation summary's seed and task counts assume (agentrl.stats defaults; the
    summary stage calls seeds_for_power / tasks_for_power without overriding them)."""
    from agentrl.stats import seeds_for_power, tasks_for_power
    out = {"power": _default(seeds_for_power, "power"), "alpha": _default(seeds_for_power, "alpha")}
    out["tasks_same"] = (_default(tasks_for_power, "power"), _default(tasks_for_power, "alpha")) == \
        (out["power"], out["alpha"])
    return out


# ---------------------------------------------------------------------------------------------------------------
# figures

def make_figures(docs: dict, root: Path) -> dict[str, str]:
    """Write the report's PNGs; returns {name: link relative to reports/capstone.md}."""
    from agentrl import figures
    fig_dir = root / FIG_DIR
    cap, train, rows = docs[CAPSTONE], docs[TRAIN], docs[DASHBOARD]
    checkpoints = [(c["step"], c["pass_rate"]) for c in train["checkpoints"]]
    links = {}

    def out(name):
        links[name] = f"{FIG_LINK}/{name}.png"
        return fig_dir / f"{name}.png"

    gap_rule = _threshold(docs, "sampler_trainer_gap")[1]
    figures.training_dashboard(out("dashboard"), rows, checkpoints, _get(docs, *gap_rule),
                               docs[SELECTION]["chosen"]["step"])
    abl = docs[ABLATION]
    arms = _arm_order(docs)
    ref = abl["power"]["reference_arm"]
    figures.ablation_forest(out("ablation_forest"), arms,
                            {a: (abl["arms"][a]["diff_vs_default"]["mean"], abl["arms"][a]["diff_vs_default"]["ci_lo"],
                                 abl["arms"][a]["diff_vs_default"]["ci_hi"]) for a in arms
                             if "diff_vs_default" in abl["arms"][a]},
                            {a: (abl["arms"][a]["heldout_pass"], abl["arms"][a]["ci_lo"], abl["arms"][a]["ci_hi"])
                             for a in arms},
                            {a: list(abl["arms"][a]["per_seed"].values()) for a in arms}, ref,
                            f"{cap['ci_level']['ablate']:.0%} CI")
    figures.stopping_signals(out("stopping_signals"), rows, checkpoints, cap["stopping"]["peak"]["step"])
    th = docs[THREADS]
    figures.thread_rewards(out("threads"), th["reward_main"], th["reward_compare"],
                           f"{th['main_threads']} threads (main run)", f"{th['compare_threads']} thread(s)",
                           th.get("first_divergent_step"))
    ln = cap["learned"]
    figures.op_choices(out("op_choices"), ln["tasks"], ln["ops"],
                       [[ln["chosen"]["first_ops"][t][op] for op in ln["ops"]] for t in ln["tasks"]],
                       [ln["oracle"][t] for t in ln["tasks"]])
    return links


def _get(docs, file, path):
    from agentrl.tracking import extract
    return extract(docs[file], path, file)


def _threshold(docs: dict, check: str) -> tuple[tuple[str, str], tuple[str, str]]:
    """((file, path) of the relation, (file, path) of the value) of an invariant's pass rule."""
    pre = docs[PREFLIGHT]
    if isinstance(pre.get("thresholds"), dict) and check in pre["thresholds"]:
        t = pre["thresholds"][check]
        if isinstance(t, dict) and "value" in t:
            return (PREFLIGHT, f"thresholds.{check}.relation"), (PREFLIGHT, f"thresholds.{check}.value")
    return (CAPSTONE, f"thresholds.{check}.relation"), (CAPSTONE, f"thresholds.{check}.value")


def _arm_order(docs: dict) -> list[str]:
    arms = docs[ABLATION]["arms"]
    pinned = docs[CAPSTONE]["config"]["ablate"]["arms"]
    return [a for a in pinned if a in arms] + sorted(a for a in arms if a not in pinned)


# ---------------------------------------------------------------------------------------------------------------
# the markdown

def _table(header: list[str], rows: list[list[str]]) -> list[str]:
    return ["| " + " | ".join(header) + " |", "|" + "|".join("---" for _ in header) + "|"] + \
        ["| " + " | ".join(r) + " |" for r in rows] + [""]


def render(docs: dict, links: dict) -> tuple[str, list[dict]]:
    S = Sources(docs)
    cap = docs[CAPSTONE]
    L: list[str] = []
    sec_summary(L, S, docs)
    sec_config(L, S, docs)
    sec_preflight(L, S, docs)
    sec_start(L, S, docs)
    sec_dashboard(L, S, docs, links)
    sec_checkpoints(L, S, docs)
    sec_test(L, S, docs)
    sec_ablation(L, S, docs, links)
    sec_learned(L, S, docs, links)
    sec_power(L, S, docs)
    sec_stopping(L, S, docs, links)
    sec_threads(L, S, docs, links)
    sec_faults(L, S, docs)
    sec_provenance(L, S, docs)
    assert cap is docs[CAPSTONE]
    return "\n".join(L).rstrip() + "\n", S.entries


def _p1(S, docs) -> str:
    ks = docs[TEST].get("ks", [])
    return f"pass@{S(TEST, f'ks.{ks.index(1)}', 'd')}" if 1 in ks else "pass@1"


def sec_summary(L, S, docs):
    lv = S(CAPSTONE, "ci_level.test", ".0%")
    L += ["# TinyAgent capstone report", "",
          "A small causal transformer learns, by GRPO with hidden-test rewards, to repair buggy Python functions "
          "through tool calls. Generated by `python -m stages.report` from the stage outputs in `reports/`. Every "
          "number below is read from a stage output; `reports/capstone_sources.json` lists each one with its "
          "source (`<file>.json:<path>`), and `python -m agentrl audit <source>` says which params, inputs, code and "
          "thread count produced it.", "",
          "## Summary", "",
          f"- Test {_p1(S, docs)} (chosen checkpoint, step {S(SELECTION, 'chosen.step', 'd')}): "
          f"{S(TEST, 'chosen.pass_at_1')} {S.ci(TEST, 'chosen.ci_lo', 'chosen.ci_hi')} ({lv} task-bootstrap CI), "
          f"starting policy {S(TEST, 'start.pass_at_1')} {S.ci(TEST, 'start.ci_lo', 'start.ci_hi')}; paired "
          f"difference {S(TEST, 'paired_diff.mean', '+.3f')} "
          f"{S.ci(TEST, 'paired_diff.ci_lo', 'paired_diff.ci_hi', '+.3f')}.",
          f"- Validation pass rate of the chosen checkpoint: {S(SELECTION, 'chosen.pass_rate')} "
          f"{S.ci(SELECTION, 'chosen.ci_lo', 'chosen.ci_hi')}.",
          "- Ablation (held-out, mean over seeds): " + "; ".join(
              f"{a} {S(ABLATION, f'arms.{a}.heldout_pass')}" for a in _arm_order(docs)) + ".",
          f"- Preflight gate: {S(PREFLIGHT, 'gate', 'str')}; injected faults caught as expected: "
          f"{S(PREFLIGHT, 'matches_expected', 'yesno')}.", ""]


def sec_config(L, S, docs):
    cap = docs[CAPSTONE]
    L += ["## Pinned configuration", "",
          "Every field of `params.yaml` as this report read it (validated; defaults filled in).", ""]
    rows = []
    order = ["run", "tasks"] + SECTIONS
    for section in sorted(cap["config"], key=lambda x: (order.index(x) if x in order else len(order), x)):
        for key in cap["config"][section]:
            rows.append([section, key, S(CAPSTONE, f"config.{section}.{key}", "str")])
    L += _table(["section", "key", "value"], rows)
    cc = cap["config_check"]
    mism = cc["mismatches"]
    L += [f"Recorded params of the {S(CAPSTONE, 'config_check.files_checked', 'd')} stage outputs read here agree "
          f"with the pinned values: {S(CAPSTONE, 'config_check.all_match', 'yesno')} "
          f"({S(CAPSTONE, 'config_check.n_mismatches', 'd')} mismatches)."
          + ("" if not mism else " Mismatches: " + "; ".join(
              f"{S(CAPSTONE, f'config_check.mismatches.{i}.file', 'str')} "
              f"{S(CAPSTONE, f'config_check.mismatches.{i}.key', 'str')} recorded "
              f"{S(CAPSTONE, f'config_check.mismatches.{i}.recorded', 'str')}, pinned "
              f"{S(CAPSTONE, f'config_check.mismatches.{i}.pinned', 'str')}" for i in range(len(mism))) + "."), ""]
    L += [f"TinyAgent has {S(BASE, 'parameters', ',d')} parameters (fp32).", "",
          "Library versions (this report's run): " + ", ".join(
              f"{k} {S(CAPSTONE, f'provenance.versions.{k}', 'str')}" for k in cap["provenance"]["versions"]) + ".",
          "", "Code version, thread count and library versions per stage output:", ""]
    rows = []
    for file in JSON_INPUTS + (CAPSTONE,):
        doc = docs.get(file)
        if not isinstance(doc, dict) or "provenance" not in doc:
            continue
        rows.append([f"`{file}`", S(file, "provenance.stage", "str"), S(file, "provenance.threads", "str"),
                     S(file, "provenance.git_commit", "sha12"), S(file, "provenance.dirty", "yesno"),
                     S(file, "provenance.code_hash", "str"), S(file, "provenance.versions.torch", "str"),
                     S(file, "provenance.versions.python", "str")])
    L += _table(["output", "stage", "threads", "git commit", "dirty", "code hash", "torch", "python"], rows)
    if isinstance(docs[DASHBOARD], list):
        L += [f"`{DASHBOARD}` is a DVC plots file (a list of dashboard rows) and carries no provenance block of its "
              f"own; it is written by the train stage together with `{TRAIN}`.", ""]


def _rule(S, docs, check) -> str:
    (rf, rp), (vf, vp) = _threshold(docs, check)
    return f"{S(rf, rp, 'str')} {S(vf, vp, 'g')}"


def sec_preflight(L, S, docs):
    pre = docs[PREFLIGHT]
    L += ["## Preflight", "",
          f"The nine invariants on one step-0 batch of {S(PREFLIGHT, 'batch_episodes', 'd')} episodes from the RL "
          f"base (KL coefficient {S(PREFLIGHT, 'kl_coef', 'g')} so the KL check has teeth). Gate: "
          f"{S(PREFLIGHT, 'gate', 'str')}.", "", "Clean trainer, with margins:", ""]
    rows = []
    for i, check in enumerate(pre["checks"]):
        rows.append([str(i + 1), f"`{check}`", S(PREFLIGHT, f"clean.{check}.value", ".3g"), _rule(S, docs, check),
                     S(PREFLIGHT, f"clean.{check}.passed", "passfail")])
    L += _table(["#", "invariant", "value", "passes if", "result"], rows)
    L += ["Fault matrix: each injected fault (rows) against each invariant (columns, numbered as above). "
          "FAIL = the invariant caught the fault; (expected) marks the cells SPEC §6 expects to fail.", ""]
    header = ["fault"] + [str(i + 1) for i in range(len(pre["checks"]))] + ["failed", "expected"]
    rows = []
    pinned = ["None"] + list(docs[CAPSTONE]["config"]["preflight"]["bugs"])
    for bug in [b for b in pinned if b in pre["matrix"]] + sorted(b for b in pre["matrix"] if b not in pinned):
        expected = set(pre["expected"].get(bug, []))
        cells = []
        for i, check in enumerate(pre["checks"]):
            text = S(PREFLIGHT, f"matrix.{bug}.{check}.passed", "passfail")
            if i + 1 in expected:
                text = f"**{text}** (expected)"
            cells.append(text)
        name = "clean" if bug == "None" else f"`{bug}`"
        rows.append([name] + cells + [S(PREFLIGHT, f"failed.{bug}", "list"), S(PREFLIGHT, f"expected.{bug}", "list")])
    L += _table(header, rows)
    L += [f"Every fault caught exactly where expected: {S(PREFLIGHT, 'matches_expected', 'yesno')}.", "",
          "![Preflight fault matrix](figures/preflight_matrix.png)", "",
          "Environment check on the train tasks (renamed functions): the keyword-rule expert against a uniformly "
          "random caller.", ""]
    whos = [w for w in ("expert", "random") if w in pre["environment"]]
    counts = sorted({k for w in whos for k in pre["environment"][w]["reward_counts"]})
    rows = []
    for who in whos:
        rows.append([who, S(PREFLIGHT, f"environment.{who}.episodes", "d"),
                     S(PREFLIGHT, f"environment.{who}.mean_reward")] +
                    [S(PREFLIGHT, f"environment.{who}.reward_counts.{k}", "d") for k in counts] +
                    [S(PREFLIGHT, f"environment.{who}.mean_turns", ".2f"),
                     S(PREFLIGHT, f"environment.{who}.invalid_per_episode", ".2f")])
    L += _table(["policy", "episodes", "mean reward"] + [f"episodes with reward {k}" for k in counts] +
                ["turns", "invalid calls per episode"], rows)


def sec_start(L, S, docs):
    st = docs[START]
    L += ["## Starting policy", "",
          f"The RL base (behaviour-cloned from a scripted mixture) against the SFT cold start "
          f"({S(START, 'sft_steps', 'd')} steps on {S(START, 'sft_demos', 'd')} oracle demonstrations, "
          f"{S(START, 'sft_tokens', 'd')} trained tokens), each described on "
          f"{S(START, 'base.episodes', 'd')} episodes on the train tasks.", ""]
    gs = S(CAPSTONE, "describe.group_size", "d")
    ks = sorted((k for k in st.get("base", {}) if k.startswith("pass_at_")), key=lambda k: int(k.split("_")[-1]))
    metrics = [(k.replace("pass_at_", "pass@"), k, ".3f") for k in ks] + [
               (f"groups of {gs} with a gradient", "groups_with_gradient", ".3f"),
               ("action entropy (nats)", "entropy", ".3f"), ("reads per episode", "reads", ".3f"),
               ("malformed calls per episode", "malformed", ".3f"), ("hardcode share", "hardcode", ".3f")]
    rows = [[label, S(START, f"base.{k}", f), S(START, f"sft.{k}", f)] for label, k, f in metrics
            if k in st.get("base", {}) and k in st.get("sft", {})]
    L += _table(["", "RL base", "SFT"], rows)
    cmp = docs[CAPSTONE]["starting"]
    why = []
    if cmp["base_lower_pass_at_1"]:
        why.append("it leaves room to learn (lower pass@1)")
    if cmp["base_more_groups_with_gradient"]:
        why.append("more of its groups carry a gradient")
    L += ["The main run, the test comparison and every ablation arm except `sft` start from the RL base"
          + (": " + " and ".join(why) if why else "") + "; the `sft` ablation arm measures the other choice.", ""]


def sec_dashboard(L, S, docs, links):
    cap = docs[CAPSTONE]
    L += ["## Training dashboard", "",
          f"Main run: {S(TRAIN, 'steps', 'd')} steps from the RL base; a checkpoint every "
          f"{S(TRAIN, 'checkpoint_every', 'd')} steps evaluated on the validation tasks "
          f"({S(TRAIN, 'eval_per_task', 'd')} episodes each, own generator). Panels: outcome, behaviour, entropy, "
          f"share of groups with zero advantage (all-pass and all-fail), approx_kl (log scale, mean and per-step "
          f"max), and the sampler-trainer log-prob gap (log scale) against the preflight threshold (passes if "
          f"{_rule(S, docs, 'sampler_trainer_gap')}).", "",
          f"![Training dashboard]({links['dashboard']})", "",
          f"Means over the first and last {S(CAPSTONE, 'dashboard.window', 'd')} steps:", ""]
    rows = []
    for k in WINDOW_METRICS:
        if cap["dashboard"]["first"].get(k) is None:
            continue
        fmt = ".2e" if k in ("approx_kl", "logp_gap") else ".3f"
        if k in docs[TRAIN].get("first4", {}) and k in docs[TRAIN].get("last4", {}):
            a, b = S(TRAIN, f"first4.{k}", fmt), S(TRAIN, f"last4.{k}", fmt)
        else:
            a, b = S(CAPSTONE, f"dashboard.first.{k}", fmt), S(CAPSTONE, f"dashboard.last.{k}", fmt)
        rows.append([k, a, b])
    L += _table(["metric", "first steps", "last steps"], rows)
    L += [f"(Reward, reads and entropy are cited from `{TRAIN}`; the report's own window means of the dashboard agree "
          f"with them: {S(CAPSTONE, 'dashboard.agrees_with_train_json', 'yesno')}.)", ""]


def sec_checkpoints(L, S, docs):
    sel = docs[SELECTION]
    L += ["## Checkpoints", "",
          f"Validation pass rate of every checkpoint with its {S(CAPSTONE, 'ci_level.select', '.0%')} task-bootstrap "
          f"interval ({S(SELECTION, 'n_boot', ',d')} resamples of the validation tasks: "
          f"{', '.join(S(TRAIN, f'validation_tasks.{i}', 'str') for i in range(len(docs[TRAIN]['validation_tasks'])))}"
          f"). Chosen: highest validation pass rate, ties to the earlier step.", ""]
    rows = []
    for i, c in enumerate(sel["checkpoints"]):
        chosen = c["step"] == sel["chosen"]["step"]
        step = S(SELECTION, f"checkpoints.{i}.step", "d")
        rows.append([f"**{step}**" if chosen else step, S(SELECTION, f"checkpoints.{i}.pass_rate"),
                     S.ci(SELECTION, f"checkpoints.{i}.ci_lo", f"checkpoints.{i}.ci_hi"), "chosen" if chosen else ""])
    L += _table(["step", "validation pass", "CI", ""], rows)
    L += [f"Chosen checkpoint: step {S(SELECTION, 'chosen.step', 'd')}, `{S(SELECTION, 'chosen.checkpoint', 'str')}`.",
          ""]


def sec_test(L, S, docs):
    t = docs[TEST]
    L += ["## Test", "",
          f"The starting policy and the chosen checkpoint (step {S(TEST, 'chosen_step', 'd')}), each evaluated once on "
          f"the test tasks, {S(TEST, 'episodes_per_task', 'd')} episodes per task, from the same generator seed "
          f"(a paired comparison). pass@k is the unbiased estimator per task, averaged over tasks; intervals are "
          f"{S(CAPSTONE, 'ci_level.test', '.0%')} task-bootstrap intervals.", ""]
    rows = []
    for i, k in enumerate(t["ks"]):
        key = str(k)
        row = [f"pass@{S(TEST, f'ks.{i}', 'd')}", S(TEST, f"start.pass_at_k.{key}"), S(TEST, f"chosen.pass_at_k.{key}")]
        rows.append(row)
    rows.append([f"{_p1(S, docs)} CI", S.ci(TEST, "start.ci_lo", "start.ci_hi"), S.ci(TEST, "chosen.ci_lo", "chosen.ci_hi")])
    L += _table(["", "start", "chosen"], rows)
    L += [f"Paired difference (chosen − start, same tasks, tasks resampled): "
          f"**{S(TEST, 'paired_diff.mean', '+.3f')}** {S.ci(TEST, 'paired_diff.ci_lo', 'paired_diff.ci_hi', '+.3f')}.",
          "", "Per-task successes (c of n):", ""]
    rows = []
    for task in t["tasks"]:
        rows.append([f"`{task}`", f"{S(TEST, f'start.per_task.{task}.c', 'd')} of {S(TEST, f'start.per_task.{task}.n', 'd')}",
                     f"{S(TEST, f'chosen.per_task.{task}.c', 'd')} of {S(TEST, f'chosen.per_task.{task}.n', 'd')}"])
    L += _table(["task", "start", "chosen"], rows)


def sec_ablation(L, S, docs, links):
    abl = docs[ABLATION]
    arms = _arm_order(docs)
    ref = abl["power"]["reference_arm"]
    L += ["## Ablation", "",
          f"Each arm trained for {S(ABLATION, 'steps', 'd')} steps with seeds "
          f"{S(ABLATION, 'seeds', 'list')}, then evaluated on the held-out tasks "
          f"({S(ABLATION, 'eval_per_task', 'd')} episodes each; the evaluation stream depends on the seed only). "
          f"Held-out: mean over seeds with a {S(CAPSTONE, 'ci_level.ablate', '.0%')} task-bootstrap interval of the "
          f"seed-averaged per-task rates; difference vs {ref}: paired over tasks. Late reward / entropy / hardcode: "
          f"mean over the final training steps, averaged over seeds.", ""]
    rows = []
    for a in arms:
        per_seed = ", ".join(S(ABLATION, f"arms.{a}.per_seed.{s}") for s in abl["arms"][a]["per_seed"])
        diff = (f"{S(ABLATION, f'arms.{a}.diff_vs_default.mean', '+.3f')} "
                f"{S.ci(ABLATION, f'arms.{a}.diff_vs_default.ci_lo', f'arms.{a}.diff_vs_default.ci_hi', '+.3f')}"
                if "diff_vs_default" in abl["arms"][a] else "(reference)")
        rows.append([f"`{a}`", f"{S(ABLATION, f'arms.{a}.heldout_pass')} "
                               f"{S.ci(ABLATION, f'arms.{a}.ci_lo', f'arms.{a}.ci_hi')}",
                     S(ABLATION, f"arms.{a}.seed_sd"), per_seed, S(ABLATION, f"arms.{a}.late_reward"),
                     S(ABLATION, f"arms.{a}.late_entropy"), S(ABLATION, f"arms.{a}.late_hardcode"), diff])
    L += _table(["arm", "held-out [CI]", "seed SD", f"per seed ({S(ABLATION, 'seeds', 'list')})",
                 "late train reward", "late entropy", "late hardcode", f"diff vs {ref} [CI]"], rows)
    ident = abl.get("default_matches_main_run", {})
    if ident.get("checked"):
        L += [f"The `default` arm with seed {S(ABLATION, 'default_matches_main_run.seed', 'd')} equals the main run "
              f"at step {S(ABLATION, 'default_matches_main_run.step', 'd')} parameter for parameter: "
              f"{S(ABLATION, 'default_matches_main_run.equal', 'yesno')} (checkpoint evaluation did not perturb "
              f"training).", ""]
    L += [f"![Ablation forest plot]({links['ablation_forest']})", ""]


def sec_learned(L, S, docs, links):
    ln = docs[CAPSTONE]["learned"]
    L += ["## What the agent learned", "",
          f"The chosen checkpoint (step {S(SELECTION, 'chosen.step', 'd')}) and the starting policy, re-evaluated on "
          f"every held-out task ({S(CAPSTONE, 'learned.episodes_per_task', 'd')} episodes per task, "
          f"{S(CAPSTONE, 'learned.chosen.episodes', 'd')} per policy, generator seed "
          f"`{S(CAPSTONE, 'learned.generator', 'str')}`, the same for both).", "",
          "Behaviour per episode:", ""]
    labels = {"pass_rate": "hidden-test pass", "submitted": "submitted", "reads": "reads", "read_first": "read first",
              "tests": "tests", "edits": "edits", "turns": "turns", "malformed": "malformed calls",
              "hardcode": "hardcode_tests used", "policy_tokens": "policy tokens",
              "length_pass": "policy tokens, passed episodes", "length_fail": "policy tokens, failed episodes"}
    rows = []
    for k in BEHAVIOUR_KEYS:
        fmt = ".1f" if k in ("policy_tokens", "length_pass", "length_fail") else ".3f"
        rows.append([labels[k], S(CAPSTONE, f"learned.start.behavior.{k}", fmt),
                     S(CAPSTONE, f"learned.chosen.behavior.{k}", fmt)])
    L += _table(["", "start", "chosen"], rows)
    for who in ("chosen", "start"):
        L += [f"The {S(CAPSTONE, 'learned.top_k', 'd')} most frequent tool sequences, {who} "
              f"({S(CAPSTONE, f'learned.{who}.distinct_sequences', 'd')} distinct sequences in all):", ""]
        rows = []
        for i, _ in enumerate(ln[who]["top_sequences"]):
            rows.append([f"`{S(CAPSTONE, f'learned.{who}.top_sequences.{i}.sequence', 'str')}`",
                         S(CAPSTONE, f"learned.{who}.top_sequences.{i}.count", "d"),
                         S(CAPSTONE, f"learned.{who}.top_sequences.{i}.share", ".3f")])
        L += _table(["tool sequence", "episodes", "share"], rows)
    L += ["First edit op per held-out task, chosen checkpoint (bold: the task's oracle op; `none`: no edit):", ""]
    rows = []
    for task in ln["tasks"]:
        cells = []
        for op in ln["ops"]:
            text = S(CAPSTONE, f"learned.chosen.first_ops.{task}.{op}", "d")
            cells.append(f"**{text}**" if op == ln["oracle"][task] else text)
        rows.append([f"`{task}`", f"`{S(CAPSTONE, f'learned.oracle.{task}', 'str')}`"] + cells +
                    [f"{S(CAPSTONE, f'learned.chosen.per_task.{task}.c', 'd')} of "
                     f"{S(CAPSTONE, f'learned.chosen.per_task.{task}.n', 'd')}"])
    L += _table(["task", "oracle"] + [f"`{op}`" for op in ln["ops"]] + ["passed"], rows)
    L += [f"![First edit op per held-out task]({links['op_choices']})", "",
          f"Failed episodes of the chosen checkpoint, up to "
          f"{S(CAPSTONE, 'config.report.transcripts_per_family', 'd')} per bug family, decoded token by token "
          f"(prompt, then each call and the observation it got):", ""]
    fams = ln["chosen"]["families"]
    pinned = docs[CAPSTONE]["config"]["tasks"]["families"]
    for fam in [f for f in pinned if f in fams] + sorted(f for f in fams if f not in pinned):
        v = fams[fam]
        if v["failures"] == 0:
            L += [f"- `{fam}`: no failure in {S(CAPSTONE, f'learned.chosen.families.{fam}.episodes', 'd')} episodes.", ""]
            continue
        if not v["transcripts"]:
            L += [f"- `{fam}` (failed {S(CAPSTONE, f'learned.chosen.families.{fam}.failures', 'd')} of "
                  f"{S(CAPSTONE, f'learned.chosen.families.{fam}.episodes', 'd')} episodes): no transcript shown "
                  f"(report.transcripts_per_family = {S(CAPSTONE, 'config.report.transcripts_per_family', 'd')}).", ""]
        for j, tr in enumerate(v["transcripts"]):
            p = f"learned.chosen.families.{fam}.transcripts.{j}"
            L += [f"- `{fam}` (failed {S(CAPSTONE, f'learned.chosen.families.{fam}.failures', 'd')} of "
                  f"{S(CAPSTONE, f'learned.chosen.families.{fam}.episodes', 'd')} episodes). Task "
                  f"`{S(CAPSTONE, f'{p}.task', 'str')}`, edit ops {S(CAPSTONE, f'{p}.ops', 'list')}, submitted "
                  f"{S(CAPSTONE, f'{p}.submitted', 'yesno')}, public tests pass "
                  f"{S(CAPSTONE, f'{p}.public_pass', 'yesno')}, hidden tests pass "
                  f"{S(CAPSTONE, f'{p}.hidden_pass', 'yesno')}, reward {S(CAPSTONE, f'{p}.reward', 'g')}:", "",
                  "```text"] + tr["lines"] + ["```", ""]
    if not ln["chosen"]["families"]:
        L += ["(No families configured.)", ""]


def sec_power(L, S, docs):
    abl = docs[ABLATION]
    L += ["## Power", "",
          f"Seeds per arm needed to detect a held-out difference with power "
          f"{S(CAPSTONE, 'power_assumptions.power', '.0%')} (two-sided two-sample t-test at level "
          f"{S(CAPSTONE, 'power_assumptions.alpha', 'g')}) given the measured seed SD of the "
          f"`{S(ABLATION, 'power.reference_arm', 'str')}` arm ({S(ABLATION, 'power.seed_sd')}); tasks needed (paired "
          f"one-sample t-test on per-task differences, same power and level) given the per-task SD of its "
          f"seed-averaged rates ({S(ABLATION, 'power.task_sd')}).", ""]
    rows = [[S(ABLATION, f"power.rows.{i}.effect", ".2f"), S(ABLATION, f"power.rows.{i}.seeds_per_arm", "d"),
             S(ABLATION, f"power.rows.{i}.tasks", "d")] for i in range(len(abl["power"]["rows"]))]
    L += _table(["effect", "seeds per arm", "tasks"], rows)


def sec_stopping(L, S, docs, links):
    st = docs[CAPSTONE]["stopping"]
    pk = st["peak_index"]
    L += ["## Stopping signals", "",
          "A group whose episodes all pass (or all fail) has zero advantage and gives no gradient. Validation pass "
          "rate at each checkpoint against the zero-advantage share of the batch sampled at that step:", "",
          f"![Stopping signals]({links['stopping_signals']})", ""]
    rows = []
    for i, _ in enumerate(st["rows"]):
        p = f"stopping.rows.{i}"
        rows.append([S(CAPSTONE, f"{p}.step", "d"), S(CAPSTONE, f"{p}.pass_rate"), S(CAPSTONE, f"{p}.zero_adv_frac"),
                     S(CAPSTONE, f"{p}.all_pass_frac"), S(CAPSTONE, f"{p}.all_fail_frac")])
    L += _table(["step", "validation pass", "zero-advantage share", "all-pass share", "all-fail share"], rows)
    peak_zero = st["peak"]["zero_adv_frac"]
    where = (f"the batch sampled at that step had zero-advantage share "
             f"{S(CAPSTONE, f'stopping.rows.{pk}.zero_adv_frac')} (all-pass "
             f"{S(CAPSTONE, f'stopping.rows.{pk}.all_pass_frac')}, all-fail "
             f"{S(CAPSTONE, f'stopping.rows.{pk}.all_fail_frac')})") if peak_zero is not None else \
        "the run has no dashboard row for that step (it is the final checkpoint)"
    first_full = (f" Every group of a batch first had zero advantage at step "
                  f"{S(CAPSTONE, 'stopping.first_step_all_groups_zero_adv', 'd')}."
                  if st["first_step_all_groups_zero_adv"] is not None else "")
    L += [f"Validation peaked at step {S(CAPSTONE, f'stopping.rows.{pk}.step', 'd')} "
          f"({S(CAPSTONE, f'stopping.rows.{pk}.pass_rate')}); {where}. Over the last "
          f"{S(CAPSTONE, 'stopping.window', 'd')} steps the zero-advantage share averaged "
          f"{S(CAPSTONE, 'stopping.last.zero_adv_frac')} (all-pass {S(CAPSTONE, 'stopping.last.all_pass_frac')}, "
          f"all-fail {S(CAPSTONE, 'stopping.last.all_fail_frac')})"
          + (": most groups pass in full, so training signal runs out as the policy saturates."
             if st["late_mostly_all_pass"] else ".") + first_full, ""]


def sec_threads(L, S, docs, links):
    th, te = docs[THREADS], docs[CAPSTONE]["threads"]
    first = (f"the sampled batches first differ at step {S(THREADS, 'first_divergent_step', 'd')}"
             if th.get("first_divergent_step") is not None else
             f"the sampled batches never differ (identical: {S(THREADS, 'identical_batches', 'yesno')})")
    L += ["## Thread-count experiment", "",
          f"The first {S(THREADS, 'steps', 'd')} steps of the main run repeated at "
          f"{S(THREADS, 'compare_threads', 'd')} thread(s) against the main run's {S(THREADS, 'main_threads', 'd')}: "
          f"{first}; the largest parameter difference at step {S(THREADS, 'steps', 'd')} is "
          f"{S(THREADS, 'max_param_diff', '.3g')}.", ""]
    rows = [[f"{S(THREADS, 'main_threads', 'd')} (main run)", S(THREADS, "heldout_main")],
            [S(THREADS, "compare_threads", "d"), S(THREADS, "heldout_compare")]]
    L += _table(["threads", "held-out pass"], rows)
    verdict = "within" if te["within_seed_sd"] else "outside"
    L += [f"Held-out difference {S(CAPSTONE, 'threads.heldout_diff', '+.3f')}, against a seed SD of "
          f"{S(CAPSTONE, 'threads.seed_sd')} in the `{S(CAPSTONE, 'threads.reference_arm', 'str')}` ablation arm "
          f"(the same steps and starting policy): {S(CAPSTONE, 'threads.diff_in_seed_sds', '.2f')} seed SDs, "
          f"{verdict} one seed SD (within one seed SD: {S(CAPSTONE, 'threads.within_seed_sd', 'yesno')}; within the "
          f"seed range {S(CAPSTONE, 'threads.seed_range')}: {S(CAPSTONE, 'threads.within_seed_range', 'yesno')}). "
          f"Bit-identical across thread counts: {S(CAPSTONE, 'threads.bit_identical', 'yesno')}. The thread count "
          f"is therefore pinned as a param (`run.threads`): changing it reruns every stage that does tensor work.",
          "",
          f"![Thread-count experiment]({links['threads']})", ""]


def _signature_rows(faults: dict) -> list[tuple[str, str, str, dict]]:
    """(failure, twin, path prefix, check) for every signature check in faults.json, in the catalogue's order,
    whichever of the keys 'signatures' / 'checks' holds catalogue.signature_checks' result."""
    try:
        from agentrl.catalogue import FAILURE_NAMES
    except ImportError:  # pragma: no cover - the catalogue module is optional for the report
        FAILURE_NAMES = ()
    for key in ("signatures", "checks"):
        block = faults.get(key)
        if isinstance(block, dict) and block and all(isinstance(v, dict) and "checks" in v for v in block.values()):
            names = [n for n in FAILURE_NAMES if n in block] + sorted(n for n in block if n not in FAILURE_NAMES)
            return [(name, block[name].get("twin"), f"{key}.{name}", c) for name in names
                    for c in block[name]["checks"]]
    return []


def faults_summary(faults: dict | None) -> dict | None:
    """How many failures the catalogue holds and how many of their signatures reproduced."""
    if not faults or not isinstance(faults.get("signatures"), dict):
        return None
    sig = faults["signatures"]
    return {"failures": len(sig), "all_checks_hold": sum(bool(v.get("holds")) for v in sig.values()),
            "required_hold": sum(v.get("required_holds") is not False for v in sig.values())}


def sec_faults(L, S, docs):
    faults = docs.get(FAULTS)
    L += ["## Fault catalogue", ""]
    if faults is None:
        L += [f"`{FAULTS}` is not available yet (the faults stage has not run).", ""]
        return
    L += ["Every failure of the debugging chapter, trained from the same base and seed as a healthy twin, with the "
          "dashboard metric that exposes it; per-failure figures and explanations in [faults.md](faults.md). "
          "Required checks are the signatures the catalogue must show; reference checks compare with the textbook "
          "run and are reported, not asserted.", ""]
    if docs[CAPSTONE].get("faults") is not None:
        L += [f"Failures whose required signature reproduced: {S(CAPSTONE, 'faults.required_hold', 'd')} of "
              f"{S(CAPSTONE, 'faults.failures', 'd')}; with every check (reference ones too): "
              f"{S(CAPSTONE, 'faults.all_checks_hold', 'd')}.", ""]
    rows, seen = [], {}
    failures = faults.get("failures", {})
    for name, twin, prefix, c in _signature_rows(faults):
        i = seen[name] = seen.get(name, -1) + 1
        p = f"{prefix}.checks.{i}"

        def val(field, c=c, p=p):
            v = c.get(field)
            if v is None:
                return "n/a"
            if isinstance(v, bool):
                return S(FAULTS, f"{p}.{field}", "yesno")
            if isinstance(v, (int, float)):
                return S(FAULTS, f"{p}.{field}", ".3g")
            return S(FAULTS, f"{p}.{field}", "str") if isinstance(v, str) else "see faults.md"
        first = i == 0
        label = f"`{name}`" + (f" (twin `{S(FAULTS, f'{prefix}.twin', 'str')}`)" if twin else "") if first else ""
        held = ""
        if first and isinstance(failures.get(name, {}).get("heldout_end"), dict):
            q = f"failures.{name}.heldout_end"
            held = f"{S(FAULTS, f'{q}.faulty', '.3f')} vs {S(FAULTS, f'{q}.twin', '.3f')}"
        rows.append([label, f"{S(FAULTS, f'{p}.metric', 'str')} ({S(FAULTS, f'{p}.statistic', 'str')})",
                     S(FAULTS, f"{p}.kind", "str") if "kind" in c else "", val("faulty"), val("healthy"),
                     S(FAULTS, f"{p}.criterion", "str"), S(FAULTS, f"{p}.holds", "yesno"), held])
    if rows:
        L += _table(["failure", "exposing metric (statistic)", "check", "faulty", "twin", "criterion", "holds",
                     "held-out at end, faulty vs twin"], rows)
    else:
        L += ["(faults.json holds no signature table.)", ""]


def sec_provenance(L, S, docs):
    L += ["## Provenance", "",
          "Where each headline number comes from: the stage output and path, and the MLflow run and fingerprint of "
          "the stage run that wrote it.", ""]
    heads = [("test pass@1, chosen", TEST, "chosen.pass_at_1", ".3f"),
             ("test pass@1, start", TEST, "start.pass_at_1", ".3f"),
             ("paired difference", TEST, "paired_diff.mean", "+.3f"),
             ("validation pass, chosen checkpoint", SELECTION, "chosen.pass_rate", ".3f"),
             ("chosen step", SELECTION, "chosen.step", "d"),
             ("ablation default held-out", ABLATION, "arms.default.heldout_pass", ".3f"),
             ("ablation seed SD", ABLATION, "power.seed_sd", ".3f"),
             ("base pass@1 (train tasks)", START, "base.pass_at_1", ".3f"),
             ("clean sampler-trainer gap", PREFLIGHT, "clean.sampler_trainer_gap.value", ".3g"),
             ("thread experiment max parameter difference", THREADS, "max_param_diff", ".3g"),
             ("learned: chosen hidden-test pass", CAPSTONE, "learned.chosen.behavior.pass_rate", ".3f"),
             ("thread effect in seed SDs", CAPSTONE, "threads.diff_in_seed_sds", ".2f")]
    for a in _arm_order(docs):
        if "diff_vs_default" in docs[ABLATION]["arms"][a]:
            heads.append((f"ablation {a} − default", ABLATION, f"arms.{a}.diff_vs_default.mean", "+.3f"))
    rows = []
    for label, file, path, fmt in heads:
        if not S.has(file, path):
            continue
        rows.append([label, S(file, path, fmt), f"`{file}:{path}`", S(file, "provenance.stage", "str"),
                     f"`{S(file, 'provenance.mlflow_run_id', 'str')}`", f"`{S(file, 'provenance.fingerprint', 'str')}`"])
    L += _table(["number", "value", "source", "stage", "MLflow run", "fingerprint"], rows)
    L += ["To audit any number: `python -m agentrl audit reports/test.json:chosen.pass_at_1` prints the value, the "
          "stage, its MLflow run, the params, thread count, code version and input hashes that produced it, and "
          "whether the workspace would still produce it. Every number in this report is listed with its source in "
          "`reports/capstone_sources.json`; numbers the report computed itself (the re-evaluation above, the "
          "stopping and thread comparisons) live in `reports/capstone.json` under this stage's provenance.", ""]


# ---------------------------------------------------------------------------------------------------------------
# the stage

def build(params: dict, provenance: dict, root: Path | str = ".", require_faults: bool = True) -> dict:
    """Compute, write reports/capstone.json (with `provenance`), draw the figures, render reports/capstone.md and
    write reports/capstone_sources.json. Returns a summary for logging."""
    from agentrl.pipeline import read_json, write_json
    root = Path(root)
    docs = load_docs(root, require_faults)
    computed = compute(params, docs, root)
    write_json(root / CAPSTONE, {"provenance": provenance, **computed})
    docs[CAPSTONE] = read_json(root / CAPSTONE)   # cite the numbers exactly as written
    links = make_figures(docs, root)
    markdown, entries = render(docs, links)
    (root / MARKDOWN).write_text(markdown)
    write_json(root / SOURCES, {"provenance": provenance, "markdown": MARKDOWN, "count": len(entries),
                                "entries": entries})
    ln = computed["learned"]
    return {"numbers": len(entries), "figures": sorted(links.values()),
            "metrics": {"learned.chosen.pass_rate": ln["chosen"]["behavior"]["pass_rate"],
                        "learned.start.pass_rate": ln["start"]["behavior"]["pass_rate"],
                        "threads.diff_in_seed_sds": computed["threads"]["diff_in_seed_sds"] or 0.0,
                        "numbers_sourced": float(len(entries))}}
