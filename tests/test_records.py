"""Records that cannot lie: a stage whose params changed while it ran does not finish (so dvc.lock cannot describe
outputs it did not produce), converted weights are checked against the hashes their conversion wrote, a full disk
during a checkpoint write is the boundary's line naming the file and the free space, and a tracking store that
vanishes under a run is one line, exit 1, the outputs kept."""
from __future__ import annotations

import errno
import json
import os
import shutil
import time
from pathlib import Path

import pytest
import torch
import yaml

from agentrl.core import boundary
from agentrl.core.knobs import ConfigError
from agentrl.tracking.store import _client

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def project(tmp_path, monkeypatch, store_template):
    """A temp project (tests/test_boundary.py's): stage `probe` reads `select`, writes reports/probe.json, uncached
    and persistent like every report."""
    from test_boundary import _make_probe_project, enter_probe_project
    root = _make_probe_project(tmp_path)
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"probe": {
        "cmd": "python -m stages.probe", "deps": ["stages/probe.py", "data/in.json"], "params": ["select"],
        "outs": [{"reports/probe.json": {"cache": False, "persist": True}}, "data/out.json"]}}}))
    (root / "reports").mkdir()
    (root / "reports" / "probe.json").write_text('{"as": "before"}\n')
    monkeypatch.delenv("DVC_STAGE", raising=False)
    return enter_probe_project(root, tmp_path, monkeypatch, store_template)


def _stage(body):
    from agentrl.pipeline.stage import run_stage
    with pytest.raises(SystemExit) as exit_:
        run_stage("probe", ["select"], ["data/in.json"], body, numeric=False)
    return exit_.value.code


def _runs():
    client = _client(os.environ["MLFLOW_TRACKING_URI"])
    return client.search_runs([client.get_experiment_by_name("agentrl").experiment_id])


def _edit(path: Path, section: str, key: str, value) -> None:
    params = yaml.safe_load(path.read_text())
    params[section][key] = value
    path.write_text(yaml.safe_dump(params, sort_keys=False))


# ---------------------------------------------------------------- 1. params that changed while the stage ran

def test_a_stage_whose_params_changed_while_it_ran_does_not_finish(project, capsys):
    def body(ctx):
        assert ctx.params["select"].n_boot == 10000
        Path("reports/probe.json").write_text('{"as": "written under n_boot 10000"}\n')
        Path("data/out.json").write_text("{}\n")
        _edit(project / "params.yaml", "select", "n_boot", 20000)   # someone edits params.yaml meanwhile
    assert _stage(body) == 2
    lines = capsys.readouterr().err.strip().splitlines()
    assert lines == ["error: probe: what it read changed while it ran: select.n_boot 10000 -> 20000; nothing recorded, "
                     "its reports put back; its data outputs are as it wrote them, under the values it read at the "
                     "start: run it again"], lines
    assert (project / "reports/probe.json").read_text() == '{"as": "before"}\n'   # the report as it was
    assert not (project / "reports/provenance/probe.json").exists()              # no record of the run
    (run,) = _runs()
    assert run.info.status == "FAILED" and "changed while it ran" in run.data.tags["error"]


def test_under_dvc_the_rewritten_outputs_are_taken_back_for_the_cache_to_restore(project, monkeypatch, capsys):
    monkeypatch.setenv("DVC_STAGE", "probe")

    def body(ctx):
        Path("data/out.json").write_text("{}\n")
        Path("reports/new.json").write_text("{}\n")   # not an output: left alone
        _edit(project / "params.yaml", "select", "alpha", 0.1)
    assert _stage(body) == 2
    line = capsys.readouterr().err.strip().splitlines()[0]
    assert "select.alpha 0.05 -> 0.1" in line and "its outputs put back as they were" in line
    assert not (project / "data/out.json").exists()   # removed: restore_outputs puts dvc.lock's back from the cache
    assert (project / "reports/probe.json").read_text() == '{"as": "before"}\n'


def test_an_input_that_changed_while_the_stage_ran_is_named(project, capsys):
    def body(ctx):
        Path("data/in.json").write_text('{"x": 2}\n')
    assert _stage(body) == 2
    assert "data/in.json changed" in capsys.readouterr().err


def test_a_stage_whose_params_did_not_change_finishes_and_records(project, capsys):
    def body(ctx):
        Path("reports/probe.json").write_text('{"as": "after"}\n')
        _edit(project / "params.yaml", "test", "n_boot", 20000)   # a section this stage does not read
    from agentrl.pipeline.stage import run_stage
    run_stage("probe", ["select"], ["data/in.json"], body, numeric=False)
    assert (project / "reports/probe.json").read_text() == '{"as": "after"}\n'
    assert (project / "reports/provenance/probe.json").is_file()


def test_the_moved_keys_are_named_old_and_new():
    from agentrl.pipeline.unchanged import moved_keys
    assert moved_keys({"rl.lr": 0.0003, "a": 1}, {"rl.lr": 0.0009, "a": 1, "b": [1]}) == [
        "b (absent) -> [1]", "rl.lr 0.0003 -> 0.0009"]


def test_the_declared_outputs_of_a_matrix_instance_are_resolved_from_dvc_yaml():
    from agentrl.pipeline.unchanged import declared_outputs
    outs = dict(declared_outputs("lab@smollm2-3", REPO))
    assert outs["reports/labs/smollm2/seed3.json"] is False and outs["data/labs/smollm2/seed3"] is False
    assert dict(declared_outputs("ablate@kl-1", REPO))["data/ablate/kl-1"] is True


# ---------------------------------------------------------------- 2. weights checked where they are loaded

def _converted(tmp_path: Path) -> Path:
    from agentrl.backends.pretrained import SOURCE_FILE, written_hashes
    d = tmp_path / "tiny"
    d.mkdir()
    (d / "model.safetensors").write_bytes(bytes(range(256)) * 64)
    (d / "config.json").write_text('{"model_type": "llama"}\n')
    (d / SOURCE_FILE).write_text(json.dumps({"name": "tiny", "files": written_hashes(d)}))
    return d


def test_converted_weights_are_checked_against_the_hashes_their_conversion_wrote(tmp_path):
    from agentrl.backends.pretrained import sha256_file, verified_weights
    d = _converted(tmp_path)
    assert verified_weights(d, "lab.model") == {"model.safetensors": sha256_file(d / "model.safetensors")}
    data = bytearray((d / "model.safetensors").read_bytes())
    data[8000:8016] = b"\xff" * 16   # 16 bytes in the middle, as the case
    (d / "model.safetensors").write_bytes(bytes(data))
    t0 = time.time()
    with pytest.raises(ConfigError) as err:
        verified_weights(d, "lab.model")
    text = str(err.value)
    assert text.startswith(f"lab.model: {d / 'model.safetensors'} is not the file its conversion wrote (sha256 ")
    assert text.endswith("altered or damaged; rerun `python -m stages.pretrained --model tiny`") and "\n" not in text
    assert time.time() - t0 < 1
    (d / "config.json").unlink()
    with pytest.raises(ConfigError, match="config.json is missing from the converted directory"):
        verified_weights(d, "lab.model")


def test_a_directory_no_conversion_wrote_has_its_weights_hashed_as_they_are(tmp_path):
    from agentrl.backends.pretrained import sha256_file, verified_weights
    d = tmp_path / "mine"
    d.mkdir()
    (d / "model.safetensors").write_bytes(b"w" * 100)
    (d / "tokenizer.json").write_text("{}")
    assert verified_weights(d, "lab.model") == {"model.safetensors": sha256_file(d / "model.safetensors")}


def test_a_lab_refuses_altered_weights_before_they_load(tmp_path, monkeypatch):
    from agentrl.core.config import lab_run
    from agentrl.labs import recipe
    d = _converted(tmp_path)
    (d / "model.safetensors").write_bytes(b"altered")
    monkeypatch.setattr("agentrl.backends.hf.check_model_dir", lambda path, field: Path(path))
    monkeypatch.setattr("agentrl.backends.hf.load_model", lambda *a, **k: pytest.fail("the weights were loaded"))
    with pytest.raises(ConfigError, match="is not the file its conversion wrote"):
        recipe.load_policy(lab_run("x", {"model": str(d)}), 0, tmp_path / "small")


def test_a_labs_report_names_the_weights_it_loaded(repo_root):
    from agentrl.labs.report import lab_report
    numbers = json.loads((repo_root / "reports/labs/direct/smollm2-cuda-fp32.json").read_text())
    record = {k: v for k, v in numbers.items() if k not in ("held_out", "training", "device_run")}
    _, md = lab_report({**record, "history": [], "weights_sha256": {"model.safetensors": "ab" * 32}})
    assert f"Weights loaded: model.safetensors sha256 {'ab' * 8}." in md
    assert "Weights loaded" not in lab_report({**record, "history": []})[1]   # a record from before


# ---------------------------------------------------------------- 3. a full disk during a checkpoint write

def _short_write(monkeypatch, free: int):
    """torch.save as it fails on a full disk: part of the file written, then its stream writer's RuntimeError."""
    def save(obj, path):
        Path(path).write_bytes(b"PK" + b"\0" * 1000)
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 801536 vs 801428")
    monkeypatch.setattr(torch, "save", save)
    monkeypatch.setattr(shutil, "disk_usage", lambda p: shutil._ntuple_diskusage(10 * 2**20, 10 * 2**20 - free, free))


def test_a_full_disk_during_a_checkpoint_write_is_the_boundarys_line_naming_the_file(tmp_path, monkeypatch, capsys):
    from agentrl.model.checkpoints import save_policy
    from agentrl.model.policy import ModelConfig, TinyAgent
    model = TinyAgent(ModelConfig(vocab_size=20, d_model=8, n_layer=1, n_head=2, d_ff=16, max_len=64))
    _short_write(monkeypatch, free=4096)
    path = tmp_path / "checkpoints" / "step_0010.pt"
    assert boundary.guard("train", save_policy, path, model, "tok") == 1
    assert capsys.readouterr().err.strip().splitlines() == [
        f"error: train: cannot write {path}: No space left on device (4.0 KiB free on that filesystem); free "
        "space on that filesystem and run again"]
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == []   # no temporary left behind


def test_a_short_write_with_room_left_is_an_io_error_not_a_full_disk(tmp_path, monkeypatch):
    from agentrl.core.writer import write_file
    _short_write(monkeypatch, free=5 * 2**30)
    with pytest.raises(OSError) as err:
        write_file(tmp_path / "x.pt", lambda tmp: torch.save({}, tmp))
    assert err.value.errno == errno.EIO and err.value.filename == str(tmp_path / "x.pt")
    assert list(tmp_path.iterdir()) == []


def test_a_model_directory_is_written_whole_or_not_at_all(tmp_path):
    from agentrl.core.writer import write_directory
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "old.bin").write_text("old")

    def half(d):
        (d / "weights.bin").write_text("half")
        raise OSError(errno.ENOSPC, "No space left on device")
    with pytest.raises(OSError) as err:
        write_directory(tmp_path / "m", half)
    assert err.value.filename == str(tmp_path / "m") and "free on that filesystem" in err.value.strerror
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"] and (tmp_path / "m" / "old.bin").is_file()
    write_directory(tmp_path / "m", lambda d: (d / "weights.bin").write_text("whole"))
    assert sorted(p.name for p in (tmp_path / "m").iterdir()) == ["weights.bin"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["m"]


# ---------------------------------------------------------------- 4. a store that vanishes under a run

def test_a_store_deleted_while_the_run_is_open_is_one_line_exit_1_and_the_outputs_are_kept(project, capsys):
    def body(ctx):
        Path("reports/probe.json").write_text('{"as": "after"}\n')
        os.remove(os.environ["MLFLOW_TRACKING_URI"][len("sqlite:///"):])
        for step in range(3):
            ctx.run.log_metrics({"loss": 1.0 / (step + 1)}, step=step)
    assert _stage(body) == 1
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err and "read-only" not in err, err[-3000:]
    assert lines[0].startswith("error: MLflow tracking store: its database file ") and "was deleted while the run " \
        "was open; the stage's outputs are kept" in lines[0] and len(lines[0]) < 400
    assert (project / "reports/probe.json").read_text() == '{"as": "after"}\n'
    log = Path(lines[0].split("the store's errors: ")[1].rstrip(")"))
    assert "attempt to write a readonly database" in log.read_text()   # SQLite's words, kept out of the terminal


# ---------------------------------------------------------------- 5. the process that ran the stage goes away

PARENT = """
import os, subprocess, sys, time
child = subprocess.Popen([sys.executable, sys.argv[1]], stdout=subprocess.PIPE, stderr=open(sys.argv[2], "w"),
                         text=True, env={**os.environ, "DVC_STAGE": "probe"})
assert child.stdout.readline().strip() == "holding"
print(child.pid, flush=True)
time.sleep(300)
"""
HOLDING = """
import sys, time
sys.path.insert(0, REPO)
from pathlib import Path
from agentrl.pipeline.stage import run_stage
def body(ctx):
    print("holding", flush=True)
    time.sleep(120)
    Path("reports/probe.json").write_text("{}")
run_stage("probe", ["select"], ["data/in.json"], body, numeric=False)
"""


@pytest.mark.slow   # two processes, one of them killed
def test_a_stage_whose_dvc_process_is_killed_ends_killed_saying_so(project, tmp_path):
    """SIGTERM to `dvc exp exec-run` (or SIGKILL to `dvc repro`) orphaned the stage, which wrote on into the queued
    experiment's deleted copy and failed on a missing directory ("unexpected FileNotFoundError"). It now ends KILLED
    within seconds, its reason the parent that went away; no run is left RUNNING."""
    import signal
    import subprocess
    import sys
    (tmp_path / "stage.py").write_text(HOLDING.replace("REPO", repr(str(REPO))))
    (tmp_path / "parent.py").write_text(PARENT)
    parent = subprocess.Popen([sys.executable, str(tmp_path / "parent.py"), str(tmp_path / "stage.py"),
                               str(tmp_path / "stage.err")], cwd=project, stdout=subprocess.PIPE, text=True)
    child = int(parent.stdout.readline())
    parent.send_signal(signal.SIGKILL)
    parent.wait(timeout=30)
    deadline = time.time() + 30
    while time.time() < deadline:
        try:
            os.kill(child, 0)
        except ProcessLookupError:
            break
        time.sleep(0.2)
    else:
        os.kill(child, signal.SIGKILL)
        pytest.fail("the orphaned stage went on")
    (run,) = _runs()
    assert run.info.status == "KILLED", run.info.status
    assert run.data.tags["killed_reason"].startswith("probe: terminated (the DVC process that ran it, pid ")
    assert (tmp_path / "stage.err").read_text().strip().splitlines()[-1].startswith(
        "error: probe: terminated (the DVC process that ran it")
    assert (project / "reports/probe.json").read_text() == '{"as": "before"}\n'


FULL_DISK = """
import sys
sys.path.insert(0, REPO)
from agentrl.core import boundary
from agentrl.model.checkpoints import save_policy
from agentrl.model.policy import ModelConfig, TinyAgent
model = TinyAgent(ModelConfig(vocab_size=200))   # ~170k parameters: ~0.7 MB, more than the filesystem holds
sys.exit(boundary.guard("train", save_policy, sys.argv[1] + "/checkpoints/step_0010.pt", model, "tok"))
"""


@pytest.mark.slow   # a subprocess in a private mount namespace
def test_a_checkpoint_written_to_a_really_full_disk_is_one_line_and_leaves_nothing(tmp_path):
    """The issue's case on a real filesystem: a 512 KiB tmpfs, torch.save's short write (its RuntimeError) is the
    boundary's disk-full line naming the checkpoint and the space left, and no temporary stays behind."""
    import subprocess
    import sys
    if subprocess.run(["unshare", "-rm", "true"], capture_output=True).returncode != 0:
        pytest.skip("needs `unshare -rm` to mount a small filesystem")
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    (tmp_path / "save.py").write_text(FULL_DISK.replace("REPO", repr(str(REPO))))
    cmd = (f"mount -t tmpfs -o size=512k none {mnt} && {sys.executable} {tmp_path / 'save.py'} {mnt}; code=$?; "
           f"ls -A {mnt}/checkpoints; exit $code")
    out = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], capture_output=True, text=True, timeout=300)
    lines = out.stderr.strip().splitlines()
    assert out.returncode == 1 and len(lines) == 1, out.stderr[-2000:]
    assert lines[0].startswith(f"error: train: cannot write {mnt}/checkpoints/step_0010.pt: No space left on device (")
    assert "free on that filesystem); free space on that filesystem and run again" in lines[0]
    assert out.stdout.strip() == ""   # the checkpoints directory holds no temporary
