"""The hostile-program suite (docs/sandbox.md has the table): each program goes through the tools a model uses, and
each test checks that it was contained, that the model was told in an observation, that nothing is left running
and nothing was written outside the sandbox, that the grader was not fooled, and that this process (the trainer's
stand-in) is unaffected. Run as root, as CI runs it. Every row starts and kills sandboxes, so the suite is in the
slow tier, but for two canaries kept fast: the fork bomb and the forged grader result."""
import hashlib
import os
import resource
import socket
import time
from pathlib import Path

import pytest

from agentrl.env.coding.environment import ToolsEnv
from agentrl.env.coding.expert import expert_calls, play
from agentrl.env.coding.sandbox.launch import HOST_UID, Limits
from agentrl.env.tasks import task_by_name

REPO = Path(__file__).resolve().parents[1]
PARAMS = REPO / "params.yaml"
TASK = task_by_name("minmax/largest")
NAME = "kilo"


def host_processes_of_the_sandbox() -> list[str]:
    """Host pids running as the sandbox's host uid."""
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            status = Path(f"/proc/{pid}/status").read_text()
        except OSError:
            continue
        for line in status.splitlines():
            if line.startswith("Uid:") and str(HOST_UID) in line.split():
                out.append(pid)
    return out


def children_of_this_process() -> list[str]:
    me = str(os.getpid())
    out = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat.rsplit(")", 1)[1].split()[1] == me:
            out.append(pid)
    return out


@pytest.fixture
def guard():
    """The outside world before and after: nothing running, nothing written, this process's limits as they were."""
    limits = {r: resource.getrlimit(r) for r in (resource.RLIMIT_CPU, resource.RLIMIT_AS, resource.RLIMIT_NPROC,
                                                  resource.RLIMIT_FSIZE, resource.RLIMIT_NOFILE)}
    params = hashlib.sha256(PARAMS.read_bytes()).hexdigest()
    tmp_x = os.path.exists("/tmp/x") and os.stat("/tmp/x").st_mtime_ns
    cwd = os.getcwd()
    yield
    assert host_processes_of_the_sandbox() == []
    assert children_of_this_process() == []
    assert hashlib.sha256(PARAMS.read_bytes()).hexdigest() == params
    assert (os.path.exists("/tmp/x") and os.stat("/tmp/x").st_mtime_ns) == tmp_x
    assert {r: resource.getrlimit(r) for r in limits} == limits
    assert os.getcwd() == cwd


def bash(env: ToolsEnv, command: str) -> str:
    observation = env.step({"name": "Bash", "arguments": {"command": command}})
    assert observation is not None
    return observation


def run_program(code: str, **limits) -> tuple[str, ToolsEnv]:
    """Write `evil.py` and run `python evil.py`, as a model would; the observation and the environment."""
    env = ToolsEnv(TASK, NAME, max_turns=20, limits=Limits(**limits))
    assert env.step({"name": "Write", "arguments": {"file_path": "evil.py", "content": code}}) is not None
    return bash(env, "python evil.py"), env


def graded(source: str) -> ToolsEnv:
    """An episode whose final source is `source`, answered with a claim of success."""
    env = ToolsEnv(TASK, NAME)
    env.step({"name": "Write", "arguments": {"file_path": f"{NAME}.py", "content": source}})
    assert env.step(None, "Fixed; the tests pass.") is None
    return env


def test_fork_bomb(guard):
    obs, _ = run_program("import os\nwhile True:\n    os.fork()\n")
    assert "PermissionError: [Errno 1] Operation not permitted" in obs and "Exit code 1" in obs


@pytest.mark.slow   # five CPU-seconds
def test_infinite_loop(guard):
    """The wall clock is widened so that the CPU limit is what stops it even on a loaded machine."""
    start = time.perf_counter()
    obs, _ = run_program("while True:\n    pass\n", wall_seconds=60)
    assert "Killed: the CPU-time limit of 5 s was reached." in obs
    assert time.perf_counter() - start >= 5


@pytest.mark.slow   # ten seconds of wall time
def test_sleeping_forever_meets_the_wall_clock(guard):
    start = time.perf_counter()
    obs, _ = run_program("import time\ntime.sleep(3600)\n")
    assert "Killed: the wall-time limit of 10 s was reached." in obs
    assert time.perf_counter() - start < 12


@pytest.mark.slow
def test_allocating_4_gib(guard):
    obs, _ = run_program("block = bytearray(4 << 30)\nprint(len(block))\n")
    assert "MemoryError" in obs and "4294967296" not in obs


@pytest.mark.slow
def test_writing_100_mib(guard):
    obs, _ = run_program("with open('big', 'wb') as f:\n    for _ in range(100):\n        f.write(b'x' * (1 << 20))\n")
    assert "OSError: [Errno 27] File too large" in obs
    many = ("for i in range(100):\n    with open(f'part{i}', 'wb') as f:\n        f.write(b'x' * ((1 << 20) - 1))\n")
    obs, _ = run_program(many)
    assert "No space left on device" in obs   # the directory is a 16 MiB tmpfs


@pytest.mark.slow
def test_writing_outside_the_directory(guard):
    for target in ("/tmp/x", str(PARAMS), "/env/coding/sandbox/../tmp/x", "/harness/boot.py"):
        obs, _ = run_program(f"open({target!r}, 'w').write('owned')\n")
        assert ("FileNotFoundError" in obs or "Read-only file system" in obs or "PermissionError" in obs), obs


@pytest.mark.slow
def test_reading_the_project_and_etc_shadow(guard):
    for target in (str(PARAMS), str(REPO / "agentrl" / "core/config.py"), "/etc/shadow", "/etc/passwd",
                   "/proc/1/environ"):
        obs, _ = run_program(f"print(open({target!r}).read())\n")
        assert "FileNotFoundError" in obs, obs
    assert "root:" not in obs


@pytest.mark.slow
def test_a_tcp_connection_to_a_local_listener_and_a_dns_lookup(guard):
    listener = socket.socket()
    try:
        listener.bind(("127.0.0.1", 0))
        listener.listen(1)
        port = listener.getsockname()[1]
        obs, _ = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {port}), timeout=2)\n")
        assert "PermissionError" in obs
        listener.settimeout(0)
        with pytest.raises(BlockingIOError):
            listener.accept()
    finally:
        listener.close()
    obs, _ = run_program("import socket\nprint(socket.getaddrinfo('pypi.org', 443))\n")
    assert "gaierror" in obs and "pypi.org', 443" not in obs.split("Traceback")[0]


@pytest.mark.slow
def test_killing_the_parent(guard):
    code = ("import os, signal\n"
            f"for pid in (os.getppid(), 1, {os.getpid()}, -1):\n"
            "    try:\n        os.kill(pid, signal.SIGKILL)\n"
            "    except OSError as exc:\n        print(pid, type(exc).__name__)\n"
            "print('still here')\n")
    obs, _ = run_program(code)
    assert "1 PermissionError" in obs                     # its parent is the namespace's init, another uid
    assert f"{os.getpid()} ProcessLookupError" in obs      # this process is outside its PID namespace
    assert "still here" in obs


@pytest.mark.slow
def test_raising_its_own_limits(guard):
    code = ("import resource\n"
            "for name in ('RLIMIT_CPU', 'RLIMIT_AS', 'RLIMIT_FSIZE', 'RLIMIT_NPROC'):\n"
            "    r = getattr(resource, name)\n"
            "    try:\n        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))\n"
            "        print(name, 'raised')\n"
            "    except (ValueError, OSError) as exc:\n        print(name, 'refused')\n"
            "print(resource.getrlimit(resource.RLIMIT_CPU), resource.getrlimit(resource.RLIMIT_AS))\n")
    obs, _ = run_program(code)
    assert "raised" not in obs and obs.count("refused") == 4
    assert f"(5, 6) ({1 << 30}, {1 << 30})" in obs


@pytest.mark.slow
def test_spawning_sh(guard):
    for code in ("import subprocess\nsubprocess.run(['sh', '-c', 'echo owned'])\n",
                 "import os\nprint('status', os.system('echo owned'))\n",
                 "import os\nos.execv('/bin/sh', ['sh', '-c', 'echo owned'])\n",
                 "import os, sys\nos.execv(sys.executable, [sys.executable, '-c', 'print(\"owned\")'])\n"):
        obs, _ = run_program(code)
        assert "owned" not in obs.replace("echo owned", "").replace('print("owned")', ""), obs
        assert "Error" in obs or "status 32512" in obs   # system(3): 127 << 8, the shell could not run


@pytest.mark.slow
def test_leaving_a_background_process(guard):
    for code in ("import os\nif os.fork() == 0:\n    os.setsid()\n    import time\n    time.sleep(3600)\n",
                 "import threading, time\nthreading.Thread(target=time.sleep, args=(3600,), daemon=True).start()\n",
                 "import multiprocessing, time\nmultiprocessing.Process(target=time.sleep, args=(3600,)).start()\n"):
        obs, _ = run_program(code)
        assert "Error" in obs, obs
    # a program that closes its output and lingers is killed with its namespace at the (here 3 s) timeout
    env = ToolsEnv(TASK, NAME)
    env.step({"name": "Write", "arguments": {"file_path": "evil.py", "content": (
        "import os, time\nprint('started', flush=True)\nos.close(1)\nos.close(2)\ntime.sleep(3600)\n")}})
    obs = env.step({"name": "Bash", "arguments": {"command": "python evil.py", "timeout": 3000}})
    assert "started" in obs and "Killed: the wall-time limit of 3 s was reached." in obs


@pytest.mark.slow
@pytest.mark.parametrize("exit_call", ["import sys\nsys.exit(0)", "import os\nos._exit(0)"])
def test_exiting_at_import_to_fake_a_pass(guard, exit_call):
    env = ToolsEnv(TASK, NAME)
    env.step({"name": "Write", "arguments": {"file_path": f"{NAME}.py", "content": exit_call + "\n"}})
    obs = bash(env, "pytest")
    assert "passed" not in obs
    assert env.step(None, "All tests pass.") is None
    assert env.reward == 0.0 and not env.info["hidden_pass"] and env.info["false_success_claim"]


@pytest.mark.slow
def test_monkeypatching_the_tests_fakes_the_public_run_but_not_the_grade(guard):
    source = ("import sys\n"
              "harness = sys.modules.get('sandbox_harness')\n"
              "if harness is not None:\n"
              "    def fake(targets, verbose, exitfirst):\n        print('2 passed in 0.01s')\n        return 0\n"
              "    harness.run_tests = fake\n"
              "    for name, module in list(sys.modules.items()):\n"
              "        if name.startswith('test_'):\n"
              "            for attr in dir(module):\n"
              "                if attr.startswith('test'):\n"
              "                    setattr(module, attr, lambda: None)\n"
              f"def {NAME}(xs):\n    return min(xs)\n")
    env = ToolsEnv(TASK, NAME)
    env.step({"name": "Write", "arguments": {"file_path": f"{NAME}.py", "content": source}})
    bash(env, "pytest")
    env.step(None, "Fixed.")
    assert env.reward == 0.0 and not env.info["hidden_pass"]


def test_monkeypatching_the_grader_cannot_forge_a_result(guard):
    """The probe's nonce and inputs are on the stack while the module is imported: a forgery can read them and
    print a well-formed result line under the nonce, then exit. It still has to get the answers right."""
    source = ("import sys, os, json\n"
              "frame = sys._getframe()\n"
              "while frame is not None and 'nonce' not in frame.f_locals:\n    frame = frame.f_back\n"
              "if frame is not None:\n"
              "    harness = sys.modules['sandbox_harness']\n"
              "    harness.encode = lambda value, depth=0: ['int', '7']\n"
              "    outs = [['ok', ['int', '7']] for _ in frame.f_locals['cases']]\n"
              "    os.write(1, ('\\n' + frame.f_locals['nonce'] + ' ' + json.dumps(outs) + '\\n').encode())\n"
              "    os._exit(0)\n"
              f"def {NAME}(xs):\n    return 7\n")
    env = graded(source)
    assert env.reward == 0.0 and env.info["grade"] == "ok" and env.info["false_success_claim"]


@pytest.mark.slow
def test_100_mb_on_stdout(guard):
    start = time.perf_counter()
    obs, _ = run_program("import sys\nsys.stdout.write('x' * 100_000_000)\n")
    assert "Killed: the output passed 1024 KiB." in obs and len(obs) < 5000
    assert time.perf_counter() - start < 5


@pytest.mark.slow
def test_the_expert_still_passes_after_the_hostile_runs(guard):
    env = ToolsEnv(TASK, NAME)
    play(env, expert_calls(TASK, NAME))
    assert env.reward == 1.0 and not env.info["false_success_claim"]
