"""Figures (PNG, matplotlib Agg). Each function takes plain data and a path; nothing here computes numbers."""
from __future__ import annotations

import io
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt


def _save(fig, path) -> None:
    """Rendered in memory, then written atomically (an interrupted stage leaves the old figure, not half a PNG)."""
    from agentrl.core.artifacts import write_bytes
    path = Path(path)
    buffer = io.BytesIO()
    fig.savefig(buffer, format=path.suffix.lstrip(".") or "png", dpi=110, bbox_inches="tight",
                metadata={"Software": None})
    plt.close(fig)
    write_bytes(path, buffer.getvalue())


def check_matrix(path, rows: list[str], checks: list[str], passed: list[list[bool]], expected_fail: list[set]) -> None:
    """Rows x checks grid: green pass, red fail; a black frame marks a cell expected to fail."""
    fig, ax = plt.subplots(figsize=(1.0 + 0.8 * len(checks), 0.9 + 0.45 * len(rows)))
    for i, row in enumerate(passed):
        for j, ok in enumerate(row):
            ax.add_patch(plt.Rectangle((j, i), 1, 1, color="#4caf50" if ok else "#e53935", alpha=0.85))
            if j + 1 in expected_fail[i]:
                ax.add_patch(plt.Rectangle((j + 0.06, i + 0.06), 0.88, 0.88, fill=False, lw=2, color="black"))
            ax.text(j + 0.5, i + 0.5, "pass" if ok else "FAIL", ha="center", va="center", fontsize=7, color="white")
    ax.set_xlim(0, len(checks))
    ax.set_ylim(len(rows), 0)
    ax.set_xticks([j + 0.5 for j in range(len(checks))])
    ax.set_xticklabels([f"{j + 1}. {c}" for j, c in enumerate(checks)], rotation=40, ha="right", fontsize=7)
    ax.set_yticks([i + 0.5 for i in range(len(rows))])
    ax.set_yticklabels(rows, fontsize=8)
    ax.set_title("Preflight invariants per injected fault (framed = expected to fail)", fontsize=9)
    _save(fig, path)


# ---------------------------------------------------------------- capstone report figures

def _series(rows: list[dict], key: str, positive: bool = False) -> list:
    """rows[i][key] as floats (None/NaN kept as NaN; with positive=True non-positive values become NaN for log axes)."""
    out = []
    for r in rows:
        v = r.get(key)
        v = float("nan") if v is None else float(v)
        out.append(float("nan") if positive and not v > 0 else v)
    return out


def _log_limits(values: list[float]) -> tuple[float, float]:
    """A log axis's limits, a decade beyond the positive values' range, in Python floats. Left to matplotlib, a range
    with nothing but a threshold (the fixed kernels' gap is 0 at every step) got other limits on a 2-core AMD EPYC
    without AVX-512 than on the Xeons that drew the committed image, from the same numbers: the image's bytes
    followed the CPU class."""
    positive = [v for v in values if v > 0 and v != float("inf")]
    return min(positive) / 10, max(positive) * 10


def training_dashboard(path, rows: list[dict], checkpoints: list[tuple], logp_threshold: float,
                       chosen_step: int | None = None) -> None:
    """Six panels of the main run's dashboard: outcome (batch reward, pass rate, validation at checkpoints),
    behaviour, entropy, zero-advantage share (all-pass and all-fail shares), approx_kl (log) and logp_gap against
    its threshold (log). `rows` are dashboard rows (key 'step'); `checkpoints` (updates done, validation pass)."""
    steps = [r["step"] for r in rows]
    fig, axes = plt.subplots(2, 3, figsize=(15, 7.6))
    ax = axes[0, 0]
    ax.plot(steps, _series(rows, "reward"), label="batch reward", color="#1f77b4")
    ax.plot(steps, _series(rows, "pass_rate"), label="batch hidden pass", color="#9ecae1", ls="--")
    if checkpoints:
        ax.plot([c[0] for c in checkpoints], [c[1] for c in checkpoints], "o-", color="#d62728",
                label="validation (checkpoints)")
    if chosen_step is not None:
        ax.axvline(chosen_step, color="grey", ls=":", lw=1, label="chosen checkpoint")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("outcome")
    ax.legend(fontsize=7, loc="lower right")
    ax = axes[0, 1]
    for key, color in (("reads", "#2ca02c"), ("tests", "#17becf"), ("turns", "#7f7f7f"), ("malformed", "#d62728"),
                       ("hardcode", "#ff7f0e")):
        ax.plot(steps, _series(rows, key), label=key, color=color)
    ax.set_title("behaviour (per episode)")
    ax.legend(fontsize=7)
    ax = axes[0, 2]
    ax.plot(steps, _series(rows, "entropy"), color="#9467bd")
    ax.set_title("action-token entropy (nats)")
    ax.set_ylim(bottom=0)
    ax = axes[1, 0]
    ax.plot(steps, _series(rows, "zero_adv_frac"), label="zero-advantage groups", color="black")
    ax.plot(steps, _series(rows, "all_pass_frac"), label="all pass", color="#2ca02c", ls="--")
    ax.plot(steps, _series(rows, "all_fail_frac"), label="all fail", color="#d62728", ls="--")
    ax.set_ylim(-0.03, 1.03)
    ax.set_title("share of groups without a gradient")
    ax.legend(fontsize=7)
    ax = axes[1, 1]
    ax.semilogy(steps, _series(rows, "approx_kl", True), label="approx_kl (mean)", color="#8c564b")
    ax.semilogy(steps, _series(rows, "approx_kl_max", True), label="approx_kl (per-step max)", color="#e377c2",
                ls="--")
    ax.set_title("approx_kl (log scale)")
    ax.legend(fontsize=7)
    ax = axes[1, 2]
    gap, gap_max = _series(rows, "logp_gap", True), _series(rows, "logp_gap_max", True)
    ax.semilogy(steps, gap, label="logp_gap (mean)", color="#1f77b4")
    ax.semilogy(steps, gap_max, label="logp_gap (per-step max)", color="#aec7e8", ls="--")
    ax.axhline(logp_threshold, color="#d62728", ls=":", label=f"threshold {logp_threshold:g}")
    ax.set_ylim(*_log_limits(gap + gap_max + [logp_threshold]))
    if steps:   # an empty panel's x axis would otherwise be matplotlib's default (-0.05, 0.05)
        ax.set_xlim(min(steps), max(steps))
    ax.set_title("sampler-trainer log-prob gap (log scale)")
    ax.legend(fontsize=7, loc="lower right")
    for a in axes.flat:
        a.set_xlabel("step (updates done)")
        a.grid(alpha=0.3)
    fig.suptitle("Main run dashboard", fontsize=11)
    fig.tight_layout()
    _save(fig, path)


def ablation_forest(path, arms: list[str], diffs: dict, heldout: dict, per_seed: dict, reference: str,
                    ci_label: str = "95% CI") -> None:
    """Left: each arm's paired held-out difference from the reference arm with its task-bootstrap interval.
    Right: each arm's held-out pass rate (mean with interval) and one dot per seed.
    diffs/heldout: arm -> (mean, lo, hi) (diffs lacks the reference arm); per_seed: arm -> [values]."""
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(11, 0.9 + 0.6 * len(arms)), sharey=True)
    ys = {arm: i for i, arm in enumerate(arms)}
    for arm in arms:
        y = ys[arm]
        if arm in diffs:
            m, lo, hi = diffs[arm]
            a1.errorbar([m], [y], xerr=[[m - lo], [hi - m]], fmt="o", color="#1f77b4", capsize=4)
        else:
            a1.plot([0], [y], "s", color="grey")
        m, lo, hi = heldout[arm]
        a2.errorbar([m], [y], xerr=[[m - lo], [hi - m]], fmt="D", color="black", capsize=4, label=None)
        vals = per_seed.get(arm, [])
        a2.plot(vals, [y + 0.15] * len(vals), "o", color="#ff7f0e", alpha=0.8, ms=5)
    a1.axvline(0, color="grey", ls=":")
    a1.set_title(f"held-out difference vs {reference} (paired, {ci_label})", fontsize=9)
    a1.set_xlabel("difference in held-out pass rate")
    a2.set_title(f"held-out pass rate (mean, {ci_label}; dots: seeds)", fontsize=9)
    a2.set_xlabel("held-out hidden-test pass rate")
    a2.set_xlim(-0.03, 1.03)
    a1.set_yticks(list(ys.values()))
    a1.set_yticklabels(list(ys))
    a1.set_ylim(len(arms) - 0.5, -0.5)
    for a in (a1, a2):
        a.grid(alpha=0.3, axis="x")
    fig.tight_layout()
    _save(fig, path)


def stopping_signals(path, rows: list[dict], checkpoints: list[tuple], peak_step: int | None = None) -> None:
    """Zero-advantage share (with all-pass / all-fail shares) per step against the validation pass rate at the
    checkpoints (second axis); a vertical line at the validation peak."""
    steps = [r["step"] for r in rows]
    fig, ax = plt.subplots(figsize=(8, 4))
    ax.plot(steps, _series(rows, "zero_adv_frac"), color="black", label="zero-advantage share")
    ax.plot(steps, _series(rows, "all_pass_frac"), color="#2ca02c", ls="--", label="all-pass share")
    ax.plot(steps, _series(rows, "all_fail_frac"), color="#d62728", ls="--", label="all-fail share")
    ax.set_ylim(-0.03, 1.03)
    ax.set_xlabel("step (updates done)")
    ax.set_ylabel("share of groups")
    ax2 = ax.twinx()
    ax2.plot([c[0] for c in checkpoints], [c[1] for c in checkpoints], "o-", color="#1f77b4", label="validation pass")
    ax2.set_ylim(-0.03, 1.03)
    ax2.set_ylabel("validation pass rate", color="#1f77b4")
    if peak_step is not None:
        ax.axvline(peak_step, color="grey", ls=":", label="validation peak")
    h1, l1 = ax.get_legend_handles_labels()
    h2, l2 = ax2.get_legend_handles_labels()
    ax.legend(h1 + h2, l1 + l2, fontsize=7, loc="center right")
    ax.grid(alpha=0.3)
    ax.set_title("Stopping signals: groups without a gradient vs validation", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def thread_rewards(path, main: list, compare: list, main_label: str, compare_label: str,
                   first_divergent: int | None = None) -> None:
    """Batch reward per step of the same run at two thread counts; a vertical line at the first step whose
    sampled batches differ."""
    fig, ax = plt.subplots(figsize=(8, 3.6))
    ax.plot(range(len(main)), main, color="#1f77b4", label=main_label)
    ax.plot(range(len(compare)), compare, color="#ff7f0e", ls="--", label=compare_label)
    if first_divergent is not None:
        ax.axvline(first_divergent, color="grey", ls=":", label="first divergent batch")
    ax.set_xlabel("step")
    ax.set_ylabel("batch reward")
    ax.set_ylim(-0.03, 1.03)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8)
    ax.set_title("Thread-count experiment: batch reward", fontsize=10)
    fig.tight_layout()
    _save(fig, path)


def op_choices(path, tasks: list[str], ops: list[str], counts: list[list[int]], oracle: list[str]) -> None:
    """Heatmap of first-edit op counts per task (rows) and op (columns); the oracle op's cell is framed."""
    import numpy as np
    data = np.array(counts, dtype=float)
    fig, ax = plt.subplots(figsize=(1.6 + 1.0 * len(ops), 0.8 + 0.42 * len(tasks)))
    ax.imshow(data, cmap="Blues", aspect="auto", vmin=0, vmax=max(float(data.max()), 1.0))
    for i in range(len(tasks)):
        for j in range(len(ops)):
            v = int(data[i, j])
            ax.text(j, i, str(v), ha="center", va="center", fontsize=7,
                    color="white" if data[i, j] > 0.6 * data.max() else "black")
            if ops[j] == oracle[i]:
                ax.add_patch(plt.Rectangle((j - 0.5, i - 0.5), 1, 1, fill=False, lw=2, color="#d62728"))
    ax.set_xticks(range(len(ops)))
    ax.set_xticklabels(ops, rotation=30, ha="right", fontsize=7)
    ax.set_yticks(range(len(tasks)))
    ax.set_yticklabels(tasks, fontsize=7)
    ax.set_title("First edit op per held-out task (framed: oracle op)", fontsize=9)
    fig.tight_layout()
    _save(fig, path)


# ---------------------------------------------------------------- the fault catalogue

def _metric_limits(rows_a: list, rows_b: list, keys: list, log: bool = False):
    vals = [r[k] for rows in (rows_a, rows_b) for r in rows for k in keys
            if isinstance(r.get(k), (int, float)) and r[k] == r[k] and (not log or r[k] > 0)]
    if not vals:
        return None
    lo, hi = min(vals), max(vals)
    if log:
        return lo / 2, hi * 2
    pad = 0.06 * (hi - lo) if hi > lo else max(abs(hi) * 0.1, 0.05)
    return lo - pad, hi + pad


def fault_panel(path, name: str, twin: str, faulty: list, healthy: list, metrics: list, secondary: list = (),
                log_metric: bool = False, hlines: list = ()) -> None:
    """2x2 dashboard panel for one failure: top row reward per step (line) and held-out eval_pass (points, at
    the number of updates done) for the faulty run (left) and its healthy twin (right); bottom row the
    exposing metric(s) (`secondary` on a right-hand axis), with the same y-limits across the pair (log scale
    for the left axis when log_metric)."""
    fig, axes = plt.subplots(2, 2, figsize=(10, 6.4), sharex="col")
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd"]
    sec_colors = ["#ff7f0e", "#8c564b"]
    lim = _metric_limits(faulty, healthy, list(metrics), log_metric)
    sec_lim = _metric_limits(faulty, healthy, list(secondary)) if secondary else None
    for col, (rows, label) in enumerate(((faulty, name), (healthy, twin))):
        top, bot = axes[0, col], axes[1, col]
        steps = [r["step"] for r in rows]
        top.plot(steps, [r.get("reward") for r in rows], color="#333333", lw=1.6, label="train reward")
        pts = ([(0, rows[0]["eval_pass_start"])] if rows and "eval_pass_start" in rows[0] else []) + \
              [(r["step"] + 1, r["eval_pass"]) for r in rows if "eval_pass" in r]
        if pts:
            top.plot([p[0] for p in pts], [p[1] for p in pts], "o", color="#e377c2", ms=6,
                     label="held-out hidden pass")
        top.set_ylim(-0.03, 1.03)
        top.set_title(f"{label}{' (faulty)' if col == 0 else ' (healthy twin)'}", fontsize=10)
        top.grid(alpha=0.3)
        if col == 0:
            top.set_ylabel("reward / pass rate")
        top.legend(fontsize=7, loc="upper left")
        for i, k in enumerate(metrics):
            ys = [r.get(k) for r in rows]
            if log_metric:
                ys = [y if isinstance(y, (int, float)) and y > 0 else float("nan") for y in ys]
            bot.plot(steps, [float("nan") if y is None else y for y in ys], color=colors[i % len(colors)],
                     lw=1.5, marker=".", ms=4, label=k)
        for value, text in hlines:
            bot.axhline(value, color="grey", ls="--", lw=1)
            bot.annotate(text, (0.99, value), xycoords=("axes fraction", "data"), ha="right", va="bottom",
                         fontsize=7, color="grey")
        if log_metric:
            bot.set_yscale("log")
        if lim is not None:
            bot.set_ylim(*lim)
        bot.set_xlabel("step")
        bot.grid(alpha=0.3)
        if col == 0:
            bot.set_ylabel(", ".join(metrics) + (" (log)" if log_metric else ""))
        handles, labels = bot.get_legend_handles_labels()
        if secondary:
            ax2 = bot.twinx()
            for i, k in enumerate(secondary):
                ys = [r.get(k) for r in rows]
                ax2.plot(steps, [float("nan") if y is None else y for y in ys], color=sec_colors[i % 2], lw=1.3,
                         ls=":", marker="x", ms=4, label=k)
            if sec_lim is not None:
                ax2.set_ylim(*sec_lim)
            if col == 1:
                ax2.set_ylabel(", ".join(secondary))
            h2, l2 = ax2.get_legend_handles_labels()
            handles, labels = handles + h2, labels + l2
        bot.legend(handles, labels, fontsize=7, loc="best")
    fig.suptitle(f"Fault catalogue: {name} vs {twin}", fontsize=11)
    fig.tight_layout()
    _save(fig, path)
