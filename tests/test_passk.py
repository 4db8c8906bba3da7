"""pass@k at every lab evaluation (agentrl.labs.passk): the unbiased estimator per task from the report's own
per-task counts, the task bootstrap, the paired change before/after; pooled over a recipe's seeds; in the report and
in study labs. Checked on hand-computed vectors and on the committed seed-0 report of the menu recipe."""
from __future__ import annotations

import json
from math import comb

import pytest

from agentrl.labs import passk
from agentrl.labs.report import N_BOOT, interval


def _counts(*pairs):
    return {f"t{i}": {"n": n, "c": c} for i, (n, c) in enumerate(pairs)}


def test_pass_at_k_per_task_is_the_chance_that_k_draws_hold_a_pass():
    counts = _counts((4, 1), (4, 0), (4, 4))
    # task 0: 1 - C(3, k) / C(4, k); task 1 never passes; task 2 always does
    for k in (1, 2, 4):
        assert passk.per_task(counts, k) == pytest.approx([1 - comb(3, k) / comb(4, k), 0.0, 1.0])
    assert passk.ks_for(counts) == [1, 2, 4] and passk.ks_for(_counts((16, 3))) == [1, 2, 4, 8, 16]


def test_the_change_is_paired_over_tasks_and_pass_at_1_is_the_pass_rate():
    before, after = _counts((4, 1), (4, 0)), _counts((4, 2), (4, 1))
    out = passk.stats({"before": before, "after": after}, seed=0, n_boot=2000)
    assert out["1"]["before"]["mean"] == pytest.approx(0.125) and out["1"]["after"]["mean"] == pytest.approx(0.375)
    assert out["1"]["change"]["mean"] == pytest.approx(0.25)   # both tasks +0.25: every resample says +0.25
    assert (out["1"]["change"]["lo"], out["1"]["change"]["hi"]) == pytest.approx((0.25, 0.25))
    # pass@4 with 4 episodes: a task is 1 once it passed at all
    assert out["4"]["before"]["mean"] == pytest.approx(0.5) and out["4"]["after"]["mean"] == pytest.approx(1.0)


def test_pooled_pass_at_k_averages_each_task_over_the_seeds_first():
    a = {"before": {"per_task": _counts((2, 0), (2, 2))}, "after": {"per_task": _counts((2, 1), (2, 2))}}
    b = {"before": {"per_task": _counts((2, 2), (2, 2))}, "after": {"per_task": _counts((2, 2), (2, 2))}}
    out = passk.pooled([a, b], seed=0, n_boot=2000)
    # pass@2 per task: a before [0, 1], after [1, 1]; b [1, 1] both; pooled before [.5, 1], after [1, 1]
    assert out["2"]["before"]["mean"] == pytest.approx(0.75) and out["2"]["after"]["mean"] == pytest.approx(1.0)
    assert out["2"]["change"]["mean"] == pytest.approx(0.25)


def test_the_committed_menu_recipe_at_seed_0_sharpens_at_pass_at_1_and_is_saturated_at_16(repo_root):
    """The seed-0 report's own counts (10 tasks x 16 episodes): GRPO moves pass@1 up, pass@16 is 1 before and
    after: every held-out task is solved at least once in 16 tries by the cold start."""
    numbers = json.loads((repo_root / "reports/labs/smollm2/seed0.json").read_text())
    out = passk.stats({k: numbers[k]["per_task"] for k in ("before", "after")}, seed=0, n_boot=N_BOOT)
    means = {k: (round(v["before"]["mean"], 3), round(v["after"]["mean"], 3)) for k, v in out.items()}
    assert means == {"1": (0.6, 0.713), "2": (0.812, 0.854), "4": (0.944, 0.932), "8": (0.995, 0.986),
                     "16": (1.0, 1.0)}
    assert out["1"]["change"] == pytest.approx(numbers["held_out"]["gain"])   # pass@1's change: the report's gain
    lines = passk.table(out, [("before", "after the cold start"), ("after", "after GRPO")], interval)
    assert lines[0] == "| k | after the cold start | after GRPO | change (paired) |"
    assert lines[-1].startswith("| pass@16 | 1.000 [1.000, 1.000] | 1.000 [1.000, 1.000] | +0.000 [+0.000, +0.000]")


def test_the_tempered_gain_is_grpo_at_1_over_the_cold_start_at_its_best_temperature():
    from agentrl.labs.temperatures import stream_label, summary, table
    grid = {"temperatures": [0.5, 1.0], "seed": 0, "eval_per_task": 4,
            "cold_start": {"0.5": {"per_task": _counts((4, 2), (4, 2))}, "1": {"per_task": _counts((4, 1), (4, 1))}},
            "final": {"0.5": {"per_task": _counts((4, 4), (4, 3))}, "1": {"per_task": _counts((4, 3), (4, 3))}}}
    s = summary(grid, seed=0, n_boot=2000)
    assert s["best"] == "0.5" and s["tasks"] == 2
    assert s["tempered_gain"]["mean"] == pytest.approx(0.75 - 0.5)          # final at 1 - cold start at 0.5
    assert s["matched"]["1"]["mean"] == pytest.approx(0.75 - 0.25) and s["matched"]["0.5"]["mean"] == pytest.approx(
        0.875 - 0.5)
    tie = {**grid, "cold_start": {"0.5": grid["cold_start"]["1"], "1": grid["cold_start"]["1"]}}
    assert summary(tie, seed=0, n_boot=200)["best"] == "1"   # a tie goes to the higher temperature
    assert "| 0.5 (the cold start's best) |" in "\n".join(table(s, interval))
    # at temperature 1 the grid repeats the lab's own evaluation streams
    assert stream_label("cold_start", 1.0) == "before" and stream_label("final", 0.5) == "after@T0.5"
