"""`compare-reports A B` on three pairs of report trees: identical; float-level differences inside the report's own
intervals; a difference that changes a conclusion (the paired interval now includes 0). Built from copies of the
committed reports, so the headline paths are the ones the pipeline writes."""
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agentrl.report.verdict import compare_trees, verdict

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def trees(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    for tree in (a, b):
        tree.mkdir()
        for f in (REPO / "reports").glob("*.json"):
            shutil.copy(f, tree / f.name)
    return a, b


def edit(tree: Path, name: str, fn):
    data = json.loads((tree / name).read_text())
    fn(data)
    (tree / name).write_text(json.dumps(data))


def test_identical_trees(trees):
    res = compare_trees(*trees)
    assert res["differ"] == {} and res["changed_conclusions"] == []
    assert verdict(res).startswith("identical") and all(r["inside"] == "same" for r in res["headlines"])


def test_float_level_differences_inside_the_spread_change_no_conclusion(trees):
    a, b = trees

    def nudge(d):
        d["chosen"]["pass_at_1"] = d["chosen"]["pass_at_1"] - 1e-7
        d["paired_diff"]["mean"] += 1e-7
    edit(b, "test.json", nudge)
    edit(b, "ablation.json", lambda d: d["arms"]["kl"].update(heldout_pass=d["arms"]["kl"]["heldout_pass"] + 1e-6))
    res = compare_trees(a, b)
    assert sum(res["differ"].values()) == 3 and res["changed_conclusions"] == []
    rows = {r["name"]: r["inside"] for r in res["headlines"]}
    assert rows["test: chosen checkpoint pass@1"] == "yes" and rows["ablation: kl held-out pass"] == "yes"
    assert "every headline number inside the report's own spread" in verdict(res)


def test_a_paired_interval_that_now_includes_zero_changes_a_conclusion(trees):
    a, b = trees
    edit(b, "test.json", lambda d: d["paired_diff"].update(ci_lo=-0.01, mean=0.2))
    res = compare_trees(a, b)
    assert [c["statement"] for c in res["changed_conclusions"]] == ["paired gain interval (chosen - start)"]
    assert res["changed_conclusions"][0]["b"] == "includes 0"
    rows = {r["name"]: r["inside"] for r in res["headlines"]}
    assert rows["test: paired gain over the start"] == "NO"
    assert "1 conclusion(s) of the report change" in verdict(res)


def test_an_unreadable_report_is_one_line_naming_it(trees):

    from agentrl.report.verdict import CompareError
    a, b = trees
    (b / "test.json").unlink()
    cases = {"a dangling symlink": lambda p: p.symlink_to(b / "nowhere.json"),
             "a symlink loop": lambda p: (p.symlink_to(b / "loop"), (b / "loop").symlink_to(p)),
             "a character device": lambda p: p.symlink_to("/dev/zero"),
             "truncated JSON": lambda p: p.write_text((a / "test.json").read_text()[:300])}
    for what, make in cases.items():
        for extra in (b / "test.json", b / "loop"):
            if extra.is_symlink() or extra.exists():
                extra.unlink()
        make(b / "test.json")
        with pytest.raises(CompareError) as err:
            compare_trees(a, b)
        assert str(err.value).startswith(str(b / "test.json")) and "\n" not in str(err.value), what


def test_a_nan_interval_is_no_conclusion_and_json_stays_strict(trees, capsys):
    from agentrl.report.verdict import main
    a, b = trees
    edit(b, "test.json", lambda d: d["paired_diff"].update(ci_lo=float("nan"), ci_hi=float("nan")))
    res = compare_trees(a, b)
    assert res["conclusions"]["paired gain interval (chosen - start)"] == "> 0"
    assert compare_trees(b, a)["conclusions"]["paired gain interval (chosen - start)"] == "NaN"
    assert main(str(a), str(b), as_json=True) == 1
    out = capsys.readouterr().out
    json.loads(out, parse_constant=lambda c: pytest.fail(f"bare {c} in --json"))
    assert '"NaN"' in out


@pytest.mark.slow
def test_the_verb_exit_codes(trees, tmp_path):
    a, b = trees
    run = lambda *args: subprocess.run([sys.executable, "-m", "agentrl", "compare-reports", *map(str, args)],
                                       capture_output=True, text=True, cwd=REPO)
    same = run(a, b)
    assert same.returncode == 0 and "verdict: identical" in same.stdout
    edit(b, "preflight.json", lambda d: d.update(matches_expected=False))
    changed = run(a, b)
    assert changed.returncode == 1 and "CHANGED" in changed.stdout
    bad = run(a, tmp_path / "nope")
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "not a directory" in bad.stderr
