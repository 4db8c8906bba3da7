"""The error boundary of every entry point: a user error is one line and exit 2, an unexpected one is one line
naming a log file that holds the traceback and exit 1, Ctrl-C exits 130 and SIGTERM 143; the MLflow run of a stage
that did not finish is never FINISHED and carries the line its process printed."""
from __future__ import annotations

import errno
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentrl.core import boundary
from agentrl.core.config import UserError

REPO = Path(__file__).resolve().parents[1]


def _client(uri):
    from mlflow.tracking import MlflowClient
    return MlflowClient(tracking_uri=uri)


def _make_probe_project(tmp_path) -> Path:
    """A temp project: the real params.yaml, a dvc.yaml whose stage `probe` has one code file and one input."""
    root = tmp_path / "proj"
    (root / "stages").mkdir(parents=True)
    (root / "stages" / "probe.py").write_text("print('probe')\n")
    (root / "data").mkdir()
    (root / "data" / "in.json").write_text('{"x": 1}\n')
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"probe": {
        "cmd": "python -m stages.probe", "deps": ["stages/probe.py", "data/in.json"], "params": ["select"],
        "outs": ["reports/probe.json"]}}}))
    return root


def enter_probe_project(root: Path, tmp_path, monkeypatch, store_template) -> Path:
    """Work in `root` as its stage would: a copy of the empty store, DVC_ROOT, a log directory, no debug mode."""
    db = tmp_path / "mlflow.db"
    shutil.copy(store_template, db)
    monkeypatch.chdir(root)
    monkeypatch.setenv("DVC_ROOT", str(root))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{db.as_posix()}")
    monkeypatch.setenv(boundary.LOG_DIR_ENV, str(tmp_path / "logs"))
    monkeypatch.delenv(boundary.DEBUG_ENV, raising=False)
    return root


@pytest.fixture
def project(tmp_path, monkeypatch, store_template):
    return enter_probe_project(_make_probe_project(tmp_path), tmp_path, monkeypatch, store_template)


def _runs():
    client = _client(os.environ["MLFLOW_TRACKING_URI"])
    exp = client.get_experiment_by_name("agentrl")
    return client.search_runs([exp.experiment_id])


def _stage(body):
    from agentrl.pipeline.stage import run_stage
    with pytest.raises(SystemExit) as exit_:
        run_stage("probe", ["select"], ["data/in.json"], body, numeric=False)
    return exit_.value.code


def test_an_unexpected_error_is_one_line_with_its_traceback_in_a_log_and_in_the_run(project, capsys, tmp_path):
    def body(ctx):
        {}["checkpoints"]
    assert _stage(body) == 1
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: probe: unexpected KeyError: 'checkpoints' (traceback: ")
    log = Path(lines[0].split("(traceback: ")[1].split(";")[0])
    assert log.parent == tmp_path / "logs" and "Traceback" in log.read_text() and "checkpoints" in log.read_text()
    (run,) = _runs()
    assert run.info.status == "FAILED" and run.data.tags["error"] == lines[0][len("error: "):]
    assert run.data.tags["mlflow.note.content"] == run.data.tags["error"]   # the run's description in `mlflow ui`


def test_a_user_error_is_exit_2_and_the_failed_run_says_why(project, capsys):
    def body(ctx):
        raise UserError("reports/train.json: checkpoints: missing; re-run the stage that writes it")
    assert _stage(body) == 2
    err = capsys.readouterr().err
    assert err == "error: reports/train.json: checkpoints: missing; re-run the stage that writes it\n"
    (run,) = _runs()
    assert run.info.status == "FAILED" and "checkpoints: missing" in run.data.tags["error"]


def test_debug_prints_the_traceback_instead(project, capsys, monkeypatch):
    monkeypatch.setenv(boundary.DEBUG_ENV, "1")

    def body(ctx):
        raise RuntimeError("boom")
    assert _stage(body) == 1
    err = capsys.readouterr().err
    assert "Traceback (most recent call last)" in err and err.strip().splitlines()[-1] == \
        "error: probe: unexpected RuntimeError: boom"


def test_exit_codes_of_the_boundary(capsys):
    def raises(exc):
        def fn():
            raise exc
        return fn
    assert boundary.guard("x", raises(KeyboardInterrupt())) == 130
    assert boundary.guard("x", raises(boundary.Terminated())) == 143
    assert boundary.guard("x", raises(boundary.Terminated(signal.SIGHUP))) == 129
    assert boundary.guard("x", raises(boundary.Terminated(signal.SIGQUIT))) == 131
    assert boundary.guard("x", raises(UserError("bad"))) == 2
    assert boundary.guard("x", lambda: 3) == 3 and boundary.guard("x", lambda: None) == 0
    full = OSError(errno.ENOSPC, "No space left on device", "reports/audit.json")
    assert boundary.guard("x", raises(full)) == 1
    err = capsys.readouterr().err.splitlines()
    assert err[:5] == ["error: x: interrupted (SIGINT)", "error: x: terminated (SIGTERM)",
                       "error: x: terminated (SIGHUP: the terminal closed)", "error: x: terminated (SIGQUIT)",
                       "error: bad"]
    assert err[5] == ("error: x: cannot write reports/audit.json: No space left on device; free space on that "
                      "filesystem and run again")


def test_a_signal_after_the_work_is_recorded_finished_does_not_fail_it(capsys):
    def finish_then_terminated():
        boundary.mark_finished()
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(1)
    assert boundary.guard("x", finish_then_terminated) == 0
    assert "ignored" in capsys.readouterr().err


def test_ctrl_c_inside_code_run_from_a_string_still_exits_130(tmp_path):
    """A Ctrl-C that lands in eval'd source text (collections.namedtuple builds classes with eval, so a Ctrl-C during
    an import can land there) made CPython end a `python -m` process by SIGINT (-2) after the boundary had printed
    its line and chosen 130 (`python -m` is how every stage and verb runs; `-c` and a script exit another way)."""
    (tmp_path / "entry_point.py").write_text(
        "import sys\n"
        "from agentrl.core import boundary\n"
        "sys.exit(boundary.guard('x', lambda: eval(\"__import__('signal').raise_signal(2)\")))\n")
    done = subprocess.run([sys.executable, "-m", "entry_point"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stderr) == (130, "error: x: interrupted (SIGINT)\n")



def test_ctrl_c_inside_an_import_locks_weakref_callback_still_exits_130(tmp_path):
    """importlib releases its module locks through weakref callbacks; an exception raised inside one is printed as
    "Exception ignored" with a traceback and dropped, so a Ctrl-C landing there was lost and the stage ran on (seen in
    test_fuzz's signal test on a slow CPU). The handler sends the signal again a moment later instead."""
    (tmp_path / "entry_point.py").write_text(
        "import sys, time, weakref\n"
        "from agentrl.core import boundary\n"
        "ns = {}\n"
        "exec(compile('def cb(ref):\\n    import signal\\n    signal.raise_signal(2)\\n    x = 1\\n',\n"
        "             '<frozen importlib._bootstrap>', 'exec'), ns)\n"
        "class Lock: pass\n"
        "def work():\n"
        "    lock = Lock(); ref = weakref.ref(lock, ns['cb']); del lock\n"
        "    time.sleep(10)\n"
        "    return 0\n"
        "sys.exit(boundary.guard('x', work))\n")
    done = subprocess.run([sys.executable, "-m", "entry_point"], capture_output=True, text=True, timeout=120,
                          cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(REPO)})
    assert (done.returncode, done.stderr) == (130, "error: x: interrupted (SIGINT)\n")

def test_a_long_message_stays_one_bounded_line():
    line = boundary.one_line("audit: " + "k" * 10_000 + "\nsecond line")
    assert "\n" not in line and len(line) < 450 and "10,007 characters" in line


def test_an_interrupted_write_leaves_the_old_file_and_no_temporary(tmp_path, monkeypatch):
    from agentrl.core import artifacts
    target = tmp_path / "out.json"
    artifacts.write_json(target, {"v": 1})

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device", str(target))
    monkeypatch.setattr(artifacts.os, "replace", full)
    with pytest.raises(OSError):
        artifacts.write_json(target, {"v": 2})
    assert target.read_text() == '{\n  "v": 1\n}\n' and list(tmp_path.iterdir()) == [target]


def test_a_cli_verb_that_crashes_is_one_line_and_exit_1(monkeypatch, capsys, tmp_path):
    from agentrl import cli
    monkeypatch.setenv(boundary.LOG_DIR_ENV, str(tmp_path))

    def crash(args):
        raise ZeroDivisionError("division by zero")
    monkeypatch.setattr(cli, "cmd_deps", crash)
    assert cli.main(["deps"]) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: agentrl deps: unexpected ZeroDivisionError: division by zero (traceback: ")
    assert len(list(tmp_path.glob("agentrl deps-*.log"))) == 1


SLEEPER = """
import sys, time
sys.path.insert(0, REPO)
from agentrl.pipeline.stage import run_stage
def body(ctx):
    print("started", flush=True)
    time.sleep(60)
run_stage("probe", ["select"], ["data/in.json"], body, numeric=False)
"""


@pytest.mark.slow   # stage subprocesses (MLflow import each)
@pytest.mark.parametrize("sig,code,reason", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "interrupted (SIGINT)"),
                                             (signal.SIGHUP, 129, "terminated (SIGHUP: the terminal closed)"),
                                             (signal.SIGQUIT, 131, "terminated (SIGQUIT)")])
def test_a_signalled_stage_exits_with_its_code_and_its_run_is_killed_with_the_reason(project, sig, code, reason):
    p = subprocess.Popen([sys.executable, "-c", SLEEPER.replace("REPO", repr(str(REPO)))], cwd=project,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "started"
    p.send_signal(sig)
    p.send_signal(sig)   # DVC and the terminal both forward a Ctrl-C: the second must not cut the cleanup short
    _, err = p.communicate(timeout=60)
    assert p.returncode == code and err.strip().splitlines()[-1] == f"error: probe: {reason}", err
    (run,) = _runs()
    assert run.info.status == "KILLED" and run.data.tags["killed_reason"] == f"probe: {reason}"


def test_replay_of_a_file_that_is_not_a_bundle_is_one_line(capsys):
    from agentrl import cli
    assert cli.main(["replay", str(REPO / "README.md")]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: replay {REPO / 'README.md'}: not a replay bundle (UnpicklingError)")


EARLY = """
import sys, time
sys.path.insert(0, REPO)
from agentrl.core import boundary
boundary.end_quietly_on_signals("probe")
print("importing", flush=True)
time.sleep(60)   # a stage script importing torch
"""


@pytest.mark.parametrize("sig,code,reason", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "interrupted (SIGINT)"),
                                             (signal.SIGHUP, 129, "terminated (SIGHUP: the terminal closed)"),
                                             (signal.SIGQUIT, 131, "terminated (SIGQUIT)")])
def test_a_signal_between_the_early_check_and_the_stage_is_one_line_and_its_code(tmp_path, sig, code, reason):
    """Between stages/__init__.py's check and run_stage (the stage module importing torch) Python's defaults would
    print a KeyboardInterrupt traceback or end without a word."""
    p = subprocess.Popen([sys.executable, "-c", EARLY.replace("REPO", repr(str(REPO)))], cwd=tmp_path,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "importing"
    p.send_signal(sig)
    _, err = p.communicate(timeout=30)
    assert p.returncode == code and err.splitlines() == [
        f"error: probe: {reason} before it started; nothing was written"], (p.returncode, err)


def test_the_early_handlers_stand_down_once_a_boundary_has_run(capsys):
    """A late signal after the stage's own boundary returned (its handlers restored to the early ones) leaves the
    decided exit code alone."""
    before = {sig: signal.getsignal(sig) for sig in boundary.SIGNALS}
    try:
        boundary.end_quietly_on_signals("probe")
        assert boundary.guard("probe", lambda: 0) == 0
        signal.raise_signal(signal.SIGHUP)   # the early handler, restored by guard: must return, not exit
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)
    assert capsys.readouterr().err == ""
