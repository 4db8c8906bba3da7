"""The labs' gate (docs/labs.md, recipe steps 4 and 6): each failed preflight check and a signal check below
min_signal is named; a lab the gate stops exits with that one line after its report and its provenance record are
kept, so `audit` traces a stopped lab's numbers like a finished one's."""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from agentrl.labs.recipe import gate_failures

REPO = Path(__file__).resolve().parents[1]
PASSING = {"ratio_is_one": {"passed": True, "value": 2e-6}, "update_direction": {"passed": True, "value": 0.85}}
SIGNAL = {"informative_share": 0.75, "groups": 8}


def test_a_passing_gate_and_enough_signal_stop_nothing():
    assert gate_failures({"checks": PASSING}, SIGNAL, SimpleNamespace(min_signal=0.25)) == []
    assert gate_failures({"checks": PASSING}, None, SimpleNamespace(min_signal=0.25)) == []   # no signal check run


def test_the_gate_names_each_failed_check_by_number_and_a_signal_below_min_signal():
    checks = {**PASSING, "update_direction": {"passed": False, "value": -0.206}}
    assert gate_failures({"checks": checks}, SIGNAL, SimpleNamespace(min_signal=0.25)) == [
        "preflight check 8 (update_direction) failed: -0.206"]
    weak = {"informative_share": 0.125, "groups": 8}
    assert gate_failures({"checks": checks}, weak, SimpleNamespace(min_signal=0.25)) == [
        "preflight check 8 (update_direction) failed: -0.206",
        "the signal check found 0.12 of its 8 groups with rewards that disagree, below min_signal 0.25"]


@pytest.fixture
def lab_project(tmp_path, monkeypatch, store_template):
    """A project with this checkout's code, the lab stage's dvc.yaml entry and a lab `x`."""
    root = tmp_path / "proj"
    for part in ("agentrl", "stages"):
        shutil.copytree(REPO / part, root / part, ignore=shutil.ignore_patterns("__pycache__"))
    graph = yaml.safe_load((REPO / "dvc.yaml").read_text())
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"lab": graph["stages"]["lab"]}}))
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["lab"]["configs"] = {"b": {"steps": 2}, "x": {"base": "b", "lr": 1.0e-5}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    shutil.copy(store_template, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("AGENTRL_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.chdir(root)
    return root


def _stopped_lab(went_on: bool):
    """run_lab and lab_report as a lab whose preflight check 8 failed leaves them (the recipe itself is tested on
    small models in tests/test_labs.py; this is the stage around it)."""
    record = {"config": {"model": None, "environment": "gym"}, "history": [], "wall_s": 12.0, "cpu_s": 20.0,
              "peak_memory_mib": 100.0,
              "stopped": {"reasons": ["preflight check 8 (update_direction) failed: -0.206"], "went_on": went_on}}

    def run_lab(name, run, seed, params, out, model_dir, **kwargs):
        assert kwargs["past_gates"] is went_on and (name, run.steps, run.lr, seed) == ("x", 2, 1.0e-5, 3)
        assert (out.as_posix(), model_dir.as_posix()) == ("data/labs/x/seed3", "data/models/lab-x-3")
        return record

    def lab_report(rec):
        return {"held_out": {"before": {"mean": 0.5}}}, "# Lab `x`\n\n**Stopped before GRPO.**\n"
    return run_lab, lab_report


def test_a_lab_the_gate_stops_exits_in_one_line_and_keeps_its_report_and_provenance(lab_project, monkeypatch,
                                                                                      capsys):
    import os

    from mlflow.tracking import MlflowClient

    from agentrl.core.boundary import guard
    from agentrl.tracking import audit
    from stages import lab
    run_lab, lab_report = _stopped_lab(went_on=False)
    monkeypatch.setattr("agentrl.labs.recipe.run_lab", run_lab)
    monkeypatch.setattr("agentrl.labs.report.lab_report", lab_report)
    code = guard("lab", lab.main, "x", 3, None, False)
    err = capsys.readouterr().err
    assert code != 0
    assert err.strip().splitlines() == ["error: lab x seed 3: stopped before GRPO: preflight check 8 "
                                        "(update_direction) failed: -0.206 (the report reports/labs/x/seed3.md says "
                                        "so; --past-gates goes on)"]
    assert json.loads((lab_project / "reports/labs/x/seed3.json").read_text()) == \
        {"held_out": {"before": {"mean": 0.5}}}
    record = json.loads((lab_project / "reports/provenance/lab@x-3.json").read_text())
    assert record["stage"] == "lab@x-3" and record["params"]["lab.seed"] == 3
    assert record["params"]["lab.configs.x.steps"] == 2 and record["params"]["lab.configs.x.lr"] == 1.0e-5
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    runs = client.search_runs([client.get_experiment_by_name("agentrl").experiment_id])
    assert [r.data.tags.get("stopped_before_grpo") for r in runs] == [
        "preflight check 8 (update_direction) failed: -0.206"]
    traced = audit.audit("reports/labs/x/seed3.json:held_out.before.mean", lab_project)
    assert traced["outside"] and traced["value"] == 0.5 and traced["status"] == "current", traced
    (lab_project / "params.yaml").write_text((lab_project / "params.yaml").read_text().replace("steps: 2",
                                                                                               "steps: 4"))
    traced = audit.audit("reports/labs/x/seed3.json:held_out.before.mean", lab_project)   # the base's edit counts
    assert traced["status"] == "stale" and traced["reasons"] == ["param lab.configs.x.steps: 2 in the record, 4 now"]


def test_a_lab_told_to_go_past_its_gates_finishes_without_the_stop(lab_project, monkeypatch, capsys):
    from agentrl.core.boundary import guard
    from stages import lab
    run_lab, lab_report = _stopped_lab(went_on=True)
    monkeypatch.setattr("agentrl.labs.recipe.run_lab", run_lab)
    monkeypatch.setattr("agentrl.labs.report.lab_report", lambda rec: (
        {"held_out": {"before": {"mean": 0.5}, "after": {"mean": 0.5},
                      "gain": {"mean": 0.0, "lo": -0.1, "hi": 0.1}}}, "# Lab `x`\n"))
    assert guard("lab", lab.main, "x", 3, None, True) == 0, capsys.readouterr().err
    assert (lab_project / "reports/provenance/lab@x-3.json").is_file()


def test_a_lab_device_this_machine_lacks_is_refused_before_any_run_exists(lab_project, capsys):
    """lab.device: cuda on a machine without one: one line, exit 2, and no MLflow run (the refusal used to come from
    inside the stage's run, which it left FAILED for a lab that never started)."""
    import os

    import torch
    from mlflow.tracking import MlflowClient

    from agentrl.core.boundary import guard
    from stages import lab
    if torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: lab.device cuda is valid here")
    params = yaml.safe_load((lab_project / "params.yaml").read_text())
    params["lab"]["device"] = "cuda"
    (lab_project / "params.yaml").write_text(yaml.safe_dump(params))
    assert guard("lab", lab.main, "x", 0, None, False) == 2
    assert capsys.readouterr().err.strip().splitlines() == [
        "error: lab.device: cuda, but torch sees no CUDA device here (torch.cuda.is_available() is False); allowed on "
        "this machine: cpu"]
    client = MlflowClient(tracking_uri=os.environ["MLFLOW_TRACKING_URI"])
    experiment = client.get_experiment_by_name("agentrl")
    assert experiment is None or client.search_runs([experiment.experiment_id]) == []
    assert not (lab_project / "reports" / "provenance").exists()


def test_the_stage_runs_the_controls_its_config_asks_for_and_keeps_them_in_the_report(lab_project, monkeypatch,
                                                                                      capsys):
    """The stage hands run_lab the controls (agentrl.labs.controls.after_grpo) and the config's temperatures and
    baselines; what they return stays in the report's JSON, the stage's declared output."""
    from agentrl.core.boundary import guard
    from agentrl.labs import controls
    from stages import lab
    params = yaml.safe_load((lab_project / "params.yaml").read_text())
    params["lab"]["configs"]["x"].update(temperatures=[0.5], baselines=["more_cloning_tokens"])
    (lab_project / "params.yaml").write_text(yaml.safe_dump(params))
    seen = {}

    def run_lab(name, run, seed, params, out, model_dir, **kwargs):
        seen.update(after=kwargs["after_grpo"], temperatures=run.temperatures, baselines=run.baselines)
        return {"config": {"model": None, "environment": "gym"}, "history": [], "wall_s": 1.0, "cpu_s": 1.0,
                "peak_memory_mib": 1.0, "stopped": None, "controls": {"temperatures": {"seed": 3}}}
    monkeypatch.setattr("agentrl.labs.recipe.run_lab", run_lab)
    monkeypatch.setattr("agentrl.labs.report.lab_report", lambda rec: (
        {"controls": rec["controls"], "held_out": {"before": {"mean": 0.5}, "after": {"mean": 0.5},
                                                   "gain": {"mean": 0.0, "lo": -0.1, "hi": 0.1}}}, "# Lab `x`\n"))
    assert guard("lab", lab.main, "x", 3, None, False) == 0, capsys.readouterr().err
    assert seen == {"after": controls.after_grpo, "temperatures": [0.5], "baselines": ["more_cloning_tokens"]}
    assert json.loads((lab_project / "reports/labs/x/seed3.json").read_text())["controls"] == \
        {"temperatures": {"seed": 3}}
    assert sorted(p.name for p in (lab_project / "reports/labs/x").iterdir()) == ["seed3.json", "seed3.md"]
