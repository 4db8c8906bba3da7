"""No MLflow run stays RUNNING after a signal at any moment: a signal while the run is being created (held there by
the $AGENTRL_RUN_DELAY hook) ends the stage with the signal's code and the run KILLED with the stage's line; a run
whose process is gone is closed by the next opener of the store, `audit` included."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.tracking import orphans
from agentrl.tracking import run as runs

REPO = Path(__file__).resolve().parents[1]
ENDING = {signal.SIGHUP: (129, "terminated (SIGHUP: the terminal closed)"),
          signal.SIGTERM: (143, "terminated (SIGTERM)"), signal.SIGINT: (130, "interrupted (SIGINT)")}
STAGE = """
import sys
sys.path.insert(0, REPO)
from agentrl.pipeline.stage import run_stage
run_stage("probe", ["select"], ["data/in.json"], lambda ctx: print("body ran", flush=True), numeric=False)
"""


def _client(uri):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def _runs(uri):
    client = _client(uri)
    exp = client.get_experiment_by_name("agentrl")
    return [] if exp is None else client.search_runs([exp.experiment_id])


@pytest.fixture
def probe_project(tmp_path, store_template):
    from test_boundary import _make_probe_project
    root = _make_probe_project(tmp_path)
    shutil.copy(store_template, tmp_path / "mlflow.db")
    (root / "stage.py").write_text(STAGE.replace("REPO", repr(str(REPO))))
    return root, f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}"


def signal_at(root: Path, uri: str, phase: str, sig: int, hold: float = 3.0) -> tuple[int, list[str]]:
    """Run the probe stage with run creation held at `phase`, send `sig` once it says it is held there; (exit code,
    stderr lines)."""
    env = {**os.environ, "MLFLOW_TRACKING_URI": uri, "DVC_ROOT": str(root), runs.DELAY_ENV: f"{phase}:{hold}"}
    env.pop("AGENTRL_DEBUG", None)
    p = subprocess.Popen([sys.executable, "stage.py"], cwd=root, env=env, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    held = p.stderr.readline()
    assert f"held {hold} s at {phase}" in held, held + p.stderr.read()
    p.send_signal(sig)
    out, err = p.communicate(timeout=120)
    assert "body ran" not in out
    return p.returncode, [held.strip()] + err.strip().splitlines()


@pytest.mark.slow   # a stage subprocess each (MLflow's import)
@pytest.mark.parametrize("sig", sorted(ENDING), ids=lambda s: signal.Signals(s).name)
def test_a_signal_between_creating_the_run_and_its_guard_closes_it_killed(probe_project, sig):
    """The window of the issue: the run exists, the code that closes it is not yet in charge. The signal waits for
    it, then ends the stage with its code; the run is KILLED and says why, with no params logged after it."""
    root, uri = probe_project
    code, lines = signal_at(root, uri, "created", sig)
    want_code, reason = ENDING[sig]
    assert code == want_code and lines[-1] == f"error: probe: {reason}", lines
    (run,) = _runs(uri)
    assert run.info.status == "KILLED" and run.data.tags["killed_reason"] == f"probe: {reason}"
    assert run.data.tags["mlflow.note.content"] == f"probe: {reason}"


@pytest.mark.slow
def test_a_signal_before_the_run_exists_leaves_no_run(probe_project):
    root, uri = probe_project
    code, lines = signal_at(root, uri, "probe", signal.SIGTERM, hold=2.0)
    assert code == 143 and lines[-1] == "error: probe: terminated (SIGTERM)"
    assert _runs(uri) == []


def _orphan(uri: str) -> str:
    """A RUNNING run whose process is gone (a pid that cannot exist on this host)."""
    client = _client(uri)
    exp = client.get_experiment_by_name("agentrl") or client.get_experiment(client.create_experiment("agentrl"))
    run = client.create_run(exp.experiment_id, run_name="test",
                            tags={"process": f"{socket.gethostname()}:4194304999:1", "stage.instance": "test"})
    return run.info.run_id


def test_audit_closes_a_run_whose_process_is_gone(tmp_path, store_template, monkeypatch):
    from agentrl.tracking import audit
    db = tmp_path / "mlflow.db"
    shutil.copy(store_template, db)
    uri = f"sqlite:///{db.as_posix()}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    orphan = _orphan(uri)
    alive = _client(uri).create_run(_client(uri).get_experiment_by_name("agentrl").experiment_id,
                                    tags={"process": orphans.process_tag()}).info.run_id   # this process: alive
    assert audit.fetch_run(orphan)["status"] == "KILLED"
    got = _client(uri).get_run(orphan)
    assert got.data.tags["killed_reason"] == "process gone (found by audit)"
    assert _client(uri).get_run(alive).info.status == "RUNNING"


def test_closing_orphans_on_a_store_this_process_cannot_write_says_nothing(tmp_path, store_template, capsys):
    db = tmp_path / "mlflow.db"
    shutil.copy(store_template, db)
    uri = f"sqlite:///{db.as_posix()}"
    orphan = _orphan(uri)

    class ReadOnly:   # a client whose writes the store refuses
        def __init__(self, client):
            self.client = client

        def __getattr__(self, name):
            return getattr(self.client, name)

        def set_tag(self, *args):
            raise PermissionError("attempt to write a readonly database")
    orphans.close_all_orphans(ReadOnly(_client(uri)), "audit")
    assert _client(uri).get_run(orphan).info.status == "RUNNING" and capsys.readouterr().err == ""


def test_the_watcher_stands_down_when_the_run_is_closed(tmp_path, store_template, monkeypatch):
    """A stage run that ends normally tells its watcher, which ends at once and leaves the run as it was."""
    from test_tracking import _make_project
    root = _make_project(tmp_path / "proj")
    db = tmp_path / "mlflow.db"
    shutil.copy(store_template, db)
    monkeypatch.chdir(root)
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db.as_posix()}")
    started = []
    real = runs.watch.start
    monkeypatch.setattr(runs.watch, "start", lambda *a: started.append(real(*a)) or started[-1])
    t0 = time.time()
    with runs.stage_run("train", {"run": {"threads": 1}}, ["data/tasks.json"], 1):
        assert started[0].proc.poll() is None   # watching
    assert started[0].proc.poll() == 0 and time.time() - t0 < 30
    (run,) = _runs(f"sqlite:///{db.as_posix()}")
    assert run.info.status == "FINISHED" and "killed_reason" not in run.data.tags


def test_a_signal_inside_a_held_block_acts_when_the_block_ends_whichever_thread_the_system_picks(capsys):
    """A thread started before the block leaves SIGTERM unblocked, so the system hands the signal to it; Python
    still runs the handler in the main thread, inside the block: the handler must only note it."""
    import threading

    from agentrl.core import boundary
    stop = threading.Event()
    other = threading.Thread(target=stop.wait, daemon=True)   # a library's thread, started first
    other.start()
    reached = []

    def held():
        with boundary.signals_blocked():
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.3)   # the handler runs here, in the main thread
            reached.append("end of block")
        reached.append("after the block")
    try:
        assert boundary.guard("probe", held) == 143
    finally:
        stop.set()
    assert reached == ["end of block"]
    assert capsys.readouterr().err.strip() == "error: probe: terminated (SIGTERM)"
