"""A store that cannot serve a stage is one line naming it, within seconds: a `file:` URI (MLflow 3 refuses the
file store), a store locked by another writer (waited for a bounded time, then named as locked: never "move it
aside"), a read-only filesystem, a full disk (at the start, and mid-run)."""
from __future__ import annotations

import os
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.tracking import schemes, store
from agentrl.tracking.store import StoreError, probe

REPO = Path(__file__).resolve().parents[1]


def test_a_file_uri_is_refused_in_one_line_naming_the_way_out(monkeypatch):
    monkeypatch.delenv("MLFLOW_ALLOW_FILE_STORE", raising=False)
    t0 = time.time()
    with pytest.raises(StoreError) as err:
        probe("file:///tmp/mlruns")
    assert "file:///tmp/mlruns: MLflow 3 refuses the file store" in str(err.value) and "sqlite:///" in str(err.value)
    assert "\n" not in str(err.value) and time.time() - t0 < 1


@pytest.mark.parametrize("uri, needs", [("postgresql://u@localhost/db", "psycopg2"),
                                        ("mysql+pymysql://u@localhost/db", "pymysql"),
                                        ("mssql://u@localhost/db", "pyodbc"), ("databricks", "no store for"),
                                        ("redis://localhost", "no store for")])
def test_a_scheme_this_install_cannot_serve_is_one_line_naming_what_is_supported(uri, needs, monkeypatch):
    monkeypatch.setattr(schemes, "_installed", lambda module: False)   # whatever the machine has installed
    with pytest.raises(StoreError) as err:
        probe(uri)
    text = str(err.value)
    assert text.startswith(f"MLflow tracking store {uri}: ") and needs in text and "\n" not in text
    assert text.endswith("supported here: sqlite:///PATH, http(s)://HOST[:PORT]")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "databricks")
    assert store.tracking_uri(REPO) == "databricks"   # a name, not a local directory


def test_a_database_whose_driver_is_installed_passes_the_scheme_check(monkeypatch):
    monkeypatch.setattr(schemes, "_installed", lambda module: module == "psycopg2")
    assert schemes.scheme_problem("postgresql://u@h/db") is None and schemes.scheme_problem("sqlite:///x.db") is None
    assert "psycopg" in schemes.scheme_problem("postgresql+psycopg://u@h/db")


def test_a_locked_store_is_named_as_locked_after_a_bounded_wait(tmp_path, store_template, monkeypatch):
    db = tmp_path / "mlflow.db"
    shutil.copy(store_template, db)
    monkeypatch.setattr(store, "LOCK_WAIT", 0.5)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")   # another writer, mid-transaction
    try:
        t0 = time.time()
        with pytest.raises(StoreError) as err:
            probe(f"sqlite:///{db}")
        assert 0.4 < time.time() - t0 < 3
    finally:
        holder.execute("ROLLBACK")
        holder.close()
    msg = str(err.value)
    assert "locked by another process for more than 0.5 s" in msg and "move it aside" not in msg
    probe(f"sqlite:///{db}")      # released: fine again
    probe(f"sqlite:///{db}", write=False)


def test_a_reader_does_not_need_the_write_lock(tmp_path, store_template):
    db = tmp_path / "mlflow.db"
    shutil.copy(store_template, db)
    holder = sqlite3.connect(db, isolation_level=None)
    holder.execute("BEGIN IMMEDIATE")
    try:
        probe(f"sqlite:///{db}", write=False)   # audit reads while a stage writes
    finally:
        holder.execute("ROLLBACK")
        holder.close()


def test_a_store_that_fails_mid_run_is_one_line():
    def full():
        raise sqlite3.OperationalError("database or disk is full")
    with pytest.raises(StoreError) as err:
        store._retry(full)
    assert str(err.value).endswith("the disk is full: free space and run again") and "\n" not in str(err.value)


STAGE = """
import sys
sys.path.insert(0, REPO)
from agentrl.pipeline.stage import run_stage
run_stage("probe", ["select"], ["data/in.json"], lambda ctx: print("ran"), numeric=False)
"""


def _unshare_ok() -> bool:
    if not shutil.which("unshare"):
        return False
    return subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m none /mnt 2>/dev/null || "
                           "mount -t tmpfs -o size=1m none \"$TMPDIR\""], capture_output=True).returncode == 0


@pytest.mark.slow   # a stage subprocess each, in a private mount namespace
@pytest.mark.skipif(not _unshare_ok(), reason="needs `unshare -rm` to mount a small or read-only filesystem")
@pytest.mark.parametrize("case", ["read-only", "full", "locked", "file-uri"])
def test_a_stage_on_an_unusable_store_is_one_line_within_10_s(tmp_path, store_template, case):
    from test_boundary import _make_probe_project
    root = _make_probe_project(tmp_path)
    mnt = tmp_path / "mnt"
    mnt.mkdir()
    shutil.copy(store_template, tmp_path / "template.db")
    uri = f"sqlite:///{mnt}/mlflow.db"
    setup = f"mount -t tmpfs -o size=4m none {mnt} && cp {tmp_path}/template.db {mnt}/mlflow.db"
    if case == "read-only":
        setup += f" && mount -o remount,ro {mnt}"
    elif case == "full":
        setup += f" && (dd if=/dev/zero of={mnt}/filler bs=64k 2>/dev/null; true)"
    elif case == "locked":   # a writer holding the store for 60 s
        setup += (f" && ({sys.executable} -c \"import sqlite3,time; c=sqlite3.connect('{mnt}/mlflow.db', "
                  f"isolation_level=None); c.execute('BEGIN IMMEDIATE'); open('{tmp_path}/held','w'); "
                  f"time.sleep(20)\" >/dev/null 2>&1 &) && while [ ! -e {tmp_path}/held ]; do sleep 0.1; done")
    elif case == "file-uri":
        uri = f"file://{mnt}/mlruns"
    (tmp_path / "stage.py").write_text(STAGE.replace("REPO", repr(str(REPO))))
    cmd = f"{setup} && MLFLOW_TRACKING_URI='{uri}' {sys.executable} {tmp_path}/stage.py"
    t0 = time.time()
    out = subprocess.run(["unshare", "-rm", "sh", "-c", cmd], cwd=root, capture_output=True, text=True, timeout=120)
    elapsed = time.time() - t0
    lines = out.stderr.strip().splitlines()
    expected = {"read-only": "read-only filesystem", "full": "no space left", "locked": "locked by another process",
                "file-uri": "refuses the file store"}[case]
    assert out.returncode == 2 and len(lines) == 1 and expected in lines[0], out.stderr[-3000:]
    assert "move it aside" not in lines[0] and "ran" not in out.stdout
    print(f"{case}: exit {out.returncode} in {elapsed:.1f} s: {lines[0]}")
    assert elapsed < 10


@pytest.mark.slow   # a CLI subprocess
def test_output_to_a_full_disk_is_one_line_and_exit_1():
    """`python -m agentrl <verb> > file` on a full disk (here /dev/full): one line, no exit-time traceback."""
    if not Path("/dev/full").exists():
        pytest.skip("no /dev/full")
    with open("/dev/full", "w") as full:
        out = subprocess.run([sys.executable, "-m", "agentrl", "envcheck", "--episodes", "1"], cwd=REPO, stdout=full,
                             stderr=subprocess.PIPE, text=True, timeout=120)
    assert out.returncode == 1 and out.stderr.strip().splitlines() == [
        "error: agentrl envcheck: cannot write its output: No space left on device; free space on that filesystem "
        "and run again"], out.stderr


def test_a_store_path_through_a_file_or_a_missing_directory_is_refused_not_invented(tmp_path):
    (tmp_path / "afile").write_text("x")
    cases = [(tmp_path / "afile" / "x" / "mlflow.db", f"{tmp_path / 'afile'} is a file, not a directory"),
             (tmp_path / "does" / "not" / "exist" / "mlflow.db",
              f"the directory {tmp_path / 'does' / 'not' / 'exist'} does not exist"),
             (tmp_path, f"{tmp_path} is a directory, not a database file")]
    for db, fragment in cases:
        for write in (True, False):
            t0 = time.time()
            with pytest.raises(StoreError) as err:
                probe(f"sqlite:///{db}", write=write)
            text = str(err.value)
            assert text.startswith(f"MLflow tracking store {db}: {fragment}") and "\n" not in text, text
            assert time.time() - t0 < 1
        with pytest.raises(StoreError, match="does not exist|is a file|is a directory"):
            store._client(f"sqlite:///{db}")   # a caller that did not probe is refused as well
    assert not (tmp_path / "does").exists()   # nothing created on the way


NEW_STORE_STAGE = """
import sys
sys.path.insert(0, REPO)
from agentrl.pipeline.stage import run_stage
run_stage("probe", ["select"], ["data/in.json"], lambda ctx: None, numeric=False)
"""


@pytest.mark.slow   # a stage subprocess each
@pytest.mark.parametrize("where", ["through-a-file", "missing-directory", "new-default"])
def test_a_stage_refuses_a_store_path_it_would_have_to_invent_and_creates_only_where_pointed(tmp_path, where):
    from test_boundary import _make_probe_project
    root = _make_probe_project(tmp_path)
    (tmp_path / "stage.py").write_text(NEW_STORE_STAGE.replace("REPO", repr(str(REPO))))
    (tmp_path / "afile").write_text("x")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "AGENTRL_"))}
    env["DVC_ROOT"] = str(root)
    db = {"through-a-file": tmp_path / "afile" / "x" / "mlflow.db",
          "missing-directory": tmp_path / "does" / "not" / "exist" / "mlflow.db"}.get(where)
    if db is not None:
        env["MLFLOW_TRACKING_URI"] = f"sqlite:///{db}"
    t0 = time.time()
    out = subprocess.run([sys.executable, str(tmp_path / "stage.py")], cwd=root, env=env, capture_output=True,
                         text=True, timeout=120)
    lines = out.stderr.strip().splitlines()
    if db is None:   # the default store, sqlite:///mlflow.db in the project root, does not exist yet
        assert out.returncode == 0 and lines == [f"warning: MLflow tracking store {root / 'mlflow.db'} did not "
                                                 "exist: created it, empty"], out.stderr
        assert (root / "mlflow.db").is_file()
        return
    assert out.returncode == 2 and len(lines) == 1 and lines[0].startswith(f"error: MLflow tracking store {db}: ")
    assert time.time() - t0 < 30 and not (tmp_path / "does").exists() and not (root / "mlflow.db").exists()


def test_the_early_check_of_a_stage_refuses_the_store_before_torch(tmp_path, monkeypatch):
    """stages/__init__.py's check probes the store too: a store path through a file is refused before the stage
    module imports torch (a numeric stage's seconds), by the same line."""
    from agentrl.pipeline import early
    (tmp_path / "afile").write_text("x")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", f"sqlite:///{tmp_path / 'afile' / 'mlflow.db'}")
    monkeypatch.setenv("DVC_ROOT", str(tmp_path))
    with pytest.raises(StoreError, match=f"{tmp_path / 'afile'} is a file, not a directory"):
        early._check("tasks", None, str(REPO / "params.yaml"))
    monkeypatch.setenv("AGENTRL_TRACKING_DEFER", str(tmp_path / "kept"))   # a sweep worker: no store to probe
    early._check("tasks", None, str(REPO / "params.yaml"))
