"""Tracking: provenance by pure hashing, the MLflow store (resolution, probe, retries, concurrency), the run
lifecycle (one run per stage run, never left RUNNING, a provenance record beside the outputs), and audit agreeing
with `dvc status`.

Every test points MLFLOW_TRACKING_URI at a sqlite file under tmp_path, so the project's real store is never touched.
A migrated empty store is built once per session and copied per test (first-time migration takes seconds).
"""
from __future__ import annotations

import json
import multiprocessing as mp
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from agentrl.tracking import audit as audit_mod
from agentrl.tracking import provenance as prov
from agentrl.tracking import run as runs
from agentrl.tracking import store

PARAMS = {"rl": {"lr": 0.01, "steps": 60, "group_size": 8}, "run": {"threads": 2, "seed": 0}}
REPO = Path(__file__).resolve().parents[1]


def _client(uri):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def _make_project(root: Path) -> Path:
    """A minimal project: one stage in dvc.yaml whose code deps are two .py files, an input, params."""
    (root / "agentrl").mkdir(parents=True)
    (root / "agentrl" / "__init__.py").write_text("X = 1\n")
    (root / "stages").mkdir()
    (root / "stages" / "train.py").write_text("print('train')\n")
    (root / "data").mkdir()
    (root / "data" / "tasks.json").write_text('{"tasks": [1, 2, 3]}\n')
    (root / "params.yaml").write_text(yaml.safe_dump(PARAMS, sort_keys=False))
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"train": {
        "cmd": "python -m stages.train", "deps": ["stages/train.py", "agentrl/__init__.py", "data/tasks.json"],
        "params": ["rl", "run"], "outs": ["out.txt"]}}}))
    return root


@pytest.fixture
def project(tmp_path, monkeypatch, store_template):
    """A temp project with its own store; cwd = project."""
    root = _make_project(tmp_path / "proj")
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()
    shutil.copy(store_template, db)
    monkeypatch.chdir(root)
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db.as_posix()}")
    return SimpleNamespace(root=root, store=db, uri=f"sqlite:///{db.as_posix()}")


def _runs(uri, experiment="agentrl"):
    client = _client(uri)
    exp = client.get_experiment_by_name(experiment)
    return [] if exp is None else client.search_runs([exp.experiment_id], max_results=1000)


# ---------------------------------------------------------------------------------------------------------------
# import, store resolution, probe

def test_import_is_cheap_and_disables_telemetry():
    code = ("import os, sys; os.environ.pop('MLFLOW_DISABLE_TELEMETRY', None); os.environ.pop('DO_NOT_TRACK', None);"
            "import agentrl.tracking.run, agentrl.tracking.audit; assert 'mlflow' not in sys.modules;"
            "print(os.environ['MLFLOW_DISABLE_TELEMETRY'], os.environ['DO_NOT_TRACK'])")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.split() == ["true", "true"]


def test_default_store_is_relative_to_the_project_root(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    (root / "sub").mkdir(parents=True)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.chdir(elsewhere)
    assert store.configured_uri() == "sqlite:///mlflow.db"          # what provenance records: no absolute path
    assert prov.project_root() == root.resolve()
    assert store.tracking_uri() == f"sqlite:///{(root.resolve() / 'mlflow.db').as_posix()}"
    assert store.artifact_location() == "mlflow-artifacts:/"   # resolved where it is read: survives a move
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "sqlite:///other.db")    # relative: anchored at the root
    assert store.tracking_uri() == f"sqlite:///{(root.resolve() / 'other.db').as_posix()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000")
    assert store.tracking_uri() == "http://127.0.0.1:5000"
    assert store.artifact_location() == (root.resolve() / "mlartifacts").as_uri()


def test_root_inside_dvc_experiment_tempdir_maps_to_main_repo(tmp_path, monkeypatch):
    root = tmp_path / "repo"
    temp_copy = root / ".dvc" / "tmp" / "exps" / "tmpab12cd"
    (temp_copy / "stages").mkdir(parents=True)
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    monkeypatch.setenv("DVC_ROOT", str(temp_copy))
    assert prov.project_root() == root.resolve()
    monkeypatch.delenv("DVC_ROOT")
    monkeypatch.chdir(temp_copy / "stages")
    assert prov.project_root() == root.resolve()


def test_probe_fails_fast_with_one_line_naming_the_store(tmp_path):
    t0 = time.time()
    with pytest.raises(store.StoreError) as err:
        store.probe("http://127.0.0.1:9")
    assert time.time() - t0 < 10 and "http://127.0.0.1:9" in str(err.value) and "\n" not in str(err.value)
    bad = tmp_path / "mlflow.db"
    bad.write_bytes(b"this is not a database" * 100)
    with pytest.raises(store.StoreError, match=str(bad)):
        store.probe(f"sqlite:///{bad.as_posix()}")
    store.probe(f"sqlite:///{(tmp_path / 'absent.db').as_posix()}")   # a store that does not exist yet is fine


# ---------------------------------------------------------------------------------------------------------------
# provenance: pure hashing

def test_file_hash_file_dir_and_missing(tmp_path):
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "a.txt").write_text("a")
    (tmp_path / "f.txt").write_text("a")
    assert prov.file_hash(tmp_path / "f.txt") == prov.file_hash(tmp_path / "d" / "a.txt")
    before = prov.file_hash(tmp_path / "d")
    (tmp_path / "d" / "b.txt").write_text("b")
    assert prov.file_hash(tmp_path / "d") != before
    with pytest.raises(prov.ProvenanceError, match="not found"):
        prov.file_hash(tmp_path / "missing")


def test_stage_code_is_what_dvc_yaml_lists(project):
    assert prov.stage_code_files("train") == ["agentrl/__init__.py", "stages/train.py"]
    assert prov.stage_code_files("train@seed-3") == ["agentrl/__init__.py", "stages/train.py"]   # matrix instance
    h = prov.code_hash(["agentrl/__init__.py", "stages/train.py"])
    (project.root / "agentrl" / "unrelated.py").write_text("Y = 2\n")     # not in the stage's closure
    assert prov.code_hash(prov.stage_code_files("train")) == h
    (project.root / "agentrl" / "__init__.py").write_text("X = 2\n")
    assert prov.code_hash(prov.stage_code_files("train")) != h
    with pytest.raises(prov.ProvenanceError, match="stage 'nope'"):
        prov.stage_code_files("nope")


def test_fingerprint_depends_only_on_what_made_the_output(project):
    a = prov.build_provenance("train", PARAMS, ["data/tasks.json"], 2)
    assert a == prov.build_provenance("train", PARAMS, ["data/tasks.json"], 2)
    assert set(a) == {"stage", "params", "threads", "versions", "code_files", "code_hash", "inputs", "fingerprint"}
    assert str(project.root) not in json.dumps(a)                       # no absolute path
    subprocess.run(["git", "init", "-q"], cwd=project.root, check=True)   # a commit does not change it
    assert prov.build_provenance("train", PARAMS, ["data/tasks.json"], 2)["fingerprint"] == a["fingerprint"]
    changed = {"rl": {**PARAMS["rl"], "lr": 0.02}, "run": PARAMS["run"]}
    assert prov.build_provenance("train", changed, ["data/tasks.json"], 2)["fingerprint"] != a["fingerprint"]
    assert prov.build_provenance("train", PARAMS, ["data/tasks.json"], 1)["fingerprint"] != a["fingerprint"]
    (project.root / "data" / "tasks.json").write_text('{"tasks": [1, 2]}\n')
    assert prov.build_provenance("train", PARAMS, ["data/tasks.json"], 2)["fingerprint"] != a["fingerprint"]


# ---------------------------------------------------------------------------------------------------------------
# the run lifecycle

def test_stage_run_logs_one_run_and_writes_its_provenance_record(project, monkeypatch):
    monkeypatch.setenv("AGENTRL_PIPELINE_RUN", "pipe-1")
    with runs.stage_run("train", PARAMS, ["data/tasks.json"], 2) as run:
        run.log_metrics({"reward": 0.5})
        run.log_history([{"step": 0, "reward": 0.1}, {"step": 1, "reward": 0.2}])
        (project.root / "out.txt").write_text("x")
        run.log_artifact(project.root / "out.txt")
    (r,) = _runs(project.uri)
    assert r.info.status == "FINISHED" and r.info.run_name == "train"
    tags = r.data.tags
    assert tags["stage"] == "train" and tags["pipeline_run"] == "pipe-1" and tags["fingerprint"] == run.fingerprint
    assert r.data.params["rl.lr"] == "0.01" and r.data.params["run.threads"] == "2"
    record = json.loads((project.root / "reports/provenance/train.json").read_text())
    assert record["mlflow"]["run_id"] == r.info.run_id and record["fingerprint"] == run.fingerprint
    assert record["mlflow"]["tracking_uri"] == project.uri and record["wall_seconds"] >= 0
    where = store.artifact_dir(r.info.artifact_uri, project.uri)
    assert r.info.artifact_uri == f"mlflow-artifacts:/{r.info.run_id}/artifacts"   # no absolute path in the store
    assert where == project.store.parent / "mlartifacts" / r.info.run_id / "artifacts"
    assert {p.name for p in where.iterdir()} >= {"out.txt", "provenance"}


def test_failure_and_interrupt_close_the_run(project):
    with pytest.raises(RuntimeError):
        with runs.stage_run("train", PARAMS, ["data/tasks.json"], 2):
            raise RuntimeError("boom")
    with pytest.raises(KeyboardInterrupt):
        with runs.stage_run("train", PARAMS, ["data/tasks.json"], 2):
            raise KeyboardInterrupt
    assert sorted(r.info.status for r in _runs(project.uri)) == ["FAILED", "KILLED"]
    assert not (project.root / "reports/provenance/train.json").exists()   # only a finished run writes a record


def test_missing_input_fails_before_any_run(project):
    with pytest.raises(prov.ProvenanceError, match="not found"):
        with runs.stage_run("train", PARAMS, ["data/nope.json"], 2):
            pass
    assert _runs(project.uri) == []


SLEEPER = """
import sys, time
sys.path.insert(0, REPO)   # the project's own agentrl/ (the temp project has a stand-in of that name)
from agentrl.tracking.run import stage_run
with stage_run("train", {"run": {"threads": 1}}, ["data/tasks.json"], 1):
    print("started", flush=True)
    time.sleep(60)
"""


def _start_sleeper(project):
    p = subprocess.Popen([sys.executable, "-c", SLEEPER.replace("REPO", repr(str(REPO)))], cwd=project.root,
                         stdout=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    return p


def _watchers(p) -> list[int]:
    """The watcher processes a stage process started (agentrl.tracking.watch): its children."""
    text = Path(f"/proc/{p.pid}/task/{p.pid}/children").read_text()
    return [int(pid) for pid in text.split()]


def _wait_status(uri, n: int, seconds: float = 60) -> list[str]:
    """The runs' statuses once none is RUNNING (or after `seconds`)."""
    deadline = time.time() + seconds
    while True:
        statuses = sorted(r.info.status for r in _runs(uri))
        if len(statuses) == n and "RUNNING" not in statuses or time.time() > deadline:
            return statuses
        time.sleep(0.3)


@pytest.mark.slow   # stage subprocesses, killed
def test_sigterm_marks_killed_and_sigkill_is_closed_by_the_watcher_or_the_next_run(project):
    p = _start_sleeper(project)
    p.send_signal(signal.SIGTERM)
    p.wait(timeout=30)
    assert [r.info.status for r in _runs(project.uri)] == ["KILLED"]
    p = _start_sleeper(project)
    p.kill()   # SIGKILL: the stage closes nothing; its watcher does
    p.wait(timeout=30)
    assert _wait_status(project.uri, 2) == ["KILLED", "KILLED"]
    killed = [r for r in _runs(project.uri) if "watcher" in r.data.tags.get("killed_reason", "")]
    assert len(killed) == 1 and killed[0].data.tags["mlflow.note.content"] == killed[0].data.tags["killed_reason"]
    p = _start_sleeper(project)
    for pid in _watchers(p):   # the watcher killed too (a machine going down): the next run closes it
        os.kill(pid, signal.SIGKILL)
    p.kill()
    p.wait(timeout=30)
    time.sleep(1)
    assert sorted(r.info.status for r in _runs(project.uri)) == ["KILLED", "KILLED", "RUNNING"]
    with runs.stage_run("train", {"run": {"threads": 1}}, ["data/tasks.json"], 1) as run:
        assert len(run.previous_runs) == 1
    statuses = sorted(r.info.status for r in _runs(project.uri))
    assert statuses == ["FINISHED", "KILLED", "KILLED", "KILLED"]


CRASHER = """
import os, signal, sys
sys.path.insert(0, REPO)
from agentrl.core.boundary import guard
from agentrl.tracking.run import stage_run

def crash():
    with stage_run("ablate@kl-0", {"run": {"threads": 1}}, ["data/tasks.json"], 1):
        if KILL_WATCHER:   # a crash that takes the watcher down too
            me = os.getpid()
            for pid in open(f"/proc/{me}/task/{me}/children").read().split():
                os.kill(int(pid), signal.SIGKILL)
        os.kill(os.getpid(), signal.SIGSEGV)   # a fatal signal: no Python code runs after it

guard("ablate@kl-0", crash)
"""


def _crash(project, kill_watcher: bool):
    graph = yaml.safe_load((project.root / "dvc.yaml").read_text())
    graph["stages"]["ablate"] = {"matrix": {"arm": ["kl"], "seed": [0]}, "cmd": "python -m stages.ablate",
                                 "deps": ["agentrl/__init__.py"], "params": ["run"], "outs": ["ablate.txt"]}
    (project.root / "dvc.yaml").write_text(yaml.safe_dump(graph))    # a second stage, the one that crashes
    script = CRASHER.replace("REPO", repr(str(REPO))).replace("KILL_WATCHER", repr(kill_watcher))
    p = subprocess.run([sys.executable, "-c", script], cwd=project.root, capture_output=True, text=True, timeout=120)
    assert p.returncode == -signal.SIGSEGV
    assert "Fatal Python error: Segmentation fault" in p.stderr   # faulthandler: the crash is named, not silent


@pytest.mark.slow   # a stage subprocess that dies of SIGSEGV
def test_a_crashed_stage_is_closed_by_its_watcher(project):
    _crash(project, kill_watcher=False)
    assert _wait_status(project.uri, 1) == ["KILLED"]
    (run,) = _runs(project.uri)
    assert run.data.tags["killed_reason"].startswith("the stage's process ended without closing its run")


@pytest.mark.slow   # a stage subprocess that dies of SIGSEGV
def test_a_crashed_stage_is_closed_by_the_next_run_of_any_stage(project):
    _crash(project, kill_watcher=True)
    time.sleep(1)
    assert [r.info.status for r in _runs(project.uri)] == ["RUNNING"]
    with runs.stage_run("train", {"run": {"threads": 1}}, ["data/tasks.json"], 1) as run:
        assert run.previous_runs == []   # another stage's orphan is closed, not taken over
    by_stage = {r.data.tags["stage.instance"]: r for r in _runs(project.uri)}
    assert by_stage["ablate@kl-0"].info.status == "KILLED"
    assert by_stage["ablate@kl-0"].data.tags["killed_reason"] == "process gone (found by a later run of train)"
    assert by_stage["train"].info.status == "FINISHED"


# ---------------------------------------------------------------------------------------------------------------
# the store under concurrency

def test_retry_backs_off_on_locked_database():
    import sqlite3
    calls = []

    def flaky():
        calls.append(1)
        if len(calls) < 4:
            raise sqlite3.OperationalError("database is locked")
        return "ok"

    assert store._retry(flaky) == "ok" and len(calls) == 4
    with pytest.raises(ValueError):
        store._retry(lambda: (_ for _ in ()).throw(ValueError("not transient")))
    with pytest.raises(sqlite3.OperationalError):
        store._retry(lambda: (_ for _ in ()).throw(sqlite3.OperationalError("database is locked")), tries=2)


def test_experiment_creation_race_falls_back_to_existing(tmp_path):
    from mlflow.exceptions import MlflowException

    class RacingClient:  # lost the race: not there on first look, create fails, there on second look
        looks = 0

        def get_experiment_by_name(self, name):
            self.looks += 1
            return None if self.looks == 1 else SimpleNamespace(experiment_id="7", lifecycle_stage="active")

        def create_experiment(self, name, artifact_location=None):
            raise MlflowException(f"Experiment(name={name}) already exists.", error_code="RESOURCE_ALREADY_EXISTS")

    uri = f"sqlite:///{(tmp_path / 'race.db').as_posix()}"
    assert store._ensure_experiment(RacingClient(), uri, "agentrl", "file:///x") == "7"


def _concurrent_worker(index, barrier, root, results):
    os.chdir(root)
    import mlflow.tracking  # noqa: F401  (import before the barrier so the store calls really collide)

    from agentrl.tracking.run import stage_run
    rows = [{"step": s, "reward": s / 200 + index, "loss": 1.0 / (s + 1)} for s in range(200)]
    barrier.wait(timeout=120)
    try:
        with stage_run("train", {"rl": {"lr": 0.01 * (index + 1)}, "run": {"threads": 1}}, ["data/tasks.json"],
                       threads=1) as run:
            n = run.log_history(rows)
        results.put((index, run.run_id, n, None))
    except Exception as exc:
        results.put((index, None, 0, repr(exc)))


@pytest.mark.slow
def test_concurrent_stage_runs_share_one_new_store(tmp_path, monkeypatch):
    root = _make_project(tmp_path / "proj")
    db = tmp_path / "store" / "mlflow.db"       # does not exist yet: the workers race to create it
    db.parent.mkdir()
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("AGENTRL_PIPELINE_RUN", "concurrent")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db.as_posix()}")
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
    assert [g[2] for g in got] == [400] * 4
    found = _runs(f"sqlite:///{db.as_posix()}")
    assert sorted(r.info.run_id for r in found) == sorted(g[1] for g in got)
    assert {r.info.status for r in found} == {"FINISHED"}


def test_ensure_store_is_idempotent(tmp_path, monkeypatch, store_template):
    db = tmp_path / "s" / "mlflow.db"
    db.parent.mkdir()
    shutil.copy(store_template, db)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db.as_posix()}")
    uri = store.ensure_store(tmp_path)
    assert uri == f"sqlite:///{db.as_posix()}" and store.ensure_store(tmp_path) == uri
    exps = [e for e in _client(uri).search_experiments() if e.name == "agentrl"]
    assert len(exps) == 1 and exps[0].artifact_location == "mlflow-artifacts:/"


# ---------------------------------------------------------------------------------------------------------------
# audit

def test_extract_handles_indices_and_dotted_keys():
    data = {"a": [{"b": 1}, {"rl.lr": 0.5}], "x": {"y.z": {"w": 3}}}
    assert audit_mod.extract(data, "a.0.b") == 1
    assert audit_mod.extract(data, "a.1.rl.lr") == 0.5
    assert audit_mod.extract(data, "x.y.z.w") == 3
    with pytest.raises(audit_mod.AuditError, match="cannot look up 'c'"):
        audit_mod.extract(data, "a.0.b.c", "f.json")
    for index in ("0_1", " 1", "\u0663", "-1", "+1"):   # int() reads all of these; an index is ASCII digits
        with pytest.raises(audit_mod.AuditError, match=re.escape(f"no index '{index}' at 'a'")):
            audit_mod.extract(data, f"a.{index}.b", "f.json")


def test_audit_clear_errors(project):
    for spec, fragment in (("nocolon", "<file>.json:<dotted.path>"), ("reports/missing.json:a", "no such file")):
        with pytest.raises(audit_mod.AuditError, match=fragment):
            audit_mod.audit(spec, project.root)
