"""`python -m agentrl sweep`: matrix instances as Ray tasks, recorded by DVC as if `dvc repro` ran them.

Fast tier: bad input (one line, exit code 2, within 10 s), Ray imported only by the sweep driver, a failed run
recorded in deferred mode, outputs installed whole. Slow tier: an empty matrix; a deferred MLflow run replayed into
a store; and on a tiny pipeline (a small model, one training step; upstream stages built once by `dvc repro`): a
two-node local cluster (head + one worker, one CPU each) sweeps the ablation matrix (dvc status clean, a second
sweep computes nothing, the bytes of `dvc repro`, one MLflow run per instance); a worker node killed by pid
mid-sweep costs only its instance; the cluster's processes are stopped by pid; a local Ray interrupted by SIGINT
leaves no process and nothing half-recorded in dvc.lock.
"""
from __future__ import annotations

import ast
import ctypes
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
INSTANCES = ["ablate@default-0", "ablate@default-1", "ablate@public-0", "ablate@public-1"]
# small enough that the upstream stages take about a minute, large enough that the preflight gate passes
TINY = {
    "run": {"threads": 1},
    "model": {"d_model": 32, "n_layer": 1, "n_head": 2, "d_ff": 64},
    "base": {"demos_per_task": 4, "steps": 60, "teach_steps": 20, "batch_size": 16, "lr": 0.01},
    "sft": {"steps": 1, "describe_per_task": 8},
    "preflight": {"bugs": []},
    "ablate": {"arms": {"default": {}, "public": {"rl.reward": "public"}}, "seeds": [0, 1], "steps": 1,
               "eval_per_task": 1, "n_boot": 200},
}


def env(**extra) -> dict:
    out = dict(os.environ)
    out["PATH"] = f"{BIN}:{out['PATH']}"
    for key in ("MLFLOW_TRACKING_URI", "DVC_ROOT", "RAY_ADDRESS", "AGENTRL_TRACKING_DEFER"):
        out.pop(key, None)
    return out | extra


def run(cmd, cwd, check=True, timeout=600, **extra):
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, env=env(**extra))
    if check and out.returncode != 0:
        raise AssertionError(f"{cmd} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


def sweep(cwd, *args, check=True, **extra):
    return run([sys.executable, "-m", "agentrl", "sweep", *args], cwd, check=check, **extra)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# ---------------------------------------------------------------------------------------------------- processes

def children() -> dict[int, list[int]]:
    kids: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                stat = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
            except (OSError, IndexError):
                continue
            if stat[0] != "Z":
                kids.setdefault(int(stat[1]), []).append(int(entry))
    return kids


def descendants(*pids: int) -> set[int]:
    kids, out, stack = children(), set(), list(pids)
    while stack:
        for kid in kids.get(stack.pop(), []):
            if kid not in out:
                out.add(kid)
                stack.append(kid)
    return out


def alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def kill_all(pids, grace: float = 15.0) -> list[int]:
    """Wait up to `grace` s for `pids` to exit, then SIGKILL the rest by pid; returns those that had to be killed."""
    deadline = time.time() + grace
    while time.time() < deadline and any(alive(p) for p in pids):
        time.sleep(0.2)
    stragglers = [p for p in pids if alive(p)]
    for pid in stragglers:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    deadline = time.time() + 10    # SIGKILL is delivered at once, but a process ends when it next leaves the kernel
    while time.time() < deadline and any(alive(p) for p in stragglers):
        time.sleep(0.05)
    return stragglers


def reap() -> None:
    while True:
        try:
            if os.waitpid(-1, os.WNOHANG)[0] == 0:
                return
        except ChildProcessError:
            return


# ---------------------------------------------------------------------------------------------------- fast tier

def test_ray_is_imported_only_by_the_sweep_driver():
    importers = set()
    for path in [*(REPO / "agentrl").rglob("*.py"), *(REPO / "stages").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) else []
            if any(n == "ray" or n.startswith("ray.") for n in names):
                importers.add(path.relative_to(REPO).as_posix())
    assert importers == {"agentrl/pipeline/sweep/driver.py"}


@pytest.mark.parametrize("args,extra,fragment", [
    (["nosuch"], {}, "unknown stage 'nosuch'"),
    (["ablate_summary"], {}, "has no matrix or foreach"),
    (["ablate@default-0"], {}, "not an instance"),
    (["ablate", "--address", "127.0.0.1:{port}"], {}, "unreachable"),
    (["ablate"], {"RAY_ADDRESS": "127.0.0.1:{port}"}, "unreachable"),
    (["ablate", "--address", "nowhere"], {}, "expected host:port"),
    (["ablate", "--max-parallel", "0"], {}, "--max-parallel"),
])
def test_bad_input_is_one_line_within_ten_seconds(args, extra, fragment):
    port = str(free_port())
    args = [a.replace("{port}", port) for a in args]
    extra = {k: v.replace("{port}", port) for k, v in extra.items()}
    t0 = time.time()
    out = sweep(REPO, *args, check=False, **extra)
    assert time.time() - t0 < 10
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith("error:"), out.stderr
    assert fragment in lines[0]


@pytest.mark.slow   # seconds of DVC index / MLflow schema migrations
def test_an_empty_matrix_has_nothing_to_run():
    out = sweep(REPO, "length_pair")
    assert "no instances" in out.stdout


def _mini_project(root: Path) -> Path:
    (root / "stages").mkdir(parents=True)
    (root / "stages" / "demo.py").write_text("print('demo')\n")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"demo": {
        "cmd": "python -m stages.demo", "deps": ["stages/demo.py"], "outs": ["out.txt"]}}}))
    return root


@pytest.mark.slow   # seconds of DVC index / MLflow schema migrations
def test_a_deferred_run_is_replayed_into_the_store(tmp_path, monkeypatch):
    """A worker records its run (no store reachable); the driver replays it: one FINISHED run with the worker's
    params, metrics, tags and artifacts plus the sweep tag, and the provenance record naming the new run id."""
    from agentrl.tracking import deferred
    from agentrl.tracking import run as runs
    worker, driver = _mini_project(tmp_path / "worker"), _mini_project(tmp_path / "driver")
    db = tmp_path / "store" / "mlflow.db"
    db.parent.mkdir()   # a new store, where the user pointed: in a directory that exists
    monkeypatch.chdir(worker)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db.as_posix()}")
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setenv(runs.DEFER_ENV, str(tmp_path / "recorded"))
    (worker / "out.txt").write_text("result\n")
    with runs.stage_run("demo", {"rl": {"lr": 0.01}}, inputs=[], threads=1) as handle:
        handle.log_metrics({"heldout_pass": 0.5})
        handle.log_history([{"step": 0, "reward": 0.1}, {"step": 1, "reward": 0.2}])
        handle.set_tags({"ablate.arm": "default"})
        handle.log_artifact(worker / "out.txt")
    assert not db.exists(), "a deferred run touched the store"
    monkeypatch.delenv(runs.DEFER_ENV)
    run_id = deferred.replay_run(tmp_path / "recorded", {"sweep": "sweep-x"}, root=driver)
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{db.as_posix()}")
    got = client.get_run(run_id)
    assert got.info.run_name == "demo" and got.info.status == "FINISHED"
    assert got.data.params["rl.lr"] == "0.01" and got.data.params["run.threads"] == "1"
    assert got.data.metrics["heldout_pass"] == 0.5 and "wall_seconds" in got.data.metrics
    assert [m.value for m in client.get_metric_history(run_id, "reward")] == [0.1, 0.2]
    assert got.data.tags["sweep"] == "sweep-x" and got.data.tags["ablate.arm"] == "default"
    assert got.data.tags["stage.instance"] == "demo" and "workdir" not in got.data.tags
    from agentrl.tracking.store import artifact_dir
    assert {p.name for p in artifact_dir(got.info.artifact_uri, f"sqlite:///{db.as_posix()}").iterdir()} == \
        {"out.txt", "provenance"}
    record = json.loads((driver / "reports" / "provenance" / "demo.json").read_text())
    assert record["mlflow"]["run_id"] == run_id and record["fingerprint"] == got.data.tags["fingerprint"]


def test_a_failed_deferred_run_is_recorded_as_failed(tmp_path, monkeypatch):
    from agentrl.tracking import run as runs
    worker = _mini_project(tmp_path / "worker")
    monkeypatch.chdir(worker)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{(tmp_path / 'mlflow.db').as_posix()}")
    monkeypatch.delenv("DVC_ROOT", raising=False)
    monkeypatch.setenv(runs.DEFER_ENV, str(tmp_path / "recorded"))
    with pytest.raises(RuntimeError):
        with runs.stage_run("demo", {}, inputs=[], threads=1):
            raise RuntimeError("diverged")
    kept = json.loads((tmp_path / "recorded" / "run.json").read_text())
    assert kept["status"] == "FAILED" and kept["artifacts"] == []
    assert not (tmp_path / "mlflow.db").exists() and not (worker / "reports").exists()


def test_outputs_are_installed_whole(tmp_path):
    from agentrl.pipeline.sweep.driver import install_outputs
    from agentrl.pipeline.sweep.plan import Instance
    root, scratch = tmp_path / "repo", tmp_path / "repo" / ".dvc" / "tmp" / "sweep" / "s"
    (root / "data" / "ablate" / "a-0").mkdir(parents=True)
    (root / "data" / "ablate" / "a-0" / "stale.txt").write_text("old")
    (root / "data" / "ablate" / "b-0").mkdir()
    inst = Instance("ablate@a-0", "python -m stages.ablate", (), ("data/ablate/a-0", "data/a.json"), 1)
    install_outputs(root, scratch, inst, {"data/ablate/a-0/result.json": b"{}", "data/ablate/a-0/policy.pt": b"pt",
                                          "data/a.json": b"[]"})
    assert sorted(p.name for p in (root / "data" / "ablate" / "a-0").iterdir()) == ["policy.pt", "result.json"]
    assert sorted(p.name for p in (root / "data" / "ablate").iterdir()) == ["a-0", "b-0"]
    assert (root / "data" / "a.json").read_bytes() == b"[]"
    assert not [p for p in scratch.rglob("*") if p.is_file()]


def test_a_killed_workers_scratch_is_reaped_and_a_live_ones_kept(tmp_path):
    """A worker killed mid-instance cannot remove its scratch directory; the next worker on the host (and the
    driver, at the end of a sweep) removes the directories whose owner pid is gone, and only those."""
    from agentrl.pipeline.sweep.worker import SCRATCH_PREFIX, reap_orphans, scratch_prefix
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    orphan = tmp_path / f"{SCRATCH_PREFIX}{dead.pid}-12345-abc"
    live = tmp_path / f"{scratch_prefix()}def"
    other = tmp_path / "agentrl-sweep-notapid-ghi"
    for d in (orphan, live, other):
        (d / "data").mkdir(parents=True)
        (d / "data" / "policy.pt").write_bytes(b"pt")
    assert reap_orphans(tmp_path) == [orphan]
    assert not orphan.exists() and live.exists() and other.exists()
    assert reap_orphans(tmp_path) == []


def test_a_reused_pid_does_not_keep_a_dead_workers_scratch(tmp_path):
    from agentrl.pipeline.sweep.worker import SCRATCH_PREFIX, reap_orphans
    reused = tmp_path / f"{SCRATCH_PREFIX}{os.getpid()}-1-abc"   # this pid, but a process that started at tick 1
    reused.mkdir()
    assert reap_orphans(tmp_path) == [reused]


# ---------------------------------------------------------------------------------------------------- slow tier

def write_params(repo: Path, changes: dict) -> None:
    params = yaml.safe_load((repo / "params.yaml").read_text())
    for section, values in changes.items():
        params[section].update(values)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    """A clone with the project's code and tiny params; its upstream stages built by `dvc repro`."""
    repo = tmp_path_factory.mktemp("sweep") / "repo"
    repo.mkdir()
    for name in ("agentrl", "stages"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "params.yaml", "pyproject.toml", ".gitignore", ".dvcignore"):
        shutil.copy(REPO / name, repo / name)
    (repo / ".dvc").mkdir()
    shutil.copy(REPO / ".dvc" / "config", repo / ".dvc" / "config")
    write_params(repo, TINY)
    for cmd in (["git", "init", "-q"], ["git", "config", "user.email", "t@example.com"],
                ["git", "config", "user.name", "t"], ["git", "add", "-A"], ["git", "commit", "-qm", "tiny"]):
        run(cmd, repo)
    run([str(BIN / "dvc"), "repro", "sft", "preflight"], repo, timeout=900)
    run(["git", "add", "-A"], repo)
    run(["git", "commit", "-qm", "upstream"], repo)
    return repo


class LocalCluster:
    """ray.cluster_utils.Cluster: a head and one worker node on this host, one CPU each; node death is noticed
    within a few seconds. `stop()` ends exactly its processes, by pid."""

    def __init__(self):
        from ray.cluster_utils import Cluster
        self.cluster = Cluster(initialize_head=True, head_node_args={
            "num_cpus": 1, "include_dashboard": False,
            "_system_config": {"health_check_period_ms": 1000, "health_check_failure_threshold": 3}})
        self.worker = self.cluster.add_node(num_cpus=1)
        self.address = self.cluster.address
        self.stopped: set[int] | None = None

    def node_pids(self, node) -> list[int]:
        return [p.process.pid for procs in node.all_processes.values() for p in procs]

    def stop(self) -> set[int]:
        """Stop every process of the cluster by pid: each node's own (raylet, gcs_server, ...) through their
        handles, then whatever of their descendants (workers, agents) outlives them. Returns the pids."""
        if self.stopped is not None:
            return self.stopped
        pids = descendants(os.getpid())
        for node in (self.worker, self.cluster.head_node):
            try:
                node.kill_all_processes(check_alive=False, allow_graceful=True, wait=True)
            except Exception as exc:
                print(f"node shutdown: {type(exc).__name__}: {exc}")
        killed = kill_all(pids)
        print(f"cluster stopped: {len(pids)} processes, {len(killed)} killed by pid after 15 s")
        self.stopped = pids
        return pids


@pytest.fixture(scope="module")
def cluster():
    c = LocalCluster()
    yield c
    c.stop()


def lock_entry(repo: Path, name: str):
    return yaml.safe_load((repo / "dvc.lock").read_text())["stages"].get(name)


def out_bytes(repo: Path, names) -> dict[str, bytes]:
    dirs = [repo / "data" / "ablate" / n.split("@", 1)[1] for n in names]
    return {p.relative_to(repo).as_posix(): p.read_bytes() for d in dirs for p in sorted(d.rglob("*")) if p.is_file()}


def mlflow_runs(repo: Path, sweep_id: str):
    from mlflow.tracking import MlflowClient
    client = MlflowClient(f"sqlite:///{repo / 'mlflow.db'}")
    exp = client.get_experiment_by_name("agentrl")
    return [r for r in client.search_runs([exp.experiment_id], max_results=1000)
            if r.data.tags.get("sweep") == sweep_id]


def sweep_id(output: str) -> str:
    return output.split("sweep id ", 1)[1].split("]", 1)[0].split()[0]


@pytest.mark.slow
def test_sweep_on_two_nodes_is_recorded_as_dvc_repro_would(tiny, cluster):
    t0 = time.time()
    out = sweep(tiny, "ablate", "--address", cluster.address)
    print(f"sweep of 4 instances on 2 nodes: {time.time() - t0:.0f} s\n{out.stdout}")
    assert "4 of 4 instances run and recorded" in out.stdout
    status = json.loads(run([str(BIN / "dvc"), "status", *INSTANCES, "--json"], tiny).stdout)
    assert status == {}
    again = sweep(tiny, "ablate", "--address", cluster.address)
    assert "all 4 instances are current" in again.stdout and "Ray" not in again.stdout
    sid = sweep_id(out.stdout)
    runs = mlflow_runs(tiny, sid)
    assert sorted(r.info.run_name for r in runs) == INSTANCES
    assert all(r.info.status == "FINISHED" and r.data.tags["pipeline_run"] == sid for r in runs)
    for r in runs:
        record = json.loads((tiny / "reports" / "provenance" / f"{r.info.run_name}.json").read_text())
        assert record["mlflow"]["run_id"] == r.info.run_id and record["fingerprint"] == r.data.tags["fingerprint"]
    # the same instances by dvc repro: the same bytes, the same dvc.lock
    rerun = [INSTANCES[0], INSTANCES[3]]
    swept, lock = out_bytes(tiny, rerun), (tiny / "dvc.lock").read_text()
    run([str(BIN / "dvc"), "repro", "-f", "-s", *rerun], tiny)
    assert len(swept) == 4 and out_bytes(tiny, rerun) == swept
    assert (tiny / "dvc.lock").read_text() == lock
    run(["git", "add", "-A"], tiny)
    run(["git", "commit", "-qm", "swept"], tiny)


@pytest.mark.slow
def test_a_killed_worker_node_costs_only_its_instance(tiny, cluster):
    """Two new instances, one per node; the worker node's processes are SIGKILLed (by pid) while its instance runs:
    the head's instance is recorded, the lost one is tried again on the head, the sweep completes."""
    write_params(tiny, {"ablate": {"seeds": [0, 1, 2]}})
    before = {n: lock_entry(tiny, n) for n in INSTANCES}
    proc = subprocess.Popen([sys.executable, "-m", "agentrl", "sweep", "ablate", "--address", cluster.address],
                            cwd=tiny, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    lines: list[str] = []
    reader = threading.Thread(target=lambda: lines.extend(proc.stdout), daemon=True)
    reader.start()
    node = cluster.node_pids(cluster.worker)
    killed, deadline = [], time.time() + 300
    while proc.poll() is None and not killed and time.time() < deadline:
        procs = set(node) | descendants(*node)
        if any("stages.ablate" in cmdline(p) for p in procs):
            for pid in procs:
                try:
                    os.kill(pid, signal.SIGKILL)
                    killed.append(pid)
                except ProcessLookupError:
                    pass
        time.sleep(0.2)
    proc.wait(timeout=400)
    reader.join(timeout=10)
    output = "".join(lines)
    print(output)
    assert killed, "the worker node never ran an instance"
    assert proc.returncode == 0, output
    assert "lost" in output and "trying again" in output
    assert "2 of 2 instances run and recorded" in output
    status = json.loads(run([str(BIN / "dvc"), "status", "ablate", "--json"], tiny).stdout)
    assert status == {}
    assert {n: lock_entry(tiny, n) for n in INSTANCES} == before    # what was recorded stays recorded
    assert not [p for p in killed if alive(p)]
    from agentrl.pipeline.sweep.worker import SCRATCH_PREFIX
    left = [d for pid in killed for d in Path(tempfile.gettempdir()).glob(f"{SCRATCH_PREFIX}{pid}-*")]
    assert left == [], f"the killed worker's scratch directory was not reaped: {left}"


@pytest.mark.slow
def test_the_cluster_stops_by_pid_and_leaves_no_process(cluster):
    names = " ".join(cmdline(p) for p in descendants(os.getpid()))
    assert "raylet" in names and "gcs_server" in names
    pids = cluster.stop()
    assert [p for p in pids if alive(p)] == []


@pytest.fixture
def subreaper():
    """Orphans of this test's processes are re-parented to the test process (PR_SET_CHILD_SUBREAPER), so a
    process a command left behind is still found among the test process's descendants."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(36, 1)
    try:
        yield
    finally:
        libc.prctl(36, 0)
        reap()


@pytest.mark.slow
def test_ctrl_c_stops_a_local_sweep_cleanly(tiny, subreaper):
    """No --address: the command starts its own Ray and stops it. SIGINT after the first instance is recorded:
    exit code 130, the recorded instance current in dvc.lock, the interrupted one absent from it and from data/,
    and no process left behind (raylet, gcs_server, workers, the stage)."""
    write_params(tiny, {"ablate": {"seeds": [0, 1, 2, 3]}})
    mine = descendants(os.getpid())
    proc = subprocess.Popen([sys.executable, "-m", "agentrl", "sweep", "ablate", "--max-parallel", "1"], cwd=tiny,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env())
    lines: list[str] = []
    for line in proc.stdout:
        lines.append(line)
        if "recorded (" in line:
            time.sleep(2)
            proc.send_signal(signal.SIGINT)
            break
    lines.extend(proc.stdout)
    proc.wait(timeout=120)
    output = "".join(lines)
    print(output)
    left = descendants(os.getpid()) - mine
    stragglers = kill_all(left, grace=10)
    assert proc.returncode == 130, output
    assert stragglers == [], [cmdline(p) for p in stragglers]
    recorded = [n for n in ("ablate@default-3", "ablate@public-3") if f"{n} recorded" in output]
    interrupted = [n for n in ("ablate@default-3", "ablate@public-3") if n not in recorded]
    assert len(recorded) == 1 and len(interrupted) == 1
    status = json.loads(run([str(BIN / "dvc"), "status", "ablate", "--json"], tiny).stdout)
    assert set(status) == set(interrupted)
    assert lock_entry(tiny, interrupted[0]) is None
    assert not (tiny / "data" / "ablate" / interrupted[0].split("@")[1]).exists()
    assert sorted(p.name for p in (tiny / "data" / "ablate").iterdir()) == \
        sorted(n.split("@")[1] for n in INSTANCES + ["ablate@default-2", "ablate@public-2"] + recorded)
