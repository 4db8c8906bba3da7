"""A write the machine refuses is one line naming the file the user knows (reports/selection.json), never the
temporary the bytes went through (reports/selection.json.<pid>.tmp, gone by the time the line is read); the old
file stays whole and no temporary is left behind."""
from __future__ import annotations

import errno
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from agentrl.core import artifacts, boundary


def _refuse_rename(monkeypatch, err=errno.EPERM, text="Operation not permitted"):
    """os.replace refused as the kernel refuses renaming over an immutable file: naming the temporary first."""
    real = os.replace

    def refused(src, dst, *args, **kwargs):
        if str(src).endswith(".tmp"):
            raise OSError(err, text, str(src), str(dst))
        return real(src, dst, *args, **kwargs)
    monkeypatch.setattr(os, "replace", refused)


def _writers(tmp_path):
    from agentrl.tracking.records import write_index, write_record
    target = tmp_path / "reports" / "selection.json"
    return [("write_json", target, lambda: artifacts.write_json(target, {"chosen": 2})),
            ("write_record", tmp_path / "prov" / "select.json",
             lambda: write_record(tmp_path / "prov" / "select.json", {"stage": "select"})),
            ("write_index", tmp_path / "prov" / "README.md", lambda: write_index(tmp_path / "prov"))]


@pytest.mark.parametrize("which", [0, 1, 2], ids=["write_json", "write_record", "write_index"])
def test_a_refused_rename_names_the_file_not_its_temporary(tmp_path, monkeypatch, capsys, which):
    name, target, write = _writers(tmp_path)[which]
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text("old\n")
    _refuse_rename(monkeypatch)
    assert boundary.guard("select", write) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == (f"error: select: cannot write {target}: Operation not permitted; check the permissions and "
                    "attributes of that path (ls -l, lsattr: immutable?)"), line
    assert target.read_text() == "old\n" and not list(target.parent.glob("*.tmp"))


def test_a_full_disk_while_writing_names_the_file(tmp_path, monkeypatch, capsys):
    target = tmp_path / "reports" / "test.json"

    def full(self, data):
        raise OSError(errno.ENOSPC, "No space left on device", str(self))
    monkeypatch.setattr(Path, "write_bytes", full)
    assert boundary.guard("test", artifacts.write_json, target, {"x": 1}) == 1
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert f"cannot write {target}: No space left on device" in line and ".tmp" not in line


def test_a_refused_checkpoint_and_resume_record_name_their_files(tmp_path, monkeypatch, make_model, tok):
    from agentrl.model.checkpoints import save_policy
    from agentrl.rl import resume
    _refuse_rename(monkeypatch)
    path = tmp_path / "step_0001.pt"
    with pytest.raises(OSError) as err:
        save_policy(path, make_model(), tok.hash)
    assert err.value.filename == str(path) and not path.exists()
    monkeypatch.setattr(resume, "RESUME_FILE", tmp_path / "resume" / "train.json")
    with pytest.raises(OSError) as err:
        resume.write_resume("k", 1.0, [])
    assert err.value.filename == str(tmp_path / "resume" / "train.json")
    assert not list(tmp_path.rglob("*.tmp")) or all(p.is_dir() for p in tmp_path.rglob("*.tmp"))


def _chattr(path: Path, flag: str) -> bool:
    return shutil.which("chattr") is not None and \
        subprocess.run(["chattr", flag, str(path)], capture_output=True).returncode == 0


def test_an_immutable_report_is_named(tmp_path, capsys):
    """The case of the issue, for real where the filesystem has the attribute (`chattr +i`, as root)."""
    target = tmp_path / "reports" / "selection.json"
    target.parent.mkdir()
    target.write_text("old\n")
    if not _chattr(target, "+i"):
        pytest.skip("chattr +i is not available here (needs root and a filesystem with the attribute)")
    try:
        assert boundary.guard("select", artifacts.write_json, target, {"chosen": 2}) == 1
    finally:
        _chattr(target, "-i")
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith(f"error: select: cannot write {target}: Operation not permitted"), line
    assert target.read_text() == "old\n" and not list(target.parent.glob("*.tmp"))
