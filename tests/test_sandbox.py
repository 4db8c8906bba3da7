"""The sandbox's mechanism, layer by layer: the seccomp program, who the program is (inside and on the host), what
it sees, the network namespace on its own, the limits' validation, the in-sandbox pytest runner and the grader's
probe. The hostile programs are tests/test_hostile.py."""
import json
import os
import socket
import subprocess
import threading
import time

import pytest

from agentrl.env.coding.grader import decode, grade
from agentrl.env.coding.sandbox import boot
from agentrl.env.coding.sandbox.interpreter import discover, elf_interpreter
from agentrl.env.coding.sandbox.launch import HOST_UID, SANDBOX_UID, Limits, check_file_name, command, run


def script(code: str, **limits):
    return run({"main.py": code}, {"mode": "script", "path": "main.py"}, Limits(**limits))


# ---------------------------------------------------------------- seccomp program (interpreted here)

@pytest.mark.parametrize("call", ["fork", "vfork", "clone", "clone3", "execve", "execveat", "socket", "ptrace",
                                  "unshare", "setns", "mount", "setuid", "setresuid"])
def test_the_filter_refuses_process_creation_exec_sockets_and_limit_changes(call):
    nr = boot.X86_64_DENIED[call]
    assert boot.run_filter(boot.seccomp_program(), boot.AUDIT_ARCH_X86_64, nr) == \
        boot.SECCOMP_RET_ERRNO | boot.EPERM


@pytest.mark.parametrize("nr", [0, 1, 2, 3, 9, 12, 60, 231, 262])   # read write open close mmap brk exit ...
def test_the_filter_allows_ordinary_calls(nr):
    assert boot.run_filter(boot.seccomp_program(), boot.AUDIT_ARCH_X86_64, nr) == boot.SECCOMP_RET_ALLOW


def test_the_filter_kills_foreign_architectures_and_x32_calls():
    prog = boot.seccomp_program()
    i386 = 0x40000003
    assert boot.run_filter(prog, i386, 2) == boot.SECCOMP_RET_KILL_PROCESS
    assert boot.run_filter(prog, boot.AUDIT_ARCH_X86_64, boot.X32_SYSCALL_BIT | 57) == boot.SECCOMP_RET_KILL_PROCESS


# ---------------------------------------------------------------- identity and view

def test_a_program_runs_with_its_output_and_exit_code():
    e = script("import sys\nprint('out')\nprint('err', file=sys.stderr)\nsys.exit(3)")
    assert (e.status, e.exit_code, e.stdout, e.stderr) == ("exited", 3, "out\n", "err\n")


@pytest.mark.slow   # starts sandboxes
def test_inside_it_is_an_unprivileged_uid_with_an_empty_environment_and_no_site_packages():
    e = script("import os, sys, json\nprint(json.dumps([os.getuid(), os.getgid(), os.getgroups(), "
               "dict(os.environ), sys.flags.isolated, sys.flags.no_site, [p for p in sys.path if 'site' in p]]))")
    uid, gid, groups, env, isolated, no_site, site = json.loads(e.stdout)
    assert (uid, gid, groups) == (SANDBOX_UID, SANDBOX_UID, [])
    assert set(env) <= {"PWD", "LC_CTYPE"}   # bwrap's working directory, Python's own C-locale coercion
    assert (isolated, no_site, site) == (1, 1, [])


@pytest.mark.slow   # starts sandboxes
def test_it_sees_only_its_directory_the_harness_and_the_interpreter():
    e = script("import os, json\nprint(json.dumps(sorted(os.listdir('/'))))\n"
               "print(json.dumps([os.path.exists(p) for p in ('/etc', '/home', '/proc', '/tmp', '/work', '/sys', "
               "'/bin/sh', '/usr/bin', os.path.join(os.sep, 'root', '.ssh'))]))")
    top, present = [json.loads(line) for line in e.stdout.splitlines()]
    interp = discover()
    allowed = {"sandbox", "harness", "dev"} | {p.split("/")[1] for _, p in interp.binds} | \
        {interp.stdlib.split("/")[1]}
    assert set(top) <= allowed and "sandbox" in top
    assert not any(present)


@pytest.mark.slow   # starts sandboxes
def test_on_the_host_it_is_an_unprivileged_uid_without_capabilities_under_seccomp():
    """While the program sleeps, find it in the host's /proc by its host uid; the last sighting is the program
    after boot's lock-down."""
    seen, finished = [], threading.Event()

    def look():
        while not finished.is_set():
            for pid in filter(str.isdigit, os.listdir("/proc")):
                try:
                    status = open(f"/proc/{pid}/status").read()
                except OSError:
                    continue
                fields = dict(line.split(":\t", 1) for line in status.splitlines() if ":\t" in line)
                if fields.get("Uid", "").split() == [str(HOST_UID)] * 4:
                    seen.append(fields)
            time.sleep(0.02)
    watcher = threading.Thread(target=look)
    watcher.start()
    try:
        e = script("import time\ntime.sleep(1.0)\nprint('done')")
    finally:
        finished.set()
        watcher.join()
    assert e.stdout == "done\n" and seen
    fields = seen[-1]
    assert fields["Gid"].split() == [str(HOST_UID)] * 4
    assert int(fields["CapEff"], 16) == int(fields["CapPrm"], 16) == int(fields["CapAmb"], 16) == 0
    assert fields["NoNewPrivs"].strip() == "1" and fields["Seccomp"].strip() == "2"


@pytest.mark.slow   # starts sandboxes
def test_the_network_namespace_holds_on_its_own_without_the_filter():
    """bwrap's command line with a plain interpreter instead of boot (no seccomp): a listener on the host's
    127.0.0.1 is not reachable from inside."""
    args, fds = command({}, Limits())
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen(1)
    port = listener.getsockname()[1]
    code = (f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n"
            "    print('connected')\nexcept OSError as exc:\n    print(type(exc).__name__)")
    try:
        out = subprocess.run(args[:-4] + [args[-4], "-I", "-S", "-c", code], pass_fds=fds, capture_output=True,
                             text=True, timeout=30)
        listener.settimeout(0)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
        for fd in fds:
            os.close(fd)
    assert out.stdout.strip() == "ConnectionRefusedError", out.stderr


def test_the_interpreter_is_found_with_its_loader():
    interp = discover()
    assert os.path.isfile(interp.executable)
    loader = elf_interpreter(interp.executable)
    assert loader and (os.path.realpath(loader), loader) in interp.binds
    assert not any(host.startswith(interp.site_packages) for host, _ in interp.binds)


@pytest.mark.parametrize("name", ["", ".hidden", "a/b.py", "../x.py", "a b.py", "x;y.py"])
def test_file_names_are_plain(name):
    with pytest.raises(ValueError, match="file name"):
        check_file_name(name)


@pytest.mark.parametrize("field", ["wall_seconds", "cpu_seconds", "address_space", "file_size", "output_bytes"])
def test_limits_are_positive(field):
    with pytest.raises(ValueError, match=field):
        Limits(**{field: 0})


# ---------------------------------------------------------------- the pytest runner inside

TESTS = ("from lib import f\n\ndef test_one():\n    assert f(1) == 2, 'f(1) should be 2'\n\n"
         "def test_two():\n    assert f(2) == 4\n")


def pytest_run(lib: str, targets=(), **opts):
    return run({"lib.py": lib, "test_lib.py": TESTS}, {"mode": "pytest", "targets": list(targets), **opts})


@pytest.mark.slow   # starts sandboxes
def test_the_runner_reports_passes_and_failures_with_the_failing_line():
    good = pytest_run("def f(x):\n    return 2 * x\n")
    assert good.exit_code == 0 and "2 passed" in good.stdout
    bad = pytest_run("def f(x):\n    return x + 1\n", verbose=True)
    assert bad.exit_code == 1
    assert "test_lib.py::test_one PASSED" in bad.stdout
    assert "FAILED test_lib.py::test_two - AssertionError" in bad.stdout
    assert "test_lib.py:7: assert f(2) == 4" in bad.stdout and "1 failed, 1 passed" in bad.stdout


@pytest.mark.slow   # starts sandboxes
def test_the_runner_selects_one_test_and_reports_collection_errors():
    one = pytest_run("def f(x):\n    return x + 1\n", ["test_lib.py::test_one"])
    assert one.exit_code == 0 and "1 passed" in one.stdout
    broken = pytest_run("def f(x:\n")
    assert broken.exit_code == 2 and "ERROR collecting test_lib.py - SyntaxError" in broken.stdout
    exits = pytest_run("import sys\nsys.exit(0)\n")
    assert exits.exit_code == 2 and "SystemExit" in exits.stdout


# ---------------------------------------------------------------- the grader's probe

CASES = (((2,), 4), ((3,), 6), ((0,), 0))


def test_the_grader_passes_a_correct_function_and_fails_a_wrong_one():
    assert grade("def g(x):\n    return 2 * x\n", "g", CASES).passed == (True, True, True)
    assert grade("def g(x):\n    return x + 2\n", "g", CASES).passed == (True, False, False)


@pytest.mark.parametrize("body", ["return bool(x)", "return float(2 * x)",
                                  "class I(int):\n        def __eq__(self, o): return True\n    return I(0)",
                                  "class A:\n        def __eq__(self, o): return True\n    return A()"])
@pytest.mark.slow   # starts sandboxes
def test_the_grader_compares_exact_types_and_ignores_custom_equality(body):
    g = grade(f"def g(x):\n    {body}\n", "g", CASES)
    assert g.passed.count(True) <= 1 and not g.all_passed


def test_decode_refuses_malformed_trees():
    assert decode(["list", [["int", "1"], ["bool", True]]]) == [1, True]
    for bad in (["int", 1], ["weird", None], [1, 2], ["list", [["int", "x"]]]):
        with pytest.raises(ValueError):
            decode(bad)
