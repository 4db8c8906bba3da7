"""The report stage's work: compute (no model), draw, render, write.

    reports/capstone.json           the numbers the report computes itself (cited like any stage output)
    reports/figures/capstone/*.png  the figures
    reports/capstone.md             the report, every number read through Sources
    reports/capstone_sources.json   every number in the markdown with the `<file>.json:<path>` it was read from
"""
from __future__ import annotations

from pathlib import Path

from agentrl.report.compute import (
    ABLATION,
    BEHAVIOUR,
    CAPSTONE,
    DASHBOARD,
    FIG_DIR,
    FIG_LINK,
    MARKDOWN,
    PREFLIGHT,
    SELECTION,
    SOURCES,
    THREADS,
    TRAIN,
    compute,
    load_docs,
)
from agentrl.report.sections_run import (
    arm_order,
    sec_checkpoints,
    sec_config,
    sec_dashboard,
    sec_preflight,
    sec_start,
    sec_summary,
    sec_test,
)
from agentrl.report.sections_study import (
    sec_ablation,
    sec_faults,
    sec_learned,
    sec_power,
    sec_provenance,
    sec_stopping,
    sec_threads,
)
from agentrl.report.sources import Sources

HEADINGS = ("Summary", "Pinned configuration", "Preflight", "Starting policy", "Training dashboard", "Checkpoints",
            "Test", "Ablation", "What the agent learned", "Power", "Stopping signals", "Thread-count experiment",
            "Fault catalogue", "Provenance")


def make_figures(docs: dict, root: Path) -> dict[str, str]:
    """Write the report's PNGs; returns {name: link relative to reports/capstone.md}."""
    from agentrl.report import figures
    fig_dir = root / FIG_DIR
    cap, train, rows = docs[CAPSTONE], docs[TRAIN], docs[DASHBOARD]
    checkpoints = [(c["step"], c["pass_rate"]) for c in train["checkpoints"]]
    links = {}

    def out(name):
        links[name] = f"{FIG_LINK}/{name}.png"
        return fig_dir / f"{name}.png"

    figures.training_dashboard(out("dashboard"), rows, checkpoints,
                               docs[PREFLIGHT]["thresholds"]["sampler_trainer_gap"]["value"],
                               docs[SELECTION]["chosen"]["step"])
    abl = docs[ABLATION]
    arms = arm_order(docs)
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
    ln = docs[BEHAVIOUR]
    figures.op_choices(out("op_choices"), ln["tasks"], ln["ops"],
                       [[ln["chosen"]["first_ops"][t][op] for op in ln["ops"]] for t in ln["tasks"]],
                       [ln["oracle"][t] for t in ln["tasks"]])
    return links


def render(docs: dict, links: dict) -> tuple[str, list[dict]]:
    S = Sources(docs)
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
    return "\n".join(L).rstrip() + "\n", S.entries


def build(params: dict, root: Path | str = ".") -> dict:
    """Compute, write reports/capstone.json, draw the figures, render reports/capstone.md and write
    reports/capstone_sources.json. Returns a summary for logging."""
    from agentrl.core.artifacts import read_json, write_json, write_text
    root = Path(root)
    docs = load_docs(root)
    write_json(root / CAPSTONE, compute(params, docs))
    docs[CAPSTONE] = read_json(root / CAPSTONE)   # cite the numbers exactly as written
    links = make_figures(docs, root)
    markdown, entries = render(docs, links)
    write_text(root / MARKDOWN, markdown)
    write_json(root / SOURCES, {"markdown": MARKDOWN, "count": len(entries), "entries": entries})
    return {"numbers": len(entries), "figures": sorted(links.values()),
            "metrics": {"numbers_sourced": float(len(entries)),
                        "threads.diff_in_seed_sds": docs[CAPSTONE]["threads"]["diff_in_seed_sds"] or 0.0}}
