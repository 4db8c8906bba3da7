"""The pipeline end to end on a shortened configuration, in a throwaway clone: dvc repro, caching, byte-identical
reruns, MLflow runs and provenance records, audit agreeing with `dvc status`, experiments (params, seeds, parallel
queue), resume after SIGKILL, bad params.

The clone has the project's code, dvc.yaml and a params.yaml with every step count cut down; the module builds it
once and the tests share it (in order).
"""
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow

SHORT = {
    "base": {"demos_per_task": 12, "steps": 40, "teach_steps": 20},
    "sft": {"steps": 3, "describe_per_task": 8},
    "train": {"steps": 4, "checkpoint_every": 2, "eval_per_task": 2},
    "select": {"n_boot": 200},
    "test": {"episodes_per_task": 8, "n_boot": 200},
    "ablate": {"arms": {"default": {}, "public": {"rl.reward": "public"}}, "seeds": [0, 1], "steps": 2,
               "eval_per_task": 2, "n_boot": 200},
    "faults": {"steps": 2, "short_steps": 1, "eval_every": 1, "eval_per_task": 1},
    "length": {"steps": 2},
    "threads": {"steps": 2},
    "behaviour": {"episodes_per_task": 2},
}
NUMERIC = {"base", "length_start", "sft", "preflight", "train", "test", "behaviour", "ablate@default-0",
           "ablate@default-1", "ablate@public-0", "ablate@public-1", "ablate_summary", "threads", "faults", "report"}
ALL_STAGES = NUMERIC | {"tasks", "select", "humaneval"}   # these do no tensor work, so no thread count


def run(cmd, cwd, check=True, timeout=2400, env=None):
    out = subprocess.run(cmd, cwd=cwd, capture_output=True, text=True, timeout=timeout, shell=isinstance(cmd, str),
                         env=env or clone_env())
    if check and out.returncode != 0:
        raise AssertionError(f"{cmd} failed ({out.returncode}):\n{out.stdout[-4000:]}\n{out.stderr[-4000:]}")
    return out


def clone_env():
    env = dict(os.environ)
    env["PATH"] = f"{BIN}:{env['PATH']}"
    env.pop("MLFLOW_TRACKING_URI", None)
    env.pop("DVC_ROOT", None)
    return env


def stages_run(output: str) -> set[str]:
    return {line.split("'")[1] for line in output.splitlines() if line.startswith("Running stage '")}


def write_params(repo: Path, changes: dict) -> None:
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in changes.items():
        params[section].update(values)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))


@pytest.fixture(scope="module")
def mini(tmp_path_factory):
    repo = tmp_path_factory.mktemp("pipeline") / "repo"
    repo.mkdir()
    for name in ("agentrl", "stages"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("dvc.yaml", "pyproject.toml", ".gitignore", ".dvcignore"):
        shutil.copy(REPO / name, repo / name)
    (repo / ".dvc").mkdir()
    shutil.copy(REPO / ".dvc" / "config", repo / ".dvc" / "config")
    (repo / "README.md").write_text("mini\n")
    shutil.copytree(REPO / "data/sources/humaneval", repo / "data/sources/humaneval")   # what make install fetched
    write_params(repo, SHORT)
    run("git init -q && git config user.email t@example.com && git config user.name t && git add -A && "
        "git commit -qm mini", repo)
    t0 = time.time()
    first = run([str(BIN / "dvc"), "repro"], repo, env=clone_env() | {"AGENTRL_PIPELINE_RUN": "mini-first"})
    print(f"mini pipeline: dvc repro took {time.time() - t0:.0f} s")
    run("git add -A && git commit -qm 'pipeline outputs'", repo)
    return {"repo": repo, "first": first, "pipeline_run": "mini-first"}


def test_repro_runs_every_stage_then_nothing(mini):
    repo = mini["repo"]
    assert stages_run(mini["first"].stdout) == ALL_STAGES
    for name in ("test", "selection", "ablation", "threads", "faults", "preflight", "starting_policy"):
        assert (repo / "reports" / f"{name}.json").exists(), name
    assert (repo / "reports" / "capstone.md").exists()
    again = run([str(BIN / "dvc"), "repro"], repo)
    assert stages_run(again.stdout) == set()
    assert "up to date" in again.stdout.lower()


def test_a_forced_rerun_rewrites_only_the_provenance_records(mini):
    """Outputs depend only on what made them: rerunning stages on the same code, params and inputs gives the same
    bytes (dvc.lock unchanged); only the provenance records (run ids, timestamps) change."""
    repo = mini["repo"]
    run([str(BIN / "dvc"), "repro", "-f", "-s", "tasks", "train", "select", "test", "report"], repo)
    changed = run("git status --porcelain", repo).stdout.split("\n")
    assert [line for line in changed if line.strip()], "the provenance records should have been rewritten"
    assert all(line[3:].startswith("reports/provenance/") for line in changed if line.strip()), changed
    run("git checkout -q -- reports/provenance", repo)


def test_each_stage_logs_exactly_one_mlflow_run_with_its_record(mini):
    import mlflow
    repo = mini["repo"]
    client = mlflow.MlflowClient(f"sqlite:///{repo}/mlflow.db")
    exp = client.get_experiment_by_name("agentrl")
    runs = [r for r in client.search_runs([exp.experiment_id], max_results=1000)
            if r.data.tags.get("pipeline_run") == mini["pipeline_run"]]
    assert sorted(r.info.run_name for r in runs) == sorted(ALL_STAGES)
    test_run = next(r for r in runs if r.info.run_name == "test")
    assert test_run.info.status == "FINISHED"
    assert test_run.data.params["test.n_boot"] and test_run.data.params["run.threads"] == "2"
    tags = test_run.data.tags
    for key in ("fingerprint", "git.commit", "git.dirty", "code_hash", "code_files", "version.torch",
                "version.mlflow", "version.dvc", "version.python", "version.agentrl", "pipeline_run"):
        assert key in tags, key
    assert any(k.startswith("input.") for k in tags)
    record = json.loads((repo / "reports" / "provenance" / "test.json").read_text())
    assert record["fingerprint"] == tags["fingerprint"] and record["mlflow"]["tracking_uri"] == "sqlite:///mlflow.db"
    from agentrl.tracking.store import artifact_dir

    def artifacts(r):   # the store records mlflow-artifacts:/ (mlflow ui serves ./mlartifacts), no absolute path
        where = artifact_dir(r.info.artifact_uri, f"sqlite:///{repo}/mlflow.db")
        assert where.is_relative_to(repo / "mlartifacts") and str(repo) not in r.info.artifact_uri
        return {p.name for p in where.iterdir()}
    assert artifacts(test_run) >= {"test.json", "provenance"}
    report_run = next(r for r in runs if r.info.run_name == "report")
    arts = artifacts(report_run)
    assert {"capstone.md", "capstone.json", "figures"} <= arts
    for name in ("test", "selection", "capstone"):   # outputs carry no run id, commit or absolute path
        text = (repo / "reports" / f"{name}.json").read_text()
        assert test_run.info.run_id not in text and str(repo) not in text and tags["git.commit"] not in text


def test_audit_agrees_with_dvc_status(mini):
    repo = mini["repo"]
    spec = "reports/test.json:chosen.pass_at_1"

    def audit_and_status():
        out = run([sys.executable, "-m", "agentrl", "audit", spec], repo, check=False)
        status = json.loads(run([str(BIN / "dvc"), "status", "test", "--json"], repo).stdout)
        return out, status
    out, status = audit_and_status()
    record = json.loads((repo / "reports" / "provenance" / "test.json").read_text())
    assert out.returncode == 0 and "current" in out.stdout and status == {}
    assert record["mlflow"]["run_id"] in out.stdout and "agentrl/rl/objectives.py" in out.stdout
    edits = [("agentrl/report/sources.py", 0, set()), ("params.yaml", 1, {"test"}),
             ("agentrl/rl/objectives.py", 1, {"test"})]
    for path, code, stale in edits:
        original = (repo / path).read_text()
        try:
            (repo / path).write_text(original.replace("n_boot: 200", "n_boot: 300") if path == "params.yaml"
                                     else original + "# a comment\n")
            out, status = audit_and_status()
            assert out.returncode == code and set(status) == stale, (path, out.stdout[-2000:], status)
            if stale:
                assert "STALE" in out.stdout and ("test.n_boot" in out.stdout or path in out.stdout), out.stdout
        finally:
            (repo / path).write_text(original)
    record_file = repo / "reports" / "provenance" / "test.json"   # a record that is a device: said, not "missing"
    saved = record_file.read_bytes()
    record_file.unlink()
    record_file.symlink_to("/dev/zero")
    try:
        out, _ = audit_and_status()
        assert "provenance record reports/provenance/test.json unreadable" in out.stdout, out.stdout[-2000:]
        assert "a character device" in out.stdout or "is a character device" in out.stdout, out.stdout[-2000:]
    finally:
        record_file.unlink()
        record_file.write_bytes(saved)


def test_audit_walks_the_lineage_after_an_experiment(mini):
    """rl.kl_coef is read by the train stage, not by the test stage: audit of the test headline shows it under the
    train stage of its lineage, marked against the committed dvc.lock, with each stage's numerics and verdict."""
    repo = mini["repo"]
    try:
        out = run([str(BIN / "dvc"), "exp", "run", "-S", "rl.kl_coef=0.05", "test"], repo)
        assert {"train", "test"} <= stages_run(out.stdout)
        spec = "reports/test.json:chosen.pass_at_1"
        res = json.loads(run([sys.executable, "-m", "agentrl", "audit", spec, "--json"], repo).stdout)
        chain = {item["stage"]: item for item in res["lineage"]["stages"]}
        assert {"test", "train", "select", "preflight", "base", "tasks"} <= set(chain)
        assert "rl.kl_coef" not in res["params"] and "rl.kl_coef" not in chain["test"]["params"]
        assert chain["train"]["params"]["rl.kl_coef"] == 0.05 and chain["train"]["changed"] == {"rl.kl_coef": 0.0}
        assert chain["base"]["changed"] == {} and chain["train"]["machine"]["mode"] == "portable"
        assert res["reproduction"]["verdict"] == "bit-for-bit"
        text = run([sys.executable, "-m", "agentrl", "audit", spec], repo).stdout
        assert "rl.kl_coef=0.05 * (committed 0.0)" in text and "portable numerics, AVX2 kernels" in text
    finally:
        run("git checkout -q -- . && git clean -qfd reports", repo)
        run([str(BIN / "dvc"), "checkout", "-q", "--force"], repo, check=False)


def test_thread_count_and_numerics_are_params_of_exactly_the_numeric_stages(mini):
    repo = mini["repo"]
    original = (repo / "params.yaml").read_text()
    try:
        for old, new in (("threads: 2", "threads: 1"), ("numerics: portable", "numerics: native")):
            (repo / "params.yaml").write_text(original.replace(old, new, 1))
            status = json.loads(run([str(BIN / "dvc"), "status", "--json"], repo).stdout)
            assert set(status) == NUMERIC, old
    finally:
        (repo / "params.yaml").write_text(original)


PLOTS = {"training_reward", "validation_pass", "heldout_per_arm", "entropy", "approx_kl", "zero_adv_share",
         "logp_gap", "reads"}


def test_a_new_seed_and_a_new_arm_run_only_their_instances_and_plots_compare_by_name(mini):
    """One experiment adds a seed (params only) and an arm (params only, no code): DVC runs exactly the new seed's
    instances of the existing arms, every seed of the new arm, the summary and the report; the experiment's plots
    compare with the workspace's by name."""
    repo = mini["repo"]
    shown = json.loads(run([str(BIN / "dvc"), "plots", "show", "--json"], repo).stdout)["data"]
    assert PLOTS <= set(shown)
    out = run([str(BIN / "dvc"), "exp", "run", "-S", "ablate.seeds=[0,1,2]",
               "-S", "+ablate.arms.clip_higher={rl.clip_eps_high: 0.28}"], repo)
    assert stages_run(out.stdout) == {"ablate@default-2", "ablate@public-2", "ablate@clip_higher-0",
                                      "ablate@clip_higher-1", "ablate@clip_higher-2", "ablate_summary", "report"}
    summary = json.loads((repo / "reports" / "ablation.json").read_text())
    assert summary["seeds"] == [0, 1, 2] and "clip_higher" in summary["arms"]
    result = json.loads((repo / "data" / "ablate" / "clip_higher-0" / "result.json").read_text())
    assert result["config"]["clip_eps_high"] == 0.28
    exp = run([str(BIN / "dvc"), "exp", "list", "--name-only"], repo).stdout.split()[-1]
    diff = json.loads(run([str(BIN / "dvc"), "plots", "diff", exp, "--json"], repo).stdout)["data"]
    assert len(PLOTS & set(diff)) >= 4, sorted(diff)
    columns = run([str(BIN / "dvc"), "exp", "show", "--csv"], repo).stdout.splitlines()[0].split(",")
    metrics = [c for c in columns if c.startswith("reports/metrics/") or ":" in c]
    print(f"dvc exp show: {len(columns)} columns ({len(metrics)} metrics)")
    run("git checkout -q -- . && git clean -qfd reports", repo)
    run([str(BIN / "dvc"), "checkout", "-q"], repo, check=False)


def start_queue_workers(repo: Path, jobs: int) -> None:
    """`dvc queue start -j jobs`, its output in a file: the workers it detaches inherit the command's stdout and
    stderr, so capturing them would wait for the last worker to exit (and a worker can hang in its shutdown
    after its last experiment has finished)."""
    with open(repo / "queue_start.log", "w") as log:
        out = subprocess.run([str(BIN / "dvc"), "queue", "start", "-j", str(jobs)], cwd=repo, stdout=log,
                             stderr=subprocess.STDOUT, timeout=120, env=clone_env())
    assert out.returncode == 0, (repo / "queue_start.log").read_text()[-4000:]


def stop_queue_workers(repo: Path) -> None:
    """Stop the queue's workers, killing any still alive after 30 s (by the pid files DVC writes for them)."""
    run([str(BIN / "dvc"), "queue", "stop"], repo, check=False, timeout=120)
    texts = [p.read_text().split() for p in (repo / ".dvc" / "tmp" / "exps" / "celery").glob("*.pid")]
    pids = [int(t[0]) for t in texts if t]
    deadline = time.time() + 30
    while pids and time.time() < deadline:
        pids = [pid for pid in pids if _signal(pid, 0)]
        time.sleep(1)
    for pid in pids:
        _signal(pid, signal.SIGKILL)


def wait_for_queue(repo: Path, seconds: float = 900) -> str:
    """`dvc queue status` once nothing is queued or running (or after `seconds`)."""
    deadline = time.time() + seconds
    while True:
        status = run([str(BIN / "dvc"), "queue", "status"], repo).stdout
        if ("Queued" not in status and "Running" not in status) or time.time() > deadline:
            return status
        time.sleep(5)


def _signal(pid: int, sig: int) -> bool:
    """Send `sig` to `pid` (0: only check it exists); False if the process is gone."""
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        return False
    return True


def test_parallel_queue_logs_every_run(mini):
    import mlflow
    repo = mini["repo"]
    client = mlflow.MlflowClient(f"sqlite:///{repo}/mlflow.db")
    exp = client.get_experiment_by_name("agentrl")
    before = {r.info.run_id for r in client.search_runs([exp.experiment_id], max_results=5000)}
    for seed in (3, 4):
        run([str(BIN / "dvc"), "exp", "run", "--queue", "-S", f"ablate.seeds=[0,1,{seed}]"], repo)
    try:
        start_queue_workers(repo, 2)
        status = wait_for_queue(repo)
    finally:
        stop_queue_workers(repo)
    assert "Failed" not in status, status
    new = [r for r in client.search_runs([exp.experiment_id], max_results=5000) if r.info.run_id not in before]
    names = sorted(r.info.run_name for r in new)
    # each queued experiment ran its new seed's two instances, the summary and the report
    expected = sorted(["ablate@default-3", "ablate@public-3", "ablate@default-4", "ablate@public-4"]
                      + ["ablate_summary", "report"] * 2)
    assert [n for n in names if n in expected] == expected, names
    assert all(r.info.status == "FINISHED" for r in new)
    assert not list((repo / ".dvc" / "tmp").rglob("mlflow.db")), "a queued run wrote its own store"


@pytest.mark.parametrize("signum", [signal.SIGHUP, signal.SIGTERM])
def test_a_signal_to_a_queue_worker_leaves_no_run_running(mini, signum):
    """A queued experiment's worker signalled while a stage runs (docs/dvc.md, "Signals and the queue"): celery's
    worker stops warm, so the stage it is running goes on, ends FINISHED and the experiment succeeds; SIGHUP then
    restarts the worker, SIGTERM ends it. Either way no MLflow run is left RUNNING."""
    import mlflow
    repo = mini["repo"]
    client = mlflow.MlflowClient(f"sqlite:///{repo}/mlflow.db")
    exp = client.get_experiment_by_name("agentrl")
    before = {r.info.run_id for r in client.search_runs([exp.experiment_id], max_results=5000)}
    run([str(BIN / "dvc"), "exp", "run", "--queue", "-S", f"ablate.seeds=[0,1,{10 + signum}]"], repo)
    env = clone_env() | {"AGENTRL_RUN_DELAY": "created:10"}   # each stage holds 10 s once its run exists
    try:
        with open(repo / "queue_start.log", "w") as log:
            assert subprocess.run([str(BIN / "dvc"), "queue", "start", "-j", "1"], cwd=repo, stdout=log,
                                  stderr=subprocess.STDOUT, timeout=120, env=env).returncode == 0
        deadline = time.time() + 300
        while time.time() < deadline and not [r for r in client.search_runs([exp.experiment_id], max_results=5000)
                                               if r.info.run_id not in before]:
            time.sleep(1)   # a stage of the experiment has its run: now the worker is signalled
        workers = [int(p.read_text().split()[0]) for p in (repo / ".dvc/tmp/exps/celery").glob("*.pid")]
        assert workers
        for pid in workers:
            _signal(pid, signum)
        status = wait_for_queue(repo)
    finally:
        stop_queue_workers(repo)
    new = [r for r in client.search_runs([exp.experiment_id], max_results=5000) if r.info.run_id not in before]
    assert new and all(r.info.status == "FINISHED" for r in new), [(r.info.run_name, r.info.status) for r in new]
    assert "Success" in status and "Failed" not in status, status


def test_train_resumes_bit_identically_after_sigkill(mini, tmp_path):
    repo = mini["repo"]
    work = tmp_path / "resume"
    shutil.copytree(repo, work, ignore=shutil.ignore_patterns(".dvc", "mlflow.db", "mlartifacts"))
    shutil.copytree(repo / ".dvc", work / ".dvc", ignore=shutil.ignore_patterns("tmp", "cache"))
    write_params(work, SHORT | {"train": {"steps": 6, "checkpoint_every": 2, "eval_per_task": 2}})
    env = clone_env() | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/resume.db"}
    ckpts = work / "data" / "train" / "checkpoints"

    def uninterrupted():
        shutil.rmtree(work / "data" / "train", ignore_errors=True)
        run([sys.executable, "-m", "stages.train"], work, env=env)
        checkpoints = {p.name: p.read_bytes() for p in sorted(ckpts.glob("*.pt"))}
        return checkpoints, (work / "reports" / "train_dashboard.json").read_text()

    reference, ref_history = uninterrupted()
    shutil.rmtree(work / "data" / "train")
    proc = subprocess.Popen([sys.executable, "-m", "stages.train"], cwd=work, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.time() + 300
    while not (ckpts / "step_0002.pt").exists() and time.time() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert not (ckpts / "step_0006.pt").exists(), "the run finished before it could be killed"
    resumed = run([sys.executable, "-m", "stages.train"], work, env=env)
    assert "resuming from checkpoint" in resumed.stdout + resumed.stderr
    import torch

    from agentrl.model.checkpoints import read_checkpoint
    a = read_checkpoint(ckpts / "step_0006.pt")
    b_path = work / "reference.pt"
    b_path.write_bytes(reference["step_0006.pt"])
    b = read_checkpoint(b_path)
    assert all(torch.equal(a["state_dict"][k], b["state_dict"][k]) for k in a["state_dict"])
    assert a["extra"]["history"] == b["extra"]["history"]
    assert (work / "reports" / "train_dashboard.json").read_text() == ref_history
    # the killed run is closed as KILLED by the resumed one, which links to it, holds every validation point
    # and accounts for the wall time of both segments
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/resume.db")
    exp = client.get_experiment_by_name("agentrl")
    runs = {r.info.run_id: r for r in client.search_runs([exp.experiment_id]) if r.info.run_name == "train"}
    statuses = sorted(r.info.status for r in runs.values())
    assert statuses == ["FINISHED", "FINISHED", "KILLED"], statuses
    record = json.loads((work / "reports" / "provenance" / "train.json").read_text())
    last = runs[record["mlflow"]["run_id"]]
    killed = [i for i, r in runs.items() if r.info.status == "KILLED"]
    assert killed[0] in record["mlflow"]["continues"] and killed[0] in last.data.tags["continues"]
    points = client.get_metric_history(last.info.run_id, "validation_pass")
    assert sorted(m.step for m in points) == [0, 2, 4, 6]
    assert record["wall_seconds"] > record["this_run_seconds"]


@pytest.mark.parametrize("section,key,value,fragment", [
    ("tasks", "bogus", 1, "tasks.bogus: unknown key"),
    ("rl", "lr", "fast", "rl.lr"),
    ("rl", "group_size", 1, "rl.group_size"),
    ("run", "threads", 0, "run.threads"),
    ("rl", "loss_mode", "mean", "rl.loss_mode"),
])
def test_bad_params_fail_before_any_output(mini, tmp_path, section, key, value, fragment):
    work = tmp_path / "bad"
    shutil.copytree(mini["repo"], work, ignore=shutil.ignore_patterns(".dvc", "data", "reports", "mlflow.db"))
    params = yaml.safe_load((work / "params.yaml").read_text())
    params[section][key] = value
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    stage = "tasks" if section == "tasks" else "train"
    env = clone_env() | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/bad.db"}
    out = run([sys.executable, "-m", f"stages.{stage}"], work, check=False, env=env)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error:") and fragment in lines[0], out.stderr
    assert not (work / "data").exists() and not (work / "reports").exists()
    assert not (tmp_path / "bad.db").exists()


def test_a_bad_param_under_dvc_repro_keeps_the_reports(mini, tmp_path):
    """DVC deletes a stage's outputs before running it; the uncached reports persist, so a stage that fails on a
    bad param leaves the committed reports as they were."""
    work = tmp_path / "keep"
    shutil.copytree(mini["repo"], work, ignore=shutil.ignore_patterns("mlflow.db", "mlartifacts"))
    before = {p: (work / p).read_bytes() for p in ("reports/test.json", "reports/metrics/test.json")}
    params = yaml.safe_load((work / "params.yaml").read_text())
    params["test"]["n_boot"] = 5
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = clone_env() | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/keep.db"}
    out = run([str(BIN / "dvc"), "repro", "test"], work, check=False, env=env)
    assert out.returncode != 0 and "test.n_boot" in out.stderr + out.stdout
    assert {p: (work / p).read_bytes() for p in before} == before


def test_a_diverging_run_stops_with_one_line(mini, tmp_path):
    work = tmp_path / "diverge"
    shutil.copytree(mini["repo"], work, ignore=shutil.ignore_patterns(".dvc", "mlflow.db", "mlartifacts"))
    write_params(work, SHORT | {"rl": {"lr": 10000.0}})
    env = clone_env() | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/diverge.db"}
    out = run([sys.executable, "-m", "stages.train"], work, check=False, env=env)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 2 and lines[-1].startswith("error: step 0: training diverged"), out.stderr[-2000:]
    bundle = lines[-1].rsplit("replay bundle: ", 1)[1].rstrip(")")
    replay = run([sys.executable, "-m", "agentrl", "replay", bundle], work, env=env)
    assert "identical statistics" in replay.stdout
    import mlflow
    client = mlflow.MlflowClient(f"sqlite:///{tmp_path}/diverge.db")
    exp = client.get_experiment_by_name("agentrl")
    assert [r.info.status for r in client.search_runs([exp.experiment_id])] == ["FAILED"]


def test_truncated_checkpoint_gives_a_clear_error(mini, tmp_path):
    work = tmp_path / "trunc"
    shutil.copytree(mini["repo"], work, ignore=shutil.ignore_patterns(".dvc", "mlflow.db"))
    base = work / "data" / "models" / "base.pt"
    base.write_bytes(base.read_bytes()[: base.stat().st_size // 2])
    env = clone_env() | {"MLFLOW_TRACKING_URI": f"sqlite:///{tmp_path}/trunc.db"}
    out = run([sys.executable, "-m", "stages.sft"], work, check=False, env=env)
    assert out.returncode == 2
    assert "data/models/base.pt" in out.stderr and "corrupted" in out.stderr and "Traceback" not in out.stderr
