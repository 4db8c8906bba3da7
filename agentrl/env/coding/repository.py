"""An episode's repository: two in-memory files, `<fn>.py` (the task's buggy source under the episode's function
name, and where the episode draws them its operands' filler names) and `test_<fn>.py` (the public tests as pytest
functions). The hidden tests never enter it."""
from __future__ import annotations

import io
import re
import tokenize
from dataclasses import dataclass, field

from agentrl.env.coding.sandbox.launch import check_file_name
from agentrl.env.coding.schemas import REPO_ROOT
from agentrl.env.tasks import Task


def renamed_source(source: str, func: str, name: str) -> str:
    """The source with its function renamed (every whole-word use, so a recursive call follows)."""
    return re.sub(rf"\b{re.escape(func)}\b", name, source)


def renamed_operands(source: str, operands: dict | None) -> str:
    """The source with each operand (a parameter or local: agentrl.env.gym.environment.operand_names) under its
    filler name, all in one pass: name tokens only, never an attribute after `.` or a word inside a string, so the
    renamed source computes what the original does (the tests call the function positionally)."""
    if not operands:
        return source
    lines = source.splitlines(keepends=True)
    starts = [0]
    for line in lines:
        starts.append(starts[-1] + len(line))
    spans, previous = [], None
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.NAME and tok.string in operands and not (previous and previous.string == "."):
            spans.append((starts[tok.start[0] - 1] + tok.start[1], starts[tok.end[0] - 1] + tok.end[1], tok.string))
        if tok.type not in (tokenize.NL, tokenize.COMMENT):
            previous = tok
    for begin, end, name in reversed(spans):
        source = source[:begin] + operands[name] + source[end:]
    return source


def _call_text(name: str, args) -> str:
    return f"{name}({', '.join(repr(a) for a in args)})"


def public_test_file(name: str, cases) -> str:
    """pytest-style tests, one function per public case, whose failure message says what came back."""
    parts = [f"from {name} import {name}\n"]
    for i, (args, expected) in enumerate(cases, 1):
        call = _call_text(name, args)
        parts.append(f"\ndef test_{name}_{i}():\n"
                     f"    got = {call}\n"
                     f"    assert got == {expected!r}, f\"{call} returned {{got!r}}, expected {expected!r}\"\n")
    return "\n".join(parts)


@dataclass
class Repository:
    files: dict                                  # name -> text
    read: set = field(default_factory=set)       # files Read (or written) in this episode

    @classmethod
    def for_task(cls, task: Task, name: str, operands: dict | None = None) -> Repository:
        return cls({f"{name}.py": renamed_operands(renamed_source(task.source, task.func, name), operands),
                    f"test_{name}.py": public_test_file(name, task.public)})

    @staticmethod
    def normalize(file_path: str) -> str:
        """A file name from `/repo/x.py`, `./x.py` or `x.py`; ValueError for anything outside the repository."""
        path = file_path.strip()
        for prefix in (REPO_ROOT + "/", "./"):
            if path.startswith(prefix):
                path = path[len(prefix):]
        if not path or "/" in path or path in (".", ".."):
            raise ValueError(f"file_path: {file_path!r} is not a file of the repository; the repository is "
                             f"{REPO_ROOT} with no subfolders")
        try:
            check_file_name(path)
        except ValueError:
            raise ValueError(f"file_path: {file_path!r}: a file name is letters, digits, '_', '.' and '-', "
                             f"not starting with '.'") from None
        return path
