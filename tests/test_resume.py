"""Kill anywhere, resume to the same bytes: `train` on a shortened config is SIGKILLed at every boundary in turn,
each kill in a process that itself resumed from the previous one (right after the step-0 checkpoint is written,
mid-step between two optimizer steps, during validation, while a checkpoint file is being written, right after a
later checkpoint), then run to the end; every output byte equals an uninterrupted run's.

The kills are placed by a wrapper that patches the train process before the stage runs (the stage's own code is
what runs); each kill is asserted to have happened where it was meant to."""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow   # stage subprocesses, real training

SHORT = {"base": {"demos_per_task": 12, "steps": 40, "teach_steps": 20},
         "rl": {"tasks_per_step": 4, "group_size": 4},
         "train": {"steps": 6, "checkpoint_every": 2, "eval_per_task": 2}}
OUTPUTS = ("data/train", "reports/train.json", "reports/train_dashboard.json", "reports/metrics/train.json")

# Runs before the stage in the killed process: KILL_AT names the boundary, the process SIGKILLs itself there.
KILLER = """
import io, os, runpy, signal, sys
import torch
sys.path.insert(0, os.getcwd())
import agentrl.eval.evaluation as evaluation
import agentrl.rl.optim as optim
import agentrl.rl.resume as validation

where, _, at = os.environ["KILL_AT"].partition(":")
at = int(at)
def die():
    open("killed_at", "w").write(os.environ["KILL_AT"])
    os.kill(os.getpid(), signal.SIGKILL)

save, evaluate, adam_step = validation.save_checkpoint, evaluation.evaluate, optim.Adam.step
calls = {"adam": 0}
def save_checkpoint(model, path, tok_hash, extra=None):
    if where == "writing" and extra["step"] == at:   # the kill lands inside the write: half a file on disk
        buffer = io.BytesIO()
        torch.save({"state_dict": model.state_dict(), "extra": extra}, buffer)
        from agentrl.core.artifacts import temporary_path
        temporary_path(path).write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
        die()
    save(model, path, tok_hash, extra)
    if where == "written" and extra["step"] == at:
        die()
def evaluate_(*args, **kwargs):
    if where == "validation" and validation_step[0] == at:
        die()
    return evaluate(*args, **kwargs)
validation_step = [None]
checkpoint = validation.CheckpointHook._checkpoint
def _checkpoint(self, updates, state):
    validation_step[0] = updates
    return checkpoint(self, updates, state)
def step(self, *args, **kwargs):
    calls["adam"] += 1
    out = adam_step(self, *args, **kwargs)
    if where == "midstep" and calls["adam"] == at:   # between two minibatch updates of one step
        die()
    return out
validation.save_checkpoint, evaluation.evaluate = save_checkpoint, evaluate_
validation.CheckpointHook._checkpoint = _checkpoint
optim.Adam.step = step
runpy.run_module("stages.train", run_name="__main__")
"""


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/store.db", PYTHONPATH=str(tmp_path / "work"))
    return env


def _stage(work: Path, env: dict, name: str) -> None:
    out = subprocess.run([sys.executable, "-m", f"stages.{name}"], cwd=work, env=env, capture_output=True,
                         text=True, timeout=900)
    assert out.returncode == 0, out.stderr[-3000:]


def _outputs(work: Path) -> dict[str, bytes]:
    files = {}
    for rel in OUTPUTS:
        path = work / rel
        for p in ([path] if path.is_file() else sorted(q for q in path.rglob("*") if q.is_file())):
            files[p.relative_to(work).as_posix()] = p.read_bytes()
    return files


@pytest.fixture(scope="module")
def workspace(tmp_path_factory):
    """tasks and the (shortened) base built by their stages; the preflight gate as the file train requires."""
    tmp_path = tmp_path_factory.mktemp("resume")
    work = tmp_path / "work"
    work.mkdir()
    for name in ("agentrl", "stages"):
        shutil.copytree(REPO / name, work / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", work / "dvc.yaml")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    for section, values in SHORT.items():
        params[section].update(values)
    (work / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = _env(tmp_path)
    for name in ("tasks", "base"):
        _stage(work, env, name)
    (work / "data" / "preflight").mkdir(parents=True)
    (work / "data" / "preflight" / "gate.json").write_text('{"gate": "passed"}\n')
    _stage(work, env, "train")
    reference = _outputs(work)
    return work, env, reference


# (boundary, where): each kill happens in a process that resumed from the one before
KILLS = [("written:0", "right after the step-0 checkpoint is written"),
         ("midstep:3", "between the two minibatch updates of step 1 (resumed from step 0)"),
         ("validation:2", "while validating the step-2 policy"),
         ("writing:2", "while the step-2 checkpoint file is being written"),
         ("written:4", "right after the step-4 checkpoint is written")]


def test_sigkill_at_every_boundary_then_resume_gives_the_same_bytes(workspace):
    work, env, reference = workspace
    shutil.rmtree(work / "data" / "train")
    for name in ("reports/train.json", "reports/train_dashboard.json", "reports/metrics/train.json"):
        (work / name).unlink()
    (work / "killer.py").write_text(KILLER)
    for kill_at, what in KILLS:
        (work / "killed_at").unlink(missing_ok=True)
        out = subprocess.run([sys.executable, "killer.py"], cwd=work, env=env | {"KILL_AT": kill_at},
                             capture_output=True, text=True, timeout=900)
        assert out.returncode == -9 and (work / "killed_at").read_text() == kill_at, (what, out.stderr[-3000:])
        if kill_at.startswith("writing"):   # half a file for the next run to clear, not to resume from
            partial = [p for p in (work / "data" / "train").rglob("*.tmp") if p.is_file()]
            assert [p.name for p in partial] == ["step_0002.pt.tmp"]   # in the killed process's own directory
            assert re.fullmatch(r"\.\d+\.tmp", partial[0].parent.name), partial
    resumed = subprocess.run([sys.executable, "-m", "stages.train"], cwd=work, env=env, capture_output=True,
                             text=True, timeout=900)
    assert resumed.returncode == 0 and "resuming from checkpoint step 4" in resumed.stderr, resumed.stderr[-3000:]
    got = _outputs(work)
    assert sorted(got) == sorted(reference)
    assert [name for name in reference if got[name] != reference[name]] == []


def _clear_train(work: Path) -> None:
    shutil.rmtree(work / "data" / "train", ignore_errors=True)
    for name in ("reports/train.json", "reports/train_dashboard.json", "reports/metrics/train.json"):
        (work / name).unlink(missing_ok=True)


def _two_trains(work: Path, env: dict, wait: str) -> list[subprocess.CompletedProcess]:
    """Two `python -m stages.train` started together on one working copy. With a long wait the test holds the
    stage's lock until one of them says it waits, so that a waiter exists whatever the scheduling (a resumed run
    can finish before the other process has imported torch)."""
    from agentrl.pipeline.lock import stage_lock
    logs = [work.parent / f"train{i}.{s}" for i in range(2) for s in ("out", "err")]
    with contextlib.ExitStack() as held:
        if float(wait) >= 60:
            held.enter_context(stage_lock("train", work, wait=0))
        files = [held.enter_context(log.open("w")) for log in logs]
        procs = [subprocess.Popen([sys.executable, "-m", "stages.train"], cwd=work,
                                  env=env | {"AGENTRL_LOCK_WAIT": wait}, stdout=files[2 * i],
                                  stderr=files[2 * i + 1], text=True) for i in range(2)]
        deadline = time.monotonic() + 300
        while float(wait) >= 60 and time.monotonic() < deadline and \
                not any("waiting up to" in logs[k].read_text() for k in (1, 3)):
            time.sleep(0.1)
    codes = [p.wait(timeout=900) for p in procs]
    return [subprocess.CompletedProcess(p.args, code, logs[2 * i].read_text(), logs[2 * i + 1].read_text())
            for i, (p, code) in enumerate(zip(procs, codes))]


def test_two_writers_at_once_give_the_bytes_of_one(workspace):
    """Without resume (nothing on disk) and with it (a run killed after its step-2 checkpoint): with a long wait the
    second writer waits for the first, then resumes from its last checkpoint; with a short one it stops with one
    line naming the holder. Either way every output byte equals an uninterrupted run's."""
    work, env, reference = workspace
    (work / "killer.py").write_text(KILLER)
    for resume, wait in ((False, "600"), (True, "600"), (False, "0.5"), (True, "0.5")):
        _clear_train(work)
        if resume:
            out = subprocess.run([sys.executable, "killer.py"], cwd=work, env=env | {"KILL_AT": "written:2"},
                                 capture_output=True, text=True, timeout=900)
            assert out.returncode == -9, out.stderr[-3000:]
        a, b = _two_trains(work, env, wait)
        codes = sorted([a.returncode, b.returncode])
        if wait == "600":
            assert codes == [0, 0], (a.stderr[-2000:], b.stderr[-2000:])
            assert any("waiting up to 600 s for pid" in p.stderr for p in (a, b))
        else:
            assert codes == [0, 2], (a.stderr[-2000:], b.stderr[-2000:])
            refused = a if a.returncode == 2 else b
            assert refused.stderr.strip().splitlines()[-1].startswith(
                "error: train: its outputs are being written by pid "), refused.stderr
        got = _outputs(work)
        assert sorted(got) == sorted(reference), (resume, wait)
        assert [name for name in reference if got[name] != reference[name]] == [], (resume, wait)
