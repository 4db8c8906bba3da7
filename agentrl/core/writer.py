"""The one way a checkpoint or a model is written: through a temporary beside its place, renamed in when whole.

torch.save, safetensors and save_pretrained report a short write their own way: torch's stream writer raises
RuntimeError ("[enforce fail at inline_container.cc] ... unexpected pos"), not OSError, so a full disk reached the
boundary as an unexpected error naming neither the file nor the cause, and left its temporary behind. `write_file`
and `write_directory` call the library's writer on a temporary of their own, remove it on any failure, and turn a
failed write into the OSError the boundary reads (agentrl.core.boundary: exit 1, "cannot write <path>: No space left
on device (<free> free on that filesystem); free space ... and run again"), naming the file the user knows and the
space left.
"""
from __future__ import annotations

import errno
import os
import shutil
from collections.abc import Callable
from pathlib import Path

from agentrl.core.artifacts import finish_temporary, temporary_name, temporary_path

SHORT_WRITE = ("inline_container", "unexpected pos", "PytorchStreamWriter", "No space left", "write failed")
LOW_SPACE = 64 * 2**20   # a library's failed write with less room than this left is the disk filling up


def free_bytes(path: Path) -> int | None:
    """Free bytes on the filesystem that holds `path` (or its nearest existing parent); None if unknown."""
    for candidate in (path, *path.parents):
        try:
            return shutil.disk_usage(candidate).free
        except OSError:
            continue
    return None


def _size(n: int | None) -> str:
    if n is None:
        return "unknown space"
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def failed_write(exc: BaseException, path: Path) -> BaseException:
    """The error a failed write of `path` should raise: an OSError naming `path` (its errno kept, the free space
    named when it is ENOSPC); a library's short write (RuntimeError) on a nearly full filesystem as ENOSPC; anything
    else as it was."""
    free = free_bytes(path.parent)
    if isinstance(exc, OSError) and exc.errno is not None:
        why = exc.strerror or os.strerror(exc.errno)
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            why = f"{why} ({_size(free)} free on that filesystem)"
        return OSError(exc.errno, why, str(path))
    text, low = str(exc), free is not None and free < LOW_SPACE
    if isinstance(exc, RuntimeError) and (any(s in text for s in SHORT_WRITE) or low):
        if low:
            return OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)} ({_size(free)} free on that filesystem)",
                           str(path))
        return OSError(errno.EIO, f"the write stopped short ({text.splitlines()[0][:120]}; {_size(free)} free)",
                       str(path))
    return exc


def write_file(path, write: Callable[[Path], None]) -> None:
    """write(tmp) then rename tmp over `path`; on failure no temporary is left and the error names `path`. The
    temporary has `path`'s own name (in a directory of this process's), as torch.save names an archive's records
    after its file: the bytes do not depend on the process."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_path(path)
    try:
        write(tmp)
        finish_temporary(tmp, path)
    except BaseException as exc:
        shutil.rmtree(tmp.parent, ignore_errors=True)
        mapped = failed_write(exc, path)
        if mapped is exc:
            raise
        raise mapped from None


def write_directory(path, write: Callable[[Path], None]) -> None:
    """write(tmp_dir) into a fresh directory beside `path`, then put it in place of `path` (an old `path` goes
    only once the new one is whole); on failure the temporary is removed and the error names `path`."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary_name(path)
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        tmp.mkdir()
        write(tmp)
        old = path.with_name(f"{path.name}.{os.getpid()}.old.tmp")   # a kill here: remove_partial finds it
        if path.exists():
            os.replace(path, old)
        os.replace(tmp, path)
        shutil.rmtree(old, ignore_errors=True)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        mapped = failed_write(exc, path)
        if mapped is exc:
            raise
        raise mapped from None
