"""Provenance layer: one MLflow run per stage, fingerprints, store resolution, concurrency, audit.

Every test points MLFLOW_TRACKING_URI at a sqlite file under tmp_path, so the project's real store is never touched.
A migrated empty store is built once per session and copied per test (first-time migration takes seconds).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from agentrl import tracking

PARAMS = {"rl": {"lr": 0.01, "steps": 60, "group_size": 8}, "run": {"threads": 2, "seed": 0}}
STAGE_PARAMS = {"rl": dict(PARAMS["rl"]), "run": dict(PARAMS["run"])}


def _client(uri):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


@pytest.fixture(scope="session")
def store_template(tmp_path_factory):
    """A migrated, empty sqlite store to copy (creating one from scratch runs the DB migrations: slow)."""
    db = tmp_path_factory.mktemp("template") / "mlflow.db"
    _client(f"sqlite:///{db.as_posix()}").search_experiments()
    return db


def _make_project(root: Path) -> Path:
    (root / "agentrl").mkdir(parents=True)
    (root / "agentrl" / "__init__.py").write_text("X = 1\n")
    (root / "stages").mkdir()
    (root / "stages" / "train.py").write_text("print('train')\n")
    (root / "data").mkdir()
    (root / "data" / "tasks.json").write_text('{"tasks": [1, 2, 3]}\n')
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    return root


@pytest.fixture
def project(tmp_path, monkeypatch, store_template):
    """A temp project (params.yaml, an input file, agentrl/ and stages/) with its own store; cwd = project."""
    root = _make_project(tmp_path / "proj")
    store = tmp_path / "store" / "mlflow.db"
    store.parent.mkdir()
    shutil.copy(store_template, store)
    monkeypatch.chdir(root)
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store.as_posix()}")
    # hash the temp project's agentrl/ rather than the installed package (which other work may be editing)
    monkeypatch.setattr(tracking, "_imported_agentrl_dir", lambda: root / "agentrl")
    return SimpleNamespace(root=root, store=store, uri=f"sqlite:///{store.as_posix()}")


def _runs(uri, experiment="agentrl"):
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


# ---------------------------------------------------------------------------------------------------------------
# import and environment

def test_import_is_cheap_and_disables_telemetry():
    code = ("import os, sys; os.environ.pop('MLFLOW_DISABLE_TELEMETRY', None); os.environ.pop('DO_NOT_TRACK', None);"
            "import agentrl.tracking; assert 'mlflow' not in sys.modules, 'mlflow imported eagerly';"
            "print(os.environ['MLFLOW_DISABLE_TELEMETRY'], os.environ['DO_NOT_TRACK'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["true", "true"]


# ---------------------------------------------------------------------------------------------------------------
# root and store resolution

def test_tracking_uri_under_dvc_root_and_absolute(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "sub").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.chdir(elsewhere)
    assert tracking.project_root() == root.resolve()
    uri = tracking.tracking_uri()
    assert uri == f"sqlite:///{(root.resolve() / 'mlflow.db').as_posix()}"
    assert Path(uri[len("sqlite:///"):]).is_absolute()
    assert tracking.artifact_location() == (root.resolve() / "mlartifacts").as_uri()

    # a relative MLFLOW_TRACKING_URI is anchored at the project root, not the cwd
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///other.db")
    assert tracking.tracking_uri() == f"sqlite:///{(root.resolve() / 'other.db').as_posix()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert tracking.tracking_uri() == "http://127.0.0.1:5000"


def test_root_inside_dvc_experiment_tempdir_maps_to_main_repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    temp_copy = root / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    (temp_copy / "stages").mkdir(parents=True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    # DVC >= 3.20 sets DVC_ROOT to the main repo; should it ever point at the executor copy, map it back
    monkeypatch.setenv("DVC_ROOT", str(temp_copy))
    assert tracking.project_root() == root.resolve()
    # no DVC_ROOT at all, running inside the copy: same answer
    monkeypatch.delenv("DVC_ROOT")
    monkeypatch.chdir(temp_copy / "stages")
    assert tracking.project_root() == root.resolve()
    assert tracking.tracking_uri() == f"sqlite:///{(root.resolve() / 'mlflow.db').as_posix()}"


# ---------------------------------------------------------------------------------------------------------------
# hashing and code version

def test_file_hash_file_dir_and_missing(tmp_path):
    d = tmp_path / "ckpt"
    (d / "sub").mkdir(parents=True)
    (d / "a.bin").write_bytes(b"abc")
    (d / "sub" / "b.bin").write_bytes(b"xyz")
    import hashlib
    assert tracking.file_hash(d / "a.bin") == hashlib.sha256(b"abc").hexdigest()
    h1 = tracking.file_hash(d)
    (d / "sub" / "b.bin").write_bytes(b"xyZ")
    h2 = tracking.file_hash(d)
    (d / "sub" / "b.bin").rename(d / "sub" / "c.bin")
    assert len({h1, h2, tracking.file_hash(d)}) == 3
    with pytest.raises(tracking.ProvenanceError, match="not found.*nope"):
        tracking.file_hash(tmp_path / "nope")


def test_code_hash_covers_py_files_only(tmp_path):
    root = _make_project(tmp_path / "p")
    h = tracking.code_hash(root)
    assert len(h) == 16
    (root / "agentrl" / "notes.txt").write_text("not code")
    (root / "reports").mkdir()
    (root / "reports" / "x.py").write_text("outside code dirs")
    assert tracking.code_hash(root) == h
    (root / "agentrl" / "sub").mkdir()
    (root / "agentrl" / "sub" / "m.py").write_text("Y = 2\n")
    h2 = tracking.code_hash(root)
    assert h2 != h
    (root / "stages" / "train.py").write_text("print('train!')\n")
    assert tracking.code_hash(root) not in (h, h2)


def test_git_info_dirty_only_for_code_and_config(tmp_path):
    root = _make_project(tmp_path / "g")
    (root / "reports").mkdir()
    (root / "reports" / "m.json").write_text("{}")
    (root / "dvc.lock").write_text("schema: '2.0'\n")

    def git(*args):
        return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=root,
                              capture_output=True, text=True, check=True).stdout.strip()

    git("init", "-q")
    assert tracking.git_info(root)["commit"] == "unknown"
    git("add", "-A")
    git("commit", "-q", "-m", "init")
    info = tracking.git_info(root)
    assert info == {"commit": git("rev-parse", "HEAD"), "dirty": False}
    (root / "reports" / "m.json").write_text('{"x": 1}')   # pipeline outputs change during a run
    (root / "dvc.lock").write_text("schema: '2.0'\nstages: {}\n")
    (root / "data" / "tasks.json").write_text("[]")
    assert tracking.git_info(root)["dirty"] is False
    (root / "params.yaml").write_text("rl: {lr: 0.5}\n")
    assert tracking.git_info(root)["dirty"] is True
    git("checkout", "--", "params.yaml")
    (root / "agentrl" / "new.py").write_text("Z = 3\n")   # an uncommitted new module is a code change too
    assert tracking.git_info(root)["dirty"] is True
    assert tracking.git_info(tmp_path)["commit"] == "unknown"  # not a repository


def test_versions_and_fingerprint_fields():
    v = tracking.versions()
    assert set(v) == {"python", "torch", "dvc", "mlflow", "agentrl"}
    assert v["python"] == ".".join(map(str, sys.version_info[:3]))
    assert all(isinstance(x, str) and x for x in v.values())
    rec = {"stage": "s", "params": {"a.b": 1}, "threads": 1, "versions": v, "git_commit": "c", "dirty": False,
           "code_hash": "h", "inputs": {"x": "y"}}
    fp = tracking.fingerprint(rec)
    assert len(fp) == 16
    # run ids, URIs and key order do not matter; content does
    same = dict(reversed(list(rec.items())), mlflow_run_id="r1", tracking_uri="sqlite:///x", fingerprint="zz")
    assert tracking.fingerprint(same) == fp
    assert tracking.fingerprint({**rec, "threads": 2}) != fp
    assert tracking.fingerprint({**rec, "dirty": True}) != fp
    assert tracking.fingerprint({**rec, "inputs": {"x": "z"}}) != fp


# ---------------------------------------------------------------------------------------------------------------
# stage_run

def test_stage_run_logs_exactly_one_run(project):
    rows = [{"step": i, "reward": i / 200, "loss": 1.0 - i / 400, "note": "text", "ok": True,
             "nan": float("nan"), "inf": float("inf"), "stats": {"kl": 0.1 * i}} for i in range(200)]
    with tracking.stage_run("train", STAGE_PARAMS, ["data/tasks.json"], threads=2) as run:
        assert run.log_history(rows) == 600     # reward, loss, stats.kl x 200; the rest skipped
        assert run.log_metrics({"final": {"pass_rate": 0.75}, "label": "x"}, step=60) == 1
        prov = run.provenance
    assert set(prov) == set(tracking.PROVENANCE_KEYS)
    assert prov["mlflow_run_id"] == run.run_id and prov["fingerprint"] == run.fingerprint
    assert prov["tracking_uri"] == project.uri and prov["experiment"] == "agentrl"
    assert prov["params"]["rl.lr"] == 0.01 and prov["threads"] == 2
    assert prov["inputs"] == {"data/tasks.json": tracking.file_hash(project.root / "data" / "tasks.json")}
    assert prov["fingerprint"] == tracking.fingerprint(prov)
    json.dumps(prov, allow_nan=False)       # embeddable in a stage's JSON output

    runs = _runs(project.uri)
    assert len(runs) == 1
    r = runs[0]
    assert r.info.run_id == run.run_id and r.info.run_name == "train" and r.info.status == "FINISHED"
    assert r.data.params["rl.lr"] == "0.01" and r.data.params["run.threads"] == "2"
    assert r.data.params["rl.group_size"] == "8" and r.data.params["run.seed"] == "0"
    tags = r.data.tags
    assert tags["fingerprint"] == prov["fingerprint"]
    assert tags["stage"] == "train" and tags["code_hash"] == prov["code_hash"]
    assert tags["git.commit"] == prov["git_commit"] and tags["git.dirty"] == str(prov["dirty"]).lower()
    assert tags["input.data/tasks.json"] == prov["inputs"]["data/tasks.json"]
    for name in ("python", "torch", "dvc", "mlflow", "agentrl"):
        assert tags[f"version.{name}"] == prov["versions"][name]
    client = _client(project.uri)
    history = client.get_metric_history(run.run_id, "reward")
    assert sorted(m.step for m in history) == list(range(200))
    assert len(client.get_metric_history(run.run_id, "stats.kl")) == 200
    assert set(r.data.metrics) == {"reward", "loss", "stats.kl", "final.pass_rate"}
    exp = client.get_experiment(r.info.experiment_id)
    assert exp.artifact_location == (project.store.parent / "mlartifacts").as_uri()
    assert not (project.root / "mlruns").exists() and not (project.store.parent / "mlartifacts").exists()


def test_fingerprint_stable_and_sensitive(project):
    def run_once(params=STAGE_PARAMS):
        with tracking.stage_run("train", params, ["data/tasks.json"], threads=2) as run:
            return run

    a, b = run_once(), run_once()
    assert a.run_id != b.run_id
    assert a.fingerprint == b.fingerprint
    changed = {"rl": {**STAGE_PARAMS["rl"], "lr": 0.02}, "run": STAGE_PARAMS["run"]}
    c = run_once(changed)
    assert c.fingerprint != a.fingerprint
    (project.root / "data" / "tasks.json").write_text('{"tasks": [1, 2, 4]}\n')
    d = run_once()
    assert d.fingerprint not in (a.fingerprint, c.fingerprint)
    with tracking.stage_run("train", STAGE_PARAMS, ["data/tasks.json"], threads=1 + 1) as e:
        pass
    assert e.fingerprint == d.fingerprint
    assert len(_runs(project.uri)) == 5


def test_stage_run_failure_marks_failed_and_reraises(project):
    with pytest.raises(RuntimeError, match="boom"):
        with tracking.stage_run("train", STAGE_PARAMS, [], threads=2):
            raise RuntimeError("boom")
    (r,) = _runs(project.uri)
    assert r.info.status == "FAILED"


def test_stage_run_bad_input_fails_before_any_run(project):
    with pytest.raises(tracking.ProvenanceError, match="not found.*missing.pt"):
        with tracking.stage_run("train", STAGE_PARAMS, ["data/missing.pt"], threads=2):
            pytest.fail("body must not run")
    with pytest.raises(tracking.ProvenanceError, match="threads"):
        with tracking.stage_run("train", STAGE_PARAMS, [], threads=0):
            pass
    with pytest.raises(tracking.ProvenanceError, match="run.threads"):   # params and threads disagree
        with tracking.stage_run("train", STAGE_PARAMS, [], threads=3):
            pass
    assert _runs(project.uri) == []


def test_retry_backs_off_on_locked_database():
    import sqlite3
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise sqlite3.OperationalError("database is locked")
        return "ok"

    assert tracking._retry(flaky) == "ok" and len(calls) == 4
    with pytest.raises(ValueError):
        tracking._retry(lambda: (_ for _ in ()).throw(ValueError("not transient")))
    with pytest.raises(sqlite3.OperationalError):
        tracking._retry(lambda: (_ for _ in ()).throw(sqlite3.OperationalError("database is locked")), tries=2)


def test_experiment_creation_race_falls_back_to_existing(tmp_path):
    from mlflow.exceptions import MlflowException

    class RacingClient:  # lost the race: not there on first look, create fails, there on second look
        looks = 0

        def get_experiment_by_name(self, name):
            self.looks += 1
            return None if self.looks == 1 else SimpleNamespace(experiment_id="7", lifecycle_stage="active")

        def create_experiment(self, name, artifact_location=None):
            raise MlflowException(f"Experiment(name={name}) already exists.",
                                  error_code="RESOURCE_ALREADY_EXISTS")

    uri = f"sqlite:///{(tmp_path / 'race.db').as_posix()}"
    assert tracking._ensure_experiment(RacingClient(), uri, "agentrl", "file:///x") == "7"


# ---------------------------------------------------------------------------------------------------------------
# concurrency: parallel DVC queue workers writing one brand-new store

def _concurrent_worker(index, barrier, root, results):
    os.chdir(root)
    from agentrl import tracking as tr
    tr._imported_agentrl_dir = lambda: Path(root) / "agentrl"
    import mlflow.tracking  # noqa: F401  (import before the barrier so the store calls really collide)
    rows = [{"step": s, "reward": s / 200 + index, "loss": 1.0 / (s + 1), "kl": 0.001 * s, "entropy": 0.5,
             "len": float(s % 7), "zero_adv": 0.25} for s in range(200)]
    barrier.wait(timeout=120)
    try:
        with tr.stage_run(f"worker{index}", {"rl": {"lr": 0.01 * (index + 1)}, "run": {"threads": 1}},
                          ["data/tasks.json"], threads=1) as run:
            n = run.log_history(rows)
        results.put((index, run.run_id, n, None))
    except Exception as exc:  # noqa: BLE001 - reported to the parent
        results.put((index, None, 0, repr(exc)))


def test_concurrent_stage_runs_share_one_new_store(tmp_path, monkeypatch):
    root = _make_project(tmp_path / "proj")
    store = tmp_path / "store" / "mlflow.db"       # does not exist yet: the workers race to create it
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store.as_posix()}")
    ctx = mp.get_context("spawn")
    barrier, results = ctx.Barrier(4), ctx.Queue()
    procs = [ctx.Process(target=_concurrent_worker, args=(i, barrier, str(root), results)) for i in range(4)]
    for p in procs:
        p.start()
    got = sorted(results.get(timeout=300) for _ in procs)
    for p in procs:
        p.join(timeout=60)
        assert p.exitcode == 0
    assert [g[3] for g in got] == [None] * 4, got
    assert [g[2] for g in got] == [1200] * 4

    runs = _runs(f"sqlite:///{store.as_posix()}")
    assert len(runs) == 4
    assert sorted(r.info.run_id for r in runs) == sorted(g[1] for g in got)
    assert {r.info.status for r in runs} == {"FINISHED"}
    assert sorted(r.info.run_name for r in runs) == [f"worker{i}" for i in range(4)]
    client = _client(f"sqlite:///{store.as_posix()}")
    for r in runs:
        assert set(r.data.metrics) == {"reward", "loss", "kl", "entropy", "len", "zero_adv"}
        for key in r.data.metrics:
            assert sorted(m.step for m in client.get_metric_history(r.info.run_id, key)) == list(range(200))
    assert len({r.info.experiment_id for r in runs}) == 1


# ---------------------------------------------------------------------------------------------------------------
# audit

def _write_report(project, value=0.625):
    with tracking.stage_run("test", STAGE_PARAMS, ["data/tasks.json"], threads=2) as run:
        run.log_metrics({"chosen.pass_rate": value})
    report = {"checkpoints": [{"step": s, "pass_rate": 0.1 * s} for s in range(4)],
              "chosen": {"pass_rate": value}, "provenance": run.provenance}
    (project.root / "reports").mkdir(exist_ok=True)
    (project.root / "reports" / "test.json").write_text(json.dumps(report, indent=2))
    return run


def test_audit_current_then_stale(project):
    run = _write_report(project)
    res = tracking.audit("reports/test.json:checkpoints.2.pass_rate")
    assert res["value"] == pytest.approx(0.2)
    assert res["status"] == "current" and res["reasons"] == []
    assert res["run"]["exists"] and res["run"]["run_id"] == run.run_id
    assert res["run"]["params"]["rl.lr"] == "0.01" and res["run"]["tags"]["fingerprint"] == run.fingerprint
    text = tracking.format_audit(res)
    for needle in (run.run_id, run.fingerprint, "agentrl", project.uri, "rl.lr = 0.01", "threads      : 2",
                   run.provenance["code_hash"], "data/tasks.json", "status       : current"):
        assert needle in text, needle

    # a param edit in params.yaml makes it stale, naming the key
    params = yaml.safe_load((project.root / "params.yaml").read_text())
    params["rl"]["lr"] = 0.05
    (project.root / "params.yaml").write_text(yaml.safe_dump(params))
    res = tracking.audit("reports/test.json:chosen.pass_rate")
    assert res["status"] == "stale"
    assert [c["key"] for c in res["changes"]["params"]] == ["rl.lr"]
    assert any("rl.lr" in r and "0.05" in r for r in res["reasons"])
    assert "STALE" in tracking.format_audit(res) and "rl.lr" in tracking.format_audit(res)

    # restore the param; now change the input file
    (project.root / "params.yaml").write_text(yaml.safe_dump(PARAMS))
    assert tracking.audit("reports/test.json:chosen.pass_rate")["status"] == "current"
    (project.root / "data" / "tasks.json").write_text('{"tasks": []}\n')
    res = tracking.audit("reports/test.json:chosen.pass_rate")
    assert res["status"] == "stale"
    assert [c["path"] for c in res["changes"]["inputs"]] == ["data/tasks.json"]
    assert any("data/tasks.json" in r for r in res["reasons"])
    (project.root / "data" / "tasks.json").unlink()
    res = tracking.audit("reports/test.json:chosen.pass_rate")
    assert res["changes"]["inputs"][0]["status"] == "missing"

    # code change
    (project.root / "data" / "tasks.json").write_text('{"tasks": [1, 2, 3]}\n')
    assert tracking.audit("reports/test.json:chosen.pass_rate")["status"] == "current"
    (project.root / "stages" / "train.py").write_text("print('changed')\n")
    res = tracking.audit("reports/test.json:chosen.pass_rate")
    assert res["status"] == "stale" and any("code" in r for r in res["reasons"])


def test_audit_thread_count_change_is_stale(project):
    _write_report(project)
    params = yaml.safe_load((project.root / "params.yaml").read_text())
    params["run"]["threads"] = 1
    (project.root / "params.yaml").write_text(yaml.safe_dump(params))
    res = tracking.audit("reports/test.json:chosen.pass_rate")
    assert res["status"] == "stale" and any("run.threads" in r for r in res["reasons"])


def test_audit_clear_errors(project):
    _write_report(project)
    with pytest.raises(tracking.AuditError, match="key 'pass_rat' not found at 'chosen'.*pass_rate"):
        tracking.audit("reports/test.json:chosen.pass_rat")
    with pytest.raises(tracking.AuditError, match="no index '9'.*0..3"):
        tracking.audit("reports/test.json:checkpoints.9.pass_rate")
    with pytest.raises(tracking.AuditError, match="no such file"):
        tracking.audit("reports/nope.json:a")
    with pytest.raises(tracking.AuditError, match="dotted.path"):
        tracking.audit("reports/test.json")
    (project.root / "reports" / "bare.json").write_text('{"a": {"b": 1}}')
    with pytest.raises(tracking.AuditError, match="provenance"):
        tracking.audit("reports/bare.json:a.b")


def test_audit_tampered_block_and_missing_run(project, tmp_path, monkeypatch):
    _write_report(project)
    path = project.root / "reports" / "test.json"
    data = json.loads(path.read_text())
    data["provenance"]["params"]["rl.lr"] = 0.05            # edited by hand, and params.yaml agrees
    path.write_text(json.dumps(data))
    params = yaml.safe_load((project.root / "params.yaml").read_text())
    params["rl"]["lr"] = 0.05
    (project.root / "params.yaml").write_text(yaml.safe_dump(params))
    res = tracking.audit("reports/test.json:chosen.pass_rate")
    assert res["fingerprint_ok"] is False and res["status"] == "stale"

    # a run that is in no store is reported, and auditing never creates a store
    data["provenance"]["tracking_uri"] = f"sqlite:///{(tmp_path / 'gone' / 'mlflow.db').as_posix()}"
    path.write_text(json.dumps(data))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{(tmp_path / 'absent.db').as_posix()}")
    res = tracking.audit("reports/test.json:chosen.pass_rate")
    assert res["run"]["exists"] is False and "NOT FOUND" in tracking.format_audit(res)
    assert not (tmp_path / "absent.db").exists() and not (tmp_path / "gone").exists()


def test_extract_handles_indices_and_dotted_keys():
    data = {"a": [{"b": 1}, {"rl.lr": 0.5}], "x": {"y.z": {"w": 3}}}
    assert tracking.extract(data, "a.0.b") == 1
    assert tracking.extract(data, "a.1.rl.lr") == 0.5
    assert tracking.extract(data, "x.y.z.w") == 3
    assert tracking.extract(data, "a.-1.rl.lr") == 0.5
    with pytest.raises(tracking.AuditError, match="cannot look up 'c'"):
        tracking.extract(data, "a.0.b.c", "f.json")


def test_ensure_store_is_idempotent(tmp_path, monkeypatch, store_template):
    store = tmp_path / "s" / "mlflow.db"
    store.parent.mkdir()
    shutil.copy(store_template, store)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{store.as_posix()}")
    uri = tracking.ensure_store(tmp_path)
    assert uri == f"sqlite:///{store.as_posix()}"
    assert tracking.ensure_store(tmp_path) == uri
    exps = [e for e in _client(uri).search_experiments() if e.name == "agentrl"]
    assert len(exps) == 1 and exps[0].artifact_location == (store.parent / "mlartifacts").as_uri()
