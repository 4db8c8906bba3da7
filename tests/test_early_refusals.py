"""What is refused before any compute, in one line: params files as bytes (size, encoding, depth, integer digits,
aliases), files that are not regular files, an outside ISA the CPU cannot run, a second writer of a stage's
outputs; and the stage declarations the early check reads from the scripts' source."""
from __future__ import annotations

import importlib
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from agentrl.core import files, numerics, strict_yaml
from agentrl.core.config import ParamsError, read_params_file
from agentrl.pipeline import early, lock

REPO = Path(__file__).resolve().parents[1]
GOOD = (REPO / "params.yaml").read_bytes()


@pytest.mark.parametrize("data,fragment", [
    (GOOD.replace(b"seed: 0 ", b"seed: " + b"7" * 5000 + b" "), "line 5: an integer of 5,000 digits (at most 40)"),
    (GOOD.replace(b"# every random", b"# \xe9very random"), "line 5, column 22: byte 0xe9 is not UTF-8"),
    (GOOD + b"junk: " + b"[" * 3000 + b"]" * 3000 + b"\n", "nested deeper than 64 levels"),
    (GOOD + b"#" + b"x" * (2 << 20) + b"\n", "the params file is 2.0 MiB, more than the 1.0 MiB allowed"),
    (b"a: &a [1,1,1,1,1,1,1,1,1,1]\nb: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\nc: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n"
     b"d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\ne: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\nf: [*e,*e]\n",
     "345,685 values with its aliases expanded (at most 200,000)"),
])
def test_a_malformed_params_file_is_one_line(tmp_path, data, fragment):
    path = tmp_path / "params.yaml"
    path.write_bytes(data)
    with pytest.raises(ParamsError) as err:
        read_params_file(path)
    assert fragment in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_byte_order_mark_and_merge_keys_still_parse(tmp_path):
    path = tmp_path / "params.yaml"
    path.write_bytes(b"\xef\xbb\xbf" + GOOD)
    assert read_params_file(path)["run"]["seed"] == 0
    assert strict_yaml.load("a: &x {k: 1}\nb: {<<: *x, k: 2}\n") == {"a": {"k": 1}, "b": {"k": 2}}


def test_files_that_are_not_regular_are_refused_before_a_read(tmp_path):
    zero = tmp_path / "base.pt"
    zero.symlink_to("/dev/zero")
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for path, kind in ((zero, "a character device"), (fifo, "a FIFO"), (tmp_path, "a directory")):
        started = time.monotonic()
        with pytest.raises(files.InputFileError, match=kind):
            files.read_bytes(path)
        assert time.monotonic() - started < 5   # no wait on the FIFO's writer, no endless read of /dev/zero
    big = tmp_path / "big.json"
    big.write_bytes(b"0" * 2000)
    with pytest.raises(files.InputFileError, match="2,000 bytes, more than the 1,000 bytes allowed"):
        files.read_bytes(big, limit=1000)
    from agentrl.tracking.provenance import file_hash
    with pytest.raises(files.InputFileError, match="a character device"):
        file_hash(zero)


def test_an_outside_isa_the_cpu_cannot_run_is_refused(monkeypatch):
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "avx512")
    with pytest.raises(numerics.NumericsError, match="lacks avx512f, avx512bw, avx512vl, avx512dq; unset it or set "
                                                     "one of default, avx2"):
        numerics.check_outside_isa(flags={"avx2", "fma", "sse2"})
    numerics.check_outside_isa(flags={"avx2", "fma", "avx512f", "avx512bw", "avx512vl", "avx512dq"})
    monkeypatch.setenv("ATEN_CPU_CAPABILITY", "AVX2")   # torch would silently take the best ISA
    with pytest.raises(numerics.NumericsError, match="expected one of default, avx2, avx512"):
        numerics.check_outside_isa(flags={"avx2", "fma"})


def test_the_early_check_reads_each_stage_as_its_module_declares_it():
    import ast
    for script in sorted((REPO / "stages").glob("*.py")):
        if script.stem == "__init__":
            continue
        sections, numeric = early.stage_declaration(script.stem)
        module = importlib.import_module(f"stages.{script.stem}")
        assert sections == list(module.SECTIONS), script.stem
        calls = [n for n in ast.walk(ast.parse(script.read_text())) if isinstance(n, ast.Call)
                 and getattr(n.func, "id", None) == "run_stage"]
        assert len(calls) == 1, script.stem
        assert numeric == (script.stem not in {"tasks", "humaneval", "select", "report"}), script.stem
    assert early.stage_declaration("no_such_stage") is None


def test_a_bad_param_is_refused_before_torch_is_imported(tmp_path):
    (tmp_path / "params.yaml").write_bytes(GOOD.replace(b"lr: 0.0003", b"lr: -1"))
    (tmp_path / "stages").symlink_to(REPO / "stages")
    probe = ("import runpy, sys; sys.argv = ['x']; sys.orig_argv = [sys.executable, '-m', 'stages.train']\n"
             "try:\n    import stages\nexcept SystemExit as e:\n"
             "    print('torch' in sys.modules, e.code)")
    out = subprocess.run([sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                         env=os.environ | {"PYTHONPATH": str(REPO)})
    assert out.stdout.split() == ["False", "2"], out.stderr
    assert out.stderr.strip() == "error: params.yaml: rl.lr: expected a finite number > 0, got -1"


def test_a_second_writer_waits_then_names_the_holder(tmp_path):
    holder = subprocess.Popen([sys.executable, "-c", "import sys, time; from agentrl.pipeline.lock import stage_lock\n"
                               "with stage_lock('train', sys.argv[1]):\n    print('held', flush=True); time.sleep(60)",
                               str(tmp_path)], stdout=subprocess.PIPE, text=True, env=os.environ | {
                                   "PYTHONPATH": str(REPO)})
    try:
        assert holder.stdout.readline().strip() == "held"
        started = time.monotonic()
        with pytest.raises(lock.LockHeld, match=rf"train: its outputs are being written by pid {holder.pid} on "):
            with lock.stage_lock("train", tmp_path, wait=0.5):
                pass
        assert 0.5 <= time.monotonic() - started < 10
        with lock.stage_lock("ablate@kl-0", tmp_path, wait=0):   # another output set: not held
            pass
    finally:
        holder.kill()
        holder.wait()
    with lock.stage_lock("train", tmp_path, wait=0):   # the kernel released the killed holder's lock
        pass


def test_an_input_that_is_a_symlink_to_a_device_is_named_as_the_input(tmp_path, monkeypatch):
    """The line names the input the stage reads (its path in the project), not where a symlink points."""
    from agentrl.tracking.provenance import build_provenance
    monkeypatch.chdir(tmp_path)
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "base.pt").symlink_to("/dev/zero")
    with pytest.raises(files.InputFileError) as err:
        build_provenance("probe", {}, ["data/base.pt"], threads=None, root=tmp_path)
    assert str(err.value).startswith(f"{tmp_path / 'data' / 'base.pt'}: an input is a character device")


def test_audit_reads_a_provenance_record_bounded(tmp_path):
    """A provenance record replaced by /dev/zero once made audit read until memory ran out."""
    from agentrl.tracking import lineage
    from agentrl.tracking.run import record_path
    path = record_path("probe", tmp_path)
    path.parent.mkdir(parents=True)
    path.symlink_to("/dev/zero")
    started = time.monotonic()
    assert lineage._record("probe", tmp_path) == {}
    assert time.monotonic() - started < 5


BOMB = (b"\nbomb:\n  a: &a [1,1,1,1,1,1,1,1,1,1]\n  b: &b [*a,*a,*a,*a,*a,*a,*a,*a,*a,*a]\n"
        b"  c: &c [*b,*b,*b,*b,*b,*b,*b,*b,*b,*b]\n  d: &d [*c,*c,*c,*c,*c,*c,*c,*c,*c,*c]\n"
        b"  e: &e [*d,*d,*d,*d,*d,*d,*d,*d,*d,*d]\n  f: &f [*e,*e,*e,*e,*e,*e,*e,*e,*e,*e]\n"
        b"  g: &g [*f,*f,*f,*f,*f,*f,*f,*f,*f,*f]\n  h: [*g,*g,*g,*g,*g,*g,*g,*g,*g,*g]\n")


@pytest.mark.slow   # a CLI subprocess
def test_make_repro_checks_params_within_bounds_before_dvc_reads_them(tmp_path):
    """An alias bomb under an unused key (DVC's own loader grew `dvc status` to 8.6 GB on one): `python -m agentrl
    params`, which `make repro` runs before `dvc repro`, refuses it in one line, in seconds; a good file passes."""
    recipe = (REPO / "Makefile").read_text().split("\nrepro:", 1)[1].split("\n\n", 1)[0]
    assert recipe.index("agentrl params") < recipe.index("dvc repro")
    (tmp_path / "params.yaml").write_bytes(GOOD + BOMB)
    # The checker's own peak: VmHWM of its process, written as it exits. (A child's ru_maxrss starts from its parent's
    # resident size at the fork, which is the whole test session's; that measured pytest, 1,201 MiB on CI.)
    peak_file = tmp_path / "peak"
    wrapper = ("import atexit, runpy, sys; from pathlib import Path\n"
               "peak = Path(sys.argv[1])\n"
               "atexit.register(lambda: peak.write_text([line for line in open('/proc/self/status') "
               "if line.startswith('VmHWM:')][0].split()[1]))\n"
               "sys.argv = ['agentrl', 'params']; runpy.run_module('agentrl', run_name='__main__', alter_sys=True)")
    t0 = time.time()
    out = subprocess.run([sys.executable, "-c", wrapper, str(peak_file)], cwd=tmp_path, capture_output=True,
                         text=True, timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    peak_mib = int(peak_file.read_text()) / 1024
    message = out.stderr
    assert out.returncode == 2 and len(message.strip().splitlines()) == 1, message
    assert "values with its aliases expanded (at most 200,000)" in message
    assert time.time() - t0 < 30 and peak_mib < 1024
    (tmp_path / "params.yaml").write_bytes(GOOD)
    good = subprocess.run([sys.executable, "-m", "agentrl", "params"], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120, env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO)})
    assert good.returncode == 0 and good.stdout.strip() == "params: params.yaml: every section valid", good.stderr
