"""An episode's repository: two in-memory files, `<fn>.py` (the task's buggy source under the episode's function
name, and where the episode draws them its operands' filler names) and `test_<fn>.py` (the public tests as pytest
functions). The hidden tests never enter it."""
from __future__ import annotations

import re
from dataclasses import dataclass, field

from agentrl.env.coding.sandbox.launch import check_file_name
from agentrl.env.coding.schemas import REPO_ROOT
from agentrl.env.tasks import Task


def renamed_source(source: str, func: str, name: str) -> str:
    """The source with its function renamed (every whole-word use, so a recursive call follows)."""
    return re.sub(rf"\b{re.escape(func)}\b", name, source)


def renamed_operands(source: str, operands: dict | None) -> str:
    """The source with each operand (a parameter or local: agentrl.env.gym.environment.operand_names) under its
    filler name, all in one pass. The catalogue's sources have no attributes, keyword arguments or strings, and
    the tests call the function positionally, so the renamed source computes what the authored one does."""
    if not operands:
        return source
    return re.sub(r"\b[A-Za-z_]\w*\b", lambda m: operands.get(m.group(0), m.group(0)), source)


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
