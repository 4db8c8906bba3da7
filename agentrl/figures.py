"""Figures (PNG, matplotlib Agg). Each function takes plain data and a path; nothing here computes numbers."""
from __future__ import annotations

from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402


def _save(fig, path) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110, bbox_inches="tight", metadata={"Software": None})
    plt.close(fig)


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
