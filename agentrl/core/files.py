"""Bounded reads: a file the project reads or hashes must be a regular file within a size bound.

A path that is a device (`/dev/zero`), a FIFO, a socket or a directory, or a file larger than the bound, is one
line (`InputFileError`, a UserError) naming the path and what it is, checked before a byte is read, so that nothing
waits forever on an endless device or fills memory with an oversized file. Symlinks are followed: the check is on
what the link points at.
"""
from __future__ import annotations

import os
import stat

from agentrl.core.knobs import UserError

MiB = 1 << 20
# the default bound of an input: the largest the pipeline writes is a converted pretrained model (~540 MB)
MAX_INPUT_BYTES = 4096 * MiB
MAX_TEXT_BYTES = 64 * MiB      # dvc.yaml, dvc.lock (a few hundred KB)
MAX_RECORD_BYTES = 16 * MiB    # a JSON record the project writes: provenance, resume, a model's config
_KINDS = ((stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"),
          (stat.S_ISSOCK, "a socket"), (stat.S_ISDIR, "a directory"))


class InputFileError(UserError):
    """An input that is not a regular file, or is larger than its bound."""


def size_text(n: int) -> str:
    return f"{n / MiB:,.1f} MiB" if n >= MiB else f"{n:,} bytes"


def file_kind(mode: int) -> str:
    return next((name for test, name in _KINDS if test(mode)), "not a regular file")


def check_regular(path, limit: int = MAX_INPUT_BYTES, what: str = "input") -> int:
    """The size of `path` after checking it is a regular file of at most `limit` bytes (InputFileError
    otherwise; FileNotFoundError passes through for the caller's own "missing" line)."""
    st = os.stat(path)
    if not stat.S_ISREG(st.st_mode):
        raise InputFileError(f"{path}: {what} is {file_kind(st.st_mode)}, not a regular file; point it at a file")
    if st.st_size > limit:
        raise InputFileError(f"{path}: {what} is {size_text(st.st_size)}, more than the {size_text(limit)} allowed")
    return st.st_size


def read_bytes(path, limit: int = MAX_INPUT_BYTES, what: str = "input") -> bytes:
    """The bytes of a regular file of at most `limit` bytes. The file is opened without blocking (a FIFO swapped in
    after the check does not hang the open) and read at most limit + 1 bytes (a file that grows is still bounded)."""
    check_regular(path, limit, what)
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0))
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise InputFileError(f"{path}: {what} is {file_kind(os.fstat(fd).st_mode)}, not a regular file")
        chunks, left = [], limit + 1
        while left > 0:
            chunk = os.read(fd, min(left, 8 * MiB))
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
    finally:
        os.close(fd)
    data = b"".join(chunks)
    if len(data) > limit:
        raise InputFileError(f"{path}: {what} grew past the {size_text(limit)} allowed while it was read")
    return data


def read_text(path, limit: int = MAX_INPUT_BYTES, what: str = "input") -> str:
    """UTF-8 text of a bounded regular file; bytes that are not UTF-8 are one line naming the line and byte."""
    return decode_utf8(read_bytes(path, limit, what), str(path))


def decode_utf8(data: bytes, name: str) -> str:
    body = data[3:] if data.startswith(b"\xef\xbb\xbf") else data   # a byte-order mark is allowed, and dropped
    try:
        return body.decode("utf-8")
    except UnicodeDecodeError as exc:
        start, data = exc.start, body
        line = data[:start].count(b"\n") + 1
        column = start - (data.rfind(b"\n", 0, start) + 1) + 1
        raise InputFileError(f"{name}: line {line}, column {column}: byte 0x{data[start]:02x} is not UTF-8; the file "
                             "must be UTF-8 text") from None

