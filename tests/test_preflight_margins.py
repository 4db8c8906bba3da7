"""The thresholds against the measured margins: 20 batches of the clean trainer and every registry fault
(reports/studies/preflight_margins.json, from `python -m agentrl.faults.margins --seeds 20 --json ...`), summarised
against the thresholds in the code, must keep every healthy value passing and every faulty one failing, with a
factor of at least 10 between them; docs/preflight.md must show exactly that table."""
import json
import math

from conftest import REPO

from agentrl.faults.margins import markdown, summarize
from agentrl.rl.invariants import CHECKS, THRESHOLDS

MEASURED = REPO / "reports" / "studies" / "preflight_margins.json"


def _summary():
    return summarize(json.loads(MEASURED.read_text())["measured"])


def test_thresholds_separate_healthy_from_faulty_on_every_measured_batch():
    summary = _summary()
    assert summary["matrix_seeds"] >= 20 and summary["matrix_held"] == summary["matrix_seeds"]
    assert list(summary["checks"]) == list(CHECKS)
    for check, s in summary["checks"].items():
        assert s["threshold"] == THRESHOLDS[check][1], check
        assert s["healthy_passes"] and s["faulty_fail"], check
        if s["factor"] is not None:
            assert s["factor"] >= 10, (check, s["factor"])
        for side in ("healthy_clearance", "faulty_clearance"):
            if s[side] is not None and not math.isinf(s[side]):
                assert s[side] >= 10, (check, side, s[side])


def test_a_threshold_inside_the_healthy_range_is_flagged(monkeypatch):
    """Teeth: move the accumulation threshold below the worst healthy value and the summary says so."""
    from agentrl.faults import margins
    worst = _summary()["checks"]["accumulation"]["healthy_worst"]
    monkeypatch.setitem(margins.THRESHOLDS, "accumulation", ("<", worst / 2))
    s = summarize(json.loads(MEASURED.read_text())["measured"])
    assert not s["checks"]["accumulation"]["healthy_passes"]


def test_the_docs_show_the_table_the_committed_values_render():
    doc = (REPO / "docs" / "preflight.md").read_text()
    table = doc.split("<!-- margins-table:start -->\n", 1)[1].split("\n<!-- margins-table:end -->", 1)[0]
    assert table.strip() == markdown(_summary()).strip()
