"""The scripted expert for the generic tools, the demonstrations of a behaviour-cloning cold start: Read the source;
Edit with an old_string copied as whole lines (the authored repair op says what the lines become); run the tests;
answer. It knows the fix from the catalogue's oracle op, never from running anything."""
from __future__ import annotations

import difflib

from agentrl.env.coding.repository import REPO_ROOT, renamed_operands, renamed_source
from agentrl.env.ops import apply_op
from agentrl.env.tasks import Task

FINAL_ANSWER = "Fixed {name} in {file}; the tests pass."


def fix_edit(buggy: str, fixed: str) -> tuple[str, str]:
    """(old_string, new_string) of one Edit turning `buggy` into `fixed`: whole lines, the changed ones (an
    insertion is anchored on the line before it), widened by a neighbour until old_string occurs only once."""
    a, b = buggy.split("\n"), fixed.split("\n")
    hunks = [op for op in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes() if op[0] != "equal"]
    if not hunks:
        raise ValueError("fix_edit: the fixed source equals the buggy one")
    i1, j1 = hunks[0][1], hunks[0][3]
    i2, j2 = hunks[-1][2], hunks[-1][4]
    if i1 == i2:   # a pure insertion: include the line before it in both strings
        i1, j1 = i1 - 1, j1 - 1
    while True:
        old, new = "\n".join(a[i1:i2]), "\n".join(b[j1:j2])
        if buggy.count(old) == 1 or (i1 == 0 and i2 == len(a)):
            return old, new
        if i2 < len(a):
            i2, j2 = i2 + 1, j2 + 1
        else:
            i1, j1 = i1 - 1, j1 - 1


def expert_calls(task: Task, name: str, operands: dict | None = None) -> list[dict]:
    """The expert's tool calls for a task under the episode's function name (and its operands' filler names, where
    the episode draws them), then its answer as `{"answer": ...}` (the turn without a tool call)."""
    file = f"{name}.py"
    buggy = renamed_operands(renamed_source(task.source, task.func, name), operands)
    fixed = renamed_operands(renamed_source(apply_op(task, task.oracle), task.func, name), operands)
    old, new = fix_edit(buggy, fixed)
    path = f"{REPO_ROOT}/{file}"
    return [{"name": "Read", "arguments": {"file_path": path}},
            {"name": "Edit", "arguments": {"file_path": path, "old_string": old, "new_string": new}},
            {"name": "Bash", "arguments": {"command": f"pytest -q test_{file}"}},
            {"answer": FINAL_ANSWER.format(name=name, file=file)}]


def play(env, actions: list[dict]) -> list[tuple[dict, str | None]]:
    """Drive an environment with a fixed sequence of actions (tool calls, then `{"answer": text}`); returns each
    action with its observation. Stops early if the episode ends."""
    transcript = []
    for action in actions:
        if env.done:
            break
        if "answer" in action:
            transcript.append((action, env.step(None, action["answer"])))
        else:
            transcript.append((action, env.step(action)))
    return transcript
