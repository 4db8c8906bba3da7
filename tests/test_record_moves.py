"""A record that survives a move: the store records `mlflow-artifacts:/` as the experiment's artifact location (no
path into the checkout), the files live in `mlartifacts/` beside the store, and `mlflow ui` started in a moved
checkout lists a run's artifacts."""
from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow   # a stage, then an MLflow server, in subprocesses

STAGE = """
import sys
sys.path.insert(0, REPO)
from pathlib import Path
from agentrl.pipeline.stage import run_stage
def body(ctx):
    Path("reports").mkdir(exist_ok=True)
    Path("reports/probe.json").write_text('{"x": 1}\\n')
    ctx.run.log_artifact("reports/probe.json")
    print(ctx.run.run_id)
run_stage("probe", ["select"], ["data/in.json"], body, numeric=False)
"""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_artifacts_are_found_after_the_checkout_moves(tmp_path, store_template):
    from test_boundary import _make_probe_project
    root = _make_probe_project(tmp_path)
    shutil.copy(store_template, root / "mlflow.db")   # the default store: sqlite:///mlflow.db at the root
    env = {"PATH": str(Path(sys.executable).parent) + ":/usr/bin:/bin", "DVC_ROOT": str(root), "HOME": str(tmp_path)}
    (root / "stage.py").write_text(STAGE.replace("REPO", repr(str(REPO))))
    out = subprocess.run([sys.executable, "stage.py"], cwd=root, env=env, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    run_id = out.stdout.split()[-1]
    moved = tmp_path / "elsewhere" / "checkout"
    moved.parent.mkdir()
    shutil.move(root, moved)
    port = _free_port()
    server = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "ui", "--backend-store-uri",
                               "sqlite:///mlflow.db", "--port", str(port)], cwd=moved, env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline, listed = time.time() + 120, None
        while time.time() < deadline and listed is None:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/artifacts/list?"
                                            f"run_id={run_id}&run_uuid={run_id}", timeout=5) as r:
                    listed = json.loads(r.read())
            except OSError:
                time.sleep(1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ajax-api/2.0/mlflow/runs/get?run_id={run_id}",
                                    timeout=5) as r:
            info = json.loads(r.read())["run"]["info"]
    finally:
        server.terminate()
        server.wait(timeout=30)
    assert listed is not None and {f["path"] for f in listed["files"]} == {"probe.json", "provenance"}
    assert info["artifact_uri"] == f"mlflow-artifacts:/{run_id}/artifacts"
