"""A stage that DVC runs and that refuses (exit 2, before any compute) or is interrupted leaves the workspace as it
found it: DVC deletes a stage's outputs before running its command, and the stage puts them back from the DVC cache
(agentrl.pipeline.restore), so `dvc status` shows only what the user changed."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.pipeline.restore import restore_outputs

REPO = Path(__file__).resolve().parents[1]
DVC = str(Path(sys.executable).parent / "dvc")


def _cache(root: Path, data: bytes) -> str:
    md5 = hashlib.md5(data).hexdigest()
    obj = root / ".dvc" / "cache" / "files" / "md5" / md5[:2] / md5[2:]
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(data)
    return md5


@pytest.fixture
def cached(tmp_path, monkeypatch):
    """A DVC repository laid out by hand: stage `s` has a directory output and a file output, both in the cache
    as dvc.lock records them, and neither in the workspace (as DVC leaves them just before running `s`)."""
    root = tmp_path / "repo"
    (root / ".dvc").mkdir(parents=True)
    (root / ".dvc" / "config").write_text("[core]\n    no_scm = true\n")
    files = {"a.json": b'{"a": 1}\n', "sub/b.json": b'{"b": 2}\n'}
    manifest = [{"md5": _cache(root, data), "relpath": rel} for rel, data in sorted(files.items())]
    text = json.dumps(manifest).encode()
    dir_md5 = hashlib.md5(text).hexdigest() + ".dir"
    obj = root / ".dvc" / "cache" / "files" / "md5" / dir_md5[:2] / dir_md5[2:]
    obj.parent.mkdir(parents=True, exist_ok=True)
    obj.write_bytes(text)
    single = _cache(root, b"model bytes")
    lock = {"schema": "2.0", "stages": {"s": {"cmd": "python s.py", "outs": [
        {"path": "data/out", "md5": dir_md5, "size": 18, "nfiles": 2, "hash": "md5"},
        {"path": "data/model.pt", "md5": single, "size": 11, "hash": "md5"},
        {"path": "reports/s.json", "hash": "md5", "md5": "0" * 32, "size": 3}]}}}   # uncached: never in the cache
    (root / "dvc.lock").write_text(yaml.safe_dump(lock))
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {"s": {"cmd": "python s.py", "outs": [
        "data/out", "data/model.pt", {"reports/s.json": {"cache": False, "persist": True}}]}}}))
    monkeypatch.setenv("DVC_STAGE", "s")
    monkeypatch.setenv("DVC_ROOT", str(root))
    return root, files


def test_a_stopped_stage_puts_back_what_dvc_removed(cached, capsys):
    root, files = cached
    (root / "reports").mkdir()
    (root / "reports" / "s.json").write_text("{}\n")   # an uncached output DVC kept (persist): left alone
    assert sorted(restore_outputs()) == ["data/model.pt", "data/out"]
    assert {p.relative_to(root / "data/out").as_posix(): p.read_bytes()
            for p in (root / "data/out").rglob("*") if p.is_file()} == files
    assert (root / "data/model.pt").read_bytes() == b"model bytes"
    assert (root / "reports/s.json").read_text() == "{}\n"
    assert capsys.readouterr().err == ""
    assert not list(root.rglob("*.restore"))
    assert restore_outputs() == []   # nothing missing: nothing to do


def test_an_output_the_stage_wrote_in_part_is_left_as_it_is(cached):
    root, _ = cached
    (root / "data" / "out").mkdir(parents=True)
    (root / "data" / "out" / "new.json").write_text("partial\n")
    assert restore_outputs() == ["data/model.pt"]
    assert [p.name for p in (root / "data/out").iterdir()] == ["new.json"]


def test_an_output_the_cache_lacks_is_one_warning_and_nothing_half_written(cached, capsys):
    root, _ = cached
    lock = yaml.safe_load((root / "dvc.lock").read_text())
    manifest_md5 = lock["stages"]["s"]["outs"][0]["md5"]
    manifest = json.loads((root / ".dvc/cache/files/md5" / manifest_md5[:2] / manifest_md5[2:]).read_text())
    gone = manifest[1]["md5"]
    (root / ".dvc/cache/files/md5" / gone[:2] / gone[2:]).unlink()   # one file of the directory is not cached
    assert restore_outputs() == ["data/model.pt"]
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("warning: s: its output data/out is missing and could not be put back from the DVC cache")
    assert not (root / "data" / "out").exists() and not list(root.rglob("*.restore"))


def test_outside_dvc_nothing_is_touched(cached, monkeypatch):
    root, _ = cached
    monkeypatch.delenv("DVC_STAGE")
    assert restore_outputs() == [] and not (root / "data").exists()


# ---------------------------------------------------------------- under DVC itself

DOWNSTREAM = "import json; print(len(json.load(open('data/tasks/tasks.json'))['tasks']), file=open('count.txt', 'w'))"


def _tree(root: Path) -> dict[str, str]:
    """Every file of the workspace but DVC's and git's own, the params file and the store: path -> md5."""
    skip = {".dvc", ".git", "mlflow.db", "mlartifacts", "params.yaml", "reports"}
    return {p.relative_to(root).as_posix(): hashlib.md5(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file() and p.relative_to(root).parts[0] not in skip}


def _run(args, root, env, check=True):
    out = subprocess.run(args, cwd=root, env=env, capture_output=True, text=True, timeout=600)
    if check:
        assert out.returncode == 0, (args, out.stdout[-2000:], out.stderr[-2000:])
    return out


def built_repo(root: Path, store: Path) -> dict:
    """A git + DVC repository at `root`: the `tasks` stage (its real script, from this checkout) and a stage that
    reads its output, built and committed. Returns the environment to run git, dvc and the stages with."""
    root.mkdir(parents=True)
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    (root / "dvc.yaml").write_text(yaml.safe_dump({"stages": {
        "tasks": {"cmd": "python -m stages.tasks", "params": ["tasks"], "outs": ["data/tasks"]},
        "count": {"cmd": f'python -c "{DOWNSTREAM}"', "deps": ["data/tasks"], "outs": ["count.txt"]}}}))
    env = {**os.environ, "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{store}",
           "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",   # the stages' python
           "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}
    env.pop("AGENTRL_DEBUG", None)
    for args in (["git", "init", "-q"], [DVC, "init", "-q"], [DVC, "repro", "-q"], ["git", "add", "-A"],
                 ["git", "commit", "-qm", "built"]):
        _run(args, root, env)
    return env


@pytest.mark.slow   # git, dvc and a real stage, several times
def test_a_refused_param_under_dvc_repro_and_dvc_exp_run_leaves_the_workspace_as_it_was(tmp_path):
    """The `tasks` stage and a stage that reads its output, built and committed; then a refused `tasks` param under
    `dvc repro` and under `dvc exp run -S`: the stage's one line, every output the same bytes, `dvc status` naming
    only the param."""
    root = tmp_path / "repo"
    env = built_repo(root, tmp_path / "mlflow.db")
    before = _tree(root)
    assert "data/tasks/tasks.json" in before and "count.txt" in before
    assert _run([DVC, "status", "--json"], root, env).stdout.strip() == "{}"

    params = yaml.safe_load((root / "params.yaml").read_text())
    params["tasks"]["families"] = ["no_such_family"]
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    for args in ([DVC, "repro"], [DVC, "exp", "run", "-S", "tasks.families=[no_such_family]"]):
        out = _run(args, root, env, check=False)
        ours = [line for line in out.stderr.splitlines() if line.startswith(("error:", "warning:"))]
        assert out.returncode != 0 and len(ours) == 1 and "tasks.families" in ours[0], out.stderr[-2000:]
        assert _tree(root) == before, args
        status = json.loads(_run([DVC, "status", "--json"], root, env).stdout)
        assert status == {"tasks": [{"changed deps": {"params.yaml": {"tasks": "modified"}}}]}, status
    _run(["git", "checkout", "-q", "params.yaml"], root, env)
    assert _run([DVC, "status", "--json"], root, env).stdout.strip() == "{}"


EARLY = """
import sys, time
sys.path.insert(0, REPO)
from agentrl.core import boundary
from agentrl.pipeline.restore import restore_outputs
boundary.end_quietly_on_signals("s", on_end=restore_outputs)
print("importing", flush=True)
time.sleep(60)   # the stage script importing torch
"""


@pytest.mark.slow   # a stage-like subprocess, signalled
def test_a_signal_while_the_stage_imports_puts_the_outputs_back_too(cached):
    root, files = cached
    p = subprocess.Popen([sys.executable, "-c", EARLY.replace("REPO", repr(str(REPO)))], cwd=root,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert p.stdout.readline().strip() == "importing"
    p.send_signal(15)
    _, err = p.communicate(timeout=120)
    assert p.returncode == 143 and err.splitlines() == [
        "error: s: terminated (SIGTERM) before it started; nothing was written"], err
    assert (root / "data/model.pt").read_bytes() == b"model bytes" and (root / "data/out/sub/b.json").is_file()


@pytest.mark.slow   # git, dvc and a real stage, with a params edit while it runs
def test_a_params_edit_while_dvc_runs_a_stage_records_nothing_and_audit_and_dvc_agree(tmp_path):
    """The issue's case: `dvc repro -s --force tasks`, and params.yaml edited after the stage read it. The stage
    ends in one line naming the key, DVC records nothing (dvc.lock as it was), every output is the bytes it was, and
    `dvc status` says the stage must rerun (audit reads DVC's status for a stage dvc.lock records: they agree)."""
    root = tmp_path / "repo"
    env = built_repo(root, tmp_path / "mlflow.db")
    before, lock = _tree(root), (root / "dvc.lock").read_text()
    proc = subprocess.Popen([DVC, "repro", "-s", "--force", "tasks"], cwd=root, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env={**env, "AGENTRL_RUN_DELAY": "params:8"})
    seen = []
    for line in proc.stderr:   # the stage has read params.yaml and holds before its run: now someone edits it
        seen.append(line)
        if "run creation held" in line:
            break
    assert any("run creation held" in line for line in seen), "".join(seen)[-2000:]
    params = yaml.safe_load((root / "params.yaml").read_text())
    params["tasks"]["families"] = ["minmax", "range"]   # a valid value: nothing refuses it at the start
    (root / "params.yaml").write_text(yaml.safe_dump(params))
    out, rest = proc.communicate(timeout=600)
    err = "".join(seen) + rest
    ours = [line for line in err.splitlines() if line.startswith("error:")]
    assert proc.returncode != 0 and len(ours) == 1, err[-3000:]
    assert ours[0].startswith("error: tasks: what it read changed while it ran: tasks.families ") and \
        "nothing recorded, its outputs put back as they were" in ours[0], ours
    assert (root / "dvc.lock").read_text() == lock and _tree(root) == before
    status = json.loads(_run([DVC, "status", "--json"], root, env).stdout)
    assert status == {"tasks": [{"changed deps": {"params.yaml": {"tasks": "modified"}}}]}, status
