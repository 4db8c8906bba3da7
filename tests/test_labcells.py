"""`labcells`: the grid of cells, the spec each cell runs, and the table docs/labs.md keeps (pure functions over
hand-written records; a cell's real run is a lab's cost and is measured in docs/labs.md, not here)."""
from __future__ import annotations

import json

import pytest

from agentrl.core.config import ConfigError
from agentrl.labs import cells


def test_the_grid_crosses_every_axis_with_the_fixed_values():
    got = cells.grid(["rl.keep=informative"], ["rl.temperature=1.0,1.2", "demos=format,expert"])
    assert len(got) == 4
    assert {(c["rl.temperature"], c["demos"]) for c in got} == {(1.0, "format"), (1.0, "expert"), (1.2, "format"),
                                                                (1.2, "expert")}
    assert all(c["rl.keep"] == "informative" for c in got)
    assert cells.grid([], []) == [{}]
    with pytest.raises(ConfigError, match=r"^--set/--grid: expected KEY=VALUE, got 'lr'$"):
        cells.grid(["lr"], [])


def test_a_cells_rl_changes_go_into_the_labs_rl_overrides_and_leave_the_base_alone():
    base = {"lr": 3e-6, "rl": {"keep": "informative"}}
    spec = cells.cell_spec(base, {"rl.temperature": 1.2, "lr": 1e-5})
    assert spec == {"lr": 1e-5, "rl": {"keep": "informative", "temperature": 1.2}}
    assert base == {"lr": 3e-6, "rl": {"keep": "informative"}}


def _side(informative, pass_rate, call, op, malformed):
    return {"informative_share": informative, "pass_rate": pass_rate, "malformed": malformed,
            "decision_entropy": {"call": call, "op": op}}


def test_the_table_shows_the_change_and_the_zero_advantage_share_per_step(tmp_path, monkeypatch):
    from agentrl.labs.instance import LabInstance
    monkeypatch.chdir(tmp_path)
    inst = LabInstance("x", 0, {})
    assert cells.results_path(inst).as_posix() == "reports/labs/x/seed0.cells.json"
    cells.results_path(inst).parent.mkdir(parents=True)
    history = [{"updated": True, "zero_adv_frac": 0.0, "approx_kl_max": 0.0002},
               {"updated": True, "zero_adv_frac": 0.25, "approx_kl_max": 0.0001},
               {"updated": False, "zero_adv_frac": 1.0, "approx_kl_max": None}]
    record = {"cell": "lr=3e-6", "steps": 3, "history": history, "seconds": {"total": 401.6},
              "before": _side(0.75, 0.296875, 0.402, 1.61, 0.05), "after": _side(0.5, 0.25, 0.372, 1.49, 0.05)}
    cells.results_path(inst).write_text(json.dumps({"lr=3e-6": record}))
    rows = cells.table(inst).splitlines()
    assert rows[0].split(" | ")[4:6] == ["change", "zero-advantage share per step"]
    assert rows[2] == ("| lr=3e-6 | 3 (2) | 0.75 -> 0.50 | 0.297 -> 0.250 | -0.047 | 0.42 | 0.402 -> 0.372 | "
                       "1.610 -> 1.490 | 0.05 -> 0.05 | 0.0002 | 402 |")


def test_the_table_of_a_lab_without_cells_is_one_line_naming_the_file(tmp_path, monkeypatch):
    from agentrl.labs.instance import LabInstance
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"^labcells --table: reports/labs/nothing/seed0\.cells\.json does not"):
        cells.table(LabInstance("nothing", 0, {}))
