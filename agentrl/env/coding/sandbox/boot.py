"""The first code that runs inside the sandbox, before any model-written code: resource limits, the switch to
the unprivileged uid, and the seccomp filter; then it hands over to the harness.

Standard library only: the sandbox holds the interpreter and its standard library, nothing else (`python -I -S`).
Run as `python -I -S -B boot.py`, with one JSON object on standard input: the limits, the uid and gid to become,
the harness path and the harness's arguments. Importing this module does nothing.
"""
from __future__ import annotations

import struct

# x86_64 system call numbers the filter refuses (arch/x86/entry/syscalls/syscall_64.tbl). Process creation of any
# kind (threads too: the harness needs none), program execution, sockets, the namespace, mount and tracing calls,
# and changing identity. Limits stay readable and lowerable: raising a hard limit needs CAP_SYS_RESOURCE in the
# host's user namespace, which nothing in the sandbox can hold.
X86_64_DENIED = {
    "clone": 56, "fork": 57, "vfork": 58, "execve": 59, "ptrace": 101, "setuid": 105, "setgid": 106,
    "setreuid": 113, "setregid": 114, "setgroups": 116, "setresuid": 117, "setresgid": 119,
    "chroot": 161, "mount": 165, "umount2": 166, "pivot_root": 155, "unshare": 272, "setns": 308,
    "execveat": 322, "clone3": 435, "socket": 41, "socketpair": 53,
    "process_vm_writev": 311, "bpf": 321, "userfaultfd": 323, "io_uring_setup": 425, "keyctl": 250,
    "add_key": 248, "request_key": 249, "perf_event_open": 298, "seccomp": 317,
}
AUDIT_ARCH_X86_64 = 0xC000003E
X32_SYSCALL_BIT = 0x40000000
EPERM = 1

_BPF_LD_W_ABS, _BPF_JEQ_K, _BPF_JGE_K, _BPF_RET_K = 0x20, 0x15, 0x35, 0x06
SECCOMP_RET_KILL_PROCESS, SECCOMP_RET_ERRNO, SECCOMP_RET_ALLOW = 0x80000000, 0x00050000, 0x7FFF0000
_NR_OFFSET, _ARCH_OFFSET = 0, 4   # struct seccomp_data: int nr; __u32 arch; ...


def seccomp_program(denied: dict = X86_64_DENIED) -> list[tuple[int, int, int, int]]:
    """The classic-BPF filter as (code, jt, jf, k) instructions: kill on a foreign architecture or an x32 call,
    EPERM on a denied call, allow the rest."""
    numbers = sorted(set(denied.values()))
    prog = [(_BPF_LD_W_ABS, 0, 0, _ARCH_OFFSET),
            (_BPF_JEQ_K, 1, 0, AUDIT_ARCH_X86_64),
            (_BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS),
            (_BPF_LD_W_ABS, 0, 0, _NR_OFFSET),
            (_BPF_JGE_K, 0, 1, X32_SYSCALL_BIT),
            (_BPF_RET_K, 0, 0, SECCOMP_RET_KILL_PROCESS)]
    # each test jumps to the shared EPERM return after the list; jt counts the instructions in between
    for i, nr in enumerate(numbers):
        prog.append((_BPF_JEQ_K, len(numbers) - i, 0, nr))
    prog.append((_BPF_RET_K, 0, 0, SECCOMP_RET_ALLOW))
    prog.append((_BPF_RET_K, 0, 0, SECCOMP_RET_ERRNO | EPERM))
    return prog


def run_filter(prog, arch: int, nr: int) -> int:
    """Interpret the program on one call (for tests; the kernel runs the real one)."""
    pc, acc = 0, 0
    while True:
        code, jt, jf, k = prog[pc]
        if code == _BPF_LD_W_ABS:
            acc = {_ARCH_OFFSET: arch, _NR_OFFSET: nr}[k]
            pc += 1
        elif code == _BPF_JEQ_K:
            pc += 1 + (jt if acc == k else jf)
        elif code == _BPF_JGE_K:
            pc += 1 + (jt if acc >= k else jf)
        elif code == _BPF_RET_K:
            return k
        else:
            raise ValueError(f"unknown BPF instruction {code:#x}")


def install_seccomp(prog) -> None:
    import ctypes
    import platform
    if platform.machine() != "x86_64":
        raise OSError(f"seccomp filter defined for x86_64 only, not {platform.machine()}")
    PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
    raw = b"".join(struct.pack("HBBI", *ins) for ins in prog)
    buf = ctypes.create_string_buffer(raw, len(raw))

    class SockFprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    fprog = SockFprog(len(prog), ctypes.cast(buf, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_void_p, ctypes.c_ulong, ctypes.c_ulong]
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, None, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_NO_NEW_PRIVS)")
    if libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(fprog), 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_SECCOMP)")


def lock_down(config: dict) -> None:
    """Limits first (as the namespace's setup identity, which may still lower hard limits), then the uid and gid
    (which clears every capability), then the filter. After this nothing can be undone."""
    import ctypes  # noqa: F401 - loaded while every file is still readable; install_seccomp needs it
    import os
    import resource
    import signal
    limits = config["limits"]
    for name, value in (("RLIMIT_CPU", None), ("RLIMIT_AS", limits["address_space"]),
                        ("RLIMIT_FSIZE", limits["file_size"]), ("RLIMIT_CORE", 0), ("RLIMIT_NOFILE", 64),
                        ("RLIMIT_NPROC", 1)):
        if name == "RLIMIT_CPU":   # SIGXCPU at the soft limit, SIGKILL one second later
            resource.setrlimit(resource.RLIMIT_CPU, (limits["cpu_seconds"], limits["cpu_seconds"] + 1))
        else:
            resource.setrlimit(getattr(resource, name), (value, value))
    # a write past the file-size limit fails with EFBIG (an exception the program sees) instead of killing it
    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    os.setgroups([])
    os.setresgid(config["gid"], config["gid"], config["gid"])
    os.setresuid(config["uid"], config["uid"], config["uid"])
    install_seccomp(seccomp_program())


def main(argv) -> None:
    import importlib.util
    import json
    import sys
    config = json.loads(sys.stdin.read())
    lock_down(config)
    spec = importlib.util.spec_from_file_location("sandbox_harness", config["harness"])
    harness = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(harness)
    sys.exit(harness.main(config["args"]))


if __name__ == "__main__":
    import sys
    main(sys.argv)
