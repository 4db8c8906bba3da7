"""`audit` of a lab number: labs run outside `dvc repro`, so no dvc.lock entry covers reports/labs/<lab>/seed<N>.json;
the number is traced through the lab's provenance record (its resolved config and seed, params hash, code closure,
the model directory with its source hashes, commit, machine, dtype, MLflow run), and the audit says whether this
tree still matches the record: the config resolved through its base, an explored recipe's config file, a record
whose report moved."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

from agentrl.tracking import audit
from agentrl.tracking.provenance import code_hash, params_hash

REPO = Path(__file__).resolve().parents[1]
SOURCE = {"name": "tiny", "honest_name": "a tiny model", "package": "tiny-pkg", "version": "1.0", "sha256": "ab" * 32,
          "wheel_sha256": "cd" * 32, "member": "tiny.gguf", "dtype": "float32"}


@pytest.fixture
def lab_tree(tmp_path, monkeypatch, store_template):
    """A project with the lab stage's dvc.yaml entry, a lab `x` on a converted model directory, its report and the
    provenance records of the lab and of the conversion."""
    root = tmp_path / "proj"
    (root / "stages").mkdir(parents=True)
    (root / "stages" / "lab.py").write_text("print('lab')\n")
    (root / "agentrl").mkdir()
    (root / "agentrl" / "__init__.py").write_text("X = 1\n")
    graph = yaml.safe_load((REPO / "dvc.yaml").read_text())
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"lab": graph["stages"]["lab"]}}))
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")   # the default pipeline: no lab in it
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["lab"]["configs"] = {"x": {"base": "b", "lr": 3.0e-5, "steps": 4}, "b": {"model": "data/models/tiny"}}
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    model = root / "data" / "models" / "tiny"
    model.mkdir(parents=True)
    (model / "agentrl_source.json").write_text(json.dumps(SOURCE))
    (root / "reports" / "labs" / "x").mkdir(parents=True)
    (root / "reports" / "labs" / "x" / "seed1.json").write_text(json.dumps({"held_out": {"after": {"mean": 0.25}}}))
    recorded = {"lab.configs.x.model": "data/models/tiny", "lab.configs.x.lr": 3.0e-5, "lab.configs.x.steps": 4,
                "lab.device": "cpu", "lab.seed": 1}
    code = ["agentrl/__init__.py", "stages/lab.py"]
    prov = root / "reports" / "provenance"
    prov.mkdir()
    (prov / "lab@x-1.json").write_text(json.dumps({
        "stage": "lab@x-1", "params": recorded, "params_hash": params_hash(recorded), "code_files": code,
        "code_hash": code_hash(code, root), "inputs": {}, "git_commit": "unknown", "dirty": False,
        "machine": {"mode": "native", "isa": "AVX2", "threads": 2}, "mlflow": {"run_id": "0" * 32},
        "started": "2026-01-01T00:00:00Z", "wall_seconds": 12.5}))
    (prov / "pretrained@tiny.json").write_text(json.dumps({"inputs": {"data/pretrained/tiny.gguf": SOURCE["sha256"]},
                                                           "git_commit": "f" * 40, "fingerprint": "1234"}))
    shutil.copy(store_template, tmp_path / "mlflow.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'mlflow.db'}")
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.chdir(root)
    return root


def _audit(root, capsys, spec="reports/labs/x/seed1.json:held_out.after.mean"):
    code = audit.main(spec, root=root)
    return code, capsys.readouterr()


def test_a_lab_number_is_traced_through_its_provenance_record(lab_tree, capsys):
    code, out = _audit(lab_tree, capsys)
    assert code == 0 and out.err == "", out.err
    text = out.out
    assert text.startswith("reports/labs/x/seed1.json:held_out.after.mean = 0.25")
    assert "lab@x-1   (python -m stages.lab), run outside `dvc repro`: dvc.lock holds no entry" in text
    record = json.loads((lab_tree / "reports/provenance/lab@x-1.json").read_text())
    assert "reports/provenance/lab@x-1.json" in text and f"params       : 5, hash {record['params_hash']}" in text
    for fragment in ("lab.configs.x.lr = 3e-05", "data/models/tiny (lab.configs.x.model; present)",
                     f"tiny.gguf sha256 {SOURCE['sha256']}", f"wheel sha256 {SOURCE['wheel_sha256']}",
                     "converted by reports/provenance/pretrained@tiny.json", "dtype        : float32",
                     "native numerics, AVX2 kernels", "code hash", "not found", "status       : current"):
        assert fragment in text, (fragment, text)
    result = audit.audit("reports/labs/x/seed1.json:held_out.after.mean", lab_tree)
    assert result["outside"] and result["status"] == "current" and result["value"] == 0.25


@pytest.mark.parametrize("change, reason", [
    (lambda r: (r / "params.yaml").write_text((r / "params.yaml").read_text().replace("steps: 4", "steps: 5")),
     "param lab.configs.x.steps: 4 in the record, 5 now"),
    (lambda r: (r / "params.yaml").write_text((r / "params.yaml").read_text().replace("steps: 4", "steps: 4\n"
                                                                                       "      epochs: 2")),
     "param lab.configs.x.epochs: 2 in params.yaml, not in the record"),
    (lambda r: (r / "params.yaml").write_text((r / "params.yaml").read_text().replace("model: data/models/tiny",
                                                                                       "model: data/models/other")),
     "param lab.configs.x.model: \"data/models/tiny\" in the record, \"data/models/other\" now"),   # the base's
    (lambda r: (r / "stages" / "lab.py").write_text("print('changed')\n"), "code: the closure's bytes differ"),
    (lambda r: shutil.rmtree(r / "data" / "models" / "tiny"), "model directory data/models/tiny: missing"),
    (lambda r: (r / "data/models/tiny/agentrl_source.json").write_text(json.dumps({**SOURCE, "sha256": "00" * 32})),
     "model directory data/models/tiny: converted from another file than its pretrained record says")])
def test_what_no_longer_matches_the_record_is_named(lab_tree, capsys, change, reason):
    change(lab_tree)
    code, out = _audit(lab_tree, capsys)
    assert code == 1 and "status       : STALE (1 difference(s)" in out.out and f"      - {reason}" in out.out, out.out


def test_a_file_no_stage_and_no_record_covers_is_one_line(lab_tree, capsys):
    (lab_tree / "reports" / "labs" / "comparison.json").write_text('{"a": 1}')
    code, out = _audit(lab_tree, capsys, "reports/labs/comparison.json:a")
    assert code == 2 and out.err.strip().splitlines() == [
        "error: reports/labs/comparison.json: no stage in dvc.lock writes it, and no provenance record of a stage "
        "run outside `dvc repro` names it"], out.err
    (lab_tree / "reports" / "provenance" / "lab@x-1.json").unlink()   # the record gone: nothing to trace through
    code, out = _audit(lab_tree, capsys)
    assert code == 2 and len(out.err.strip().splitlines()) == 1


def test_a_moved_record_is_compared_under_its_new_name(lab_tree, capsys):
    """A seed that ran as its own config (lab.configs.x_seed1, seed: 1) and moved to x's directory: its record's keys
    are read as x's at seed 1, so only what really differs is named."""
    prov = lab_tree / "reports" / "provenance"
    record = json.loads((prov / "lab@x-1.json").read_text())
    old = {k.replace("lab.configs.x.", "lab.configs.x_seed1."): v for k, v in record["params"].items()
           if k != "lab.seed"}
    record.update(stage="lab@x_seed1", params={**old, "lab.configs.x_seed1.seed": 1},
                  moved={"stage": "lab@x_seed1", "report": "reports/labs/x_seed1.json", "config": "x_seed1",
                         "recipe": "x", "seed": 1, "why": "a seed is not a config"})
    (prov / "lab@x-1.json").write_text(json.dumps(record))
    code, out = _audit(lab_tree, capsys)
    assert code == 0 and "status       : current" in out.out, out.out
    assert "moved        : ran as lab@x_seed1 (report reports/labs/x_seed1.json), moved since: a seed is not" in out.out


def test_an_explored_recipes_number_is_traced_through_its_config_file(lab_tree, capsys):
    home = lab_tree / "reports" / "labs" / "explored" / "idea"
    home.mkdir(parents=True)
    (home / "config.yaml").write_text("base: b\nlr: 3.0e-5\nsteps: 4\n")
    (home / "seed1.json").write_text(json.dumps({"held_out": {"after": {"mean": 0.5}}}))
    prov = lab_tree / "reports" / "provenance"
    record = json.loads((prov / "lab@x-1.json").read_text())
    params = {k.replace("lab.configs.x.", "lab.configs.idea."): v for k, v in record["params"].items()}
    params["lab.config_file"] = "reports/labs/explored/idea/config.yaml"
    (prov / "lab@explored.idea-1.json").write_text(json.dumps({**record, "stage": "lab@explored.idea-1",
                                                               "params": params}))
    spec = "reports/labs/explored/idea/seed1.json:held_out.after.mean"
    code, out = _audit(lab_tree, capsys, spec)
    assert code == 0 and "status       : current" in out.out, out.out
    assert "--config reports/labs/explored/idea/config.yaml --seed 1" in out.out
    (home / "config.yaml").write_text("base: b\nlr: 1.0e-4\nsteps: 4\n")
    code, out = _audit(lab_tree, capsys, spec)
    assert code == 1 and "param lab.configs.idea.lr: 3e-05 in the record, 0.0001 now" in out.out, out.out
