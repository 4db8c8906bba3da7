"""Numbers don't move: every numeric field of the committed reports/*.json equals its value in the snapshot taken
when they were regenerated under portable CPU numerics (tests/fixtures/reports_numbers.json), in place or where
tests/fixtures/reports_moved.json says it went, except where a deliberate change is listed there with its reason.
`python -m agentrl compare-reports` prints the same."""
import json
from pathlib import Path

from agentrl.report.numbers import compare, numbers, snapshot

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures"


def test_the_committed_reports_carry_every_number_of_the_snapshot():
    snap = json.loads((FIXTURES / "reports_numbers.json").read_text())
    moved = json.loads((FIXTURES / "reports_moved.json").read_text())["rules"]
    res = compare(snap, REPO / "reports", moved)
    assert res["differ"] == [] and res["missing"] == [], (res["differ"][:5], res["missing"][:5])
    assert res["equal"] > 10_000


def test_compare_catches_a_changed_a_moved_and_a_missing_number(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"x": {"y": 1.5, "z": [1, 2]}, "provenance": {"run": 3}}))
    (tmp_path / "b.json").write_text(json.dumps({"w": 7}))
    snap = snapshot(tmp_path)
    assert snap == {"a.json": {"x.y": 1.5, "x.z.0": 1, "x.z.1": 2}, "b.json": {"w": 7}}
    (tmp_path / "a.json").write_text(json.dumps({"x": {"y": 1.5000001, "z": [1]}}))
    (tmp_path / "c.json").write_text(json.dumps({"moved": {"w": 7}}))
    (tmp_path / "b.json").unlink()
    res = compare(snap, tmp_path, [{"from": "b.json:", "to": "c.json:moved."}])
    assert res["differ"] == [("a.json:x.y", 1.5, 1.5000001)] and res["missing"] == ["a.json:x.z.1"]
    assert res["equal"] == 1 and res["moved_equal"] == 1
    assert numbers(tmp_path / "c.json") == {"moved.w": 7}


def test_a_change_on_purpose_is_counted_under_its_reason_and_must_still_exist(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"gate": {"v": 1.0, "w": 2.0}, "other": 3.0}))
    snap = snapshot(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"gate": {"v": 1.5}, "other": 4.0}))
    res = compare(snap, tmp_path, [{"from": "a.json:gate.", "changed": "new gate"}])
    assert res["changed"] == {"new gate": 1} and res["missing"] == ["a.json:gate.w"]
    assert res["differ"] == [("a.json:other", 3.0, 4.0)]


def test_a_change_on_purpose_can_be_limited_to_named_fields(tmp_path):
    (tmp_path / "a.json").write_text(json.dumps({"runs": {"x": {"eval_pass": 0.5, "reward": 0.1}}}))
    snap = snapshot(tmp_path)
    (tmp_path / "a.json").write_text(json.dumps({"runs": {"x": {"eval_pass": 0.6, "reward": 0.2}}}))
    res = compare(snap, tmp_path, [{"from": "a.json:", "fields": ["eval_pass"], "changed": "new stream"}])
    assert res["changed"] == {"new stream": 1} and res["differ"] == [("a.json:runs.x.reward", 0.1, 0.2)]


def test_the_command_accepts_a_fresh_snapshot_with_no_rules(capsys):
    from agentrl.report.numbers import main
    snapshot, moved = FIXTURES / "reports_numbers.json", FIXTURES / "reports_moved.json"
    assert main(str(snapshot), str(REPO / "reports"), str(moved)) == 0
    assert " 0 differ, 0 missing" in capsys.readouterr().out
