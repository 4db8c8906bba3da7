"""What of the host filesystem the sandbox may see: the Python interpreter, its standard library, and the shared
libraries they load, each at its own path; nothing else.

Found once per process by a probe: the host interpreter (trusted: it runs a fixed snippet, no model output) imports
every extension module of its standard library and lists the files mapped into it.
"""
from __future__ import annotations

import functools
import os
import struct
import subprocess
import sys
import sysconfig
from dataclasses import dataclass

_PROBE = """
import os, sys, importlib
dynload = os.path.join(sys.argv[1])
skip = ('_tkinter', '_curses', 'readline', '_dbm', '_gdbm', 'nis', '_sqlite3', '_crypt', '_uuid', 'xxlimited')
for name in sorted(os.listdir(dynload)):
    if name.endswith('.so') and not name.startswith(skip):
        try:
            importlib.import_module(name.split('.')[0])   # what the program may import, and what it needs
        except BaseException:
            pass
for line in open('/proc/self/maps'):
    parts = line.split()
    if len(parts) > 5 and parts[5].startswith('/'):
        print(parts[5])
"""


@dataclass(frozen=True)
class Interpreter:
    executable: str          # the real interpreter binary (not a virtualenv's symlink)
    stdlib: str              # .../lib/python3.X
    site_packages: str       # hidden inside the sandbox (python -S would not read it; it is not shown either)
    binds: tuple             # (host path, sandbox path) pairs, read-only: the binary, the loader, the libraries


def base_executable() -> str:
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


def elf_interpreter(path: str) -> str | None:
    """The program interpreter (PT_INTERP, e.g. /lib64/ld-linux-x86-64.so.2) of a 64-bit ELF file."""
    with open(path, "rb") as f:
        head = f.read(64)
        if head[:4] != b"\x7fELF" or head[4] != 2:
            return None
        phoff, = struct.unpack_from("<Q", head, 32)
        phentsize, phnum = struct.unpack_from("<HH", head, 54)
        for i in range(phnum):
            f.seek(phoff + i * phentsize)
            p_type, _flags, p_offset, _vaddr, _paddr, p_filesz = struct.unpack("<IIQQQQ", f.read(40))
            if p_type == 3:
                f.seek(p_offset)
                return f.read(p_filesz).rstrip(b"\0").decode()
    return None


def _aliases(path: str) -> list[str]:
    """Symlinks beside a library that resolve to it (its SONAME, e.g. libffi.so.8 -> libffi.so.8.1.2): the loader
    asks for those names."""
    folder = os.path.dirname(path)
    out = []
    try:
        entries = list(os.scandir(folder))
    except OSError:
        return out
    for entry in entries:
        if entry.is_symlink() and os.path.realpath(entry.path) == path:
            out.append(entry.path)
    return out


@functools.cache
def discover() -> Interpreter:
    exe = base_executable()
    stdlib = os.path.realpath(sysconfig.get_paths()["stdlib"])
    if not stdlib.startswith(os.path.realpath(sys.base_prefix)):
        stdlib = os.path.join(os.path.realpath(sys.base_prefix), "lib", f"python{sys.version_info[0]}."
                              f"{sys.version_info[1]}")
    dynload = os.path.join(stdlib, "lib-dynload")
    out = subprocess.run([exe, "-I", "-S", "-c", _PROBE, dynload], capture_output=True, text=True,
                         timeout=60, env={})
    if out.returncode != 0:
        raise RuntimeError(f"sandbox: the interpreter probe failed: {out.stderr.strip()[-300:]}")
    mapped = {p for p in out.stdout.split() if os.path.isfile(p) and not p.startswith(stdlib + os.sep)}
    binds = {(exe, exe)}
    for lib in mapped:
        real = os.path.realpath(lib)
        binds.add((real, real))
        binds |= {(real, alias) for alias in _aliases(real)}
    loader = elf_interpreter(exe)
    if loader:
        binds.add((os.path.realpath(loader), loader))
    return Interpreter(exe, stdlib, os.path.join(stdlib, "site-packages"), tuple(sorted(binds)))
