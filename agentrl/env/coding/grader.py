"""The hidden-test grader. The sandbox computes the candidate function's outputs on the test inputs and nothing
else; the expected values never leave this process, which compares them (exact type and value, as the gym does).
A run that does not print exactly one result line under this run's nonce, or prints one of the wrong shape,
passes nothing."""
from __future__ import annotations

import json
import secrets
from dataclasses import dataclass

from agentrl.env.coding.sandbox.launch import Limits, run

_DEPTH = 20


@dataclass(frozen=True)
class Grade:
    passed: tuple            # one bool per case
    reason: str              # "ok", or why nothing passed ("no result: timeout", ...)

    @property
    def all_passed(self) -> bool:
        return bool(self.passed) and all(self.passed)


def decode(tree, depth: int = 0):
    """The value of a tagged tree written by harness.encode; ValueError for anything else."""
    if depth > _DEPTH or not (isinstance(tree, list) and len(tree) == 2 and isinstance(tree[0], str)):
        raise ValueError("malformed value")
    tag, raw = tree
    if tag == "none" and raw is None:
        return None
    if tag == "bool" and isinstance(raw, bool):
        return raw
    if tag == "int" and isinstance(raw, str):
        return int(raw)
    if tag == "float" and isinstance(raw, (int, float)) and not isinstance(raw, bool):
        return float(raw)
    if tag == "float" and raw in ("nan", "inf", "-inf"):
        return float(raw)
    if tag == "str" and isinstance(raw, str):
        return raw
    if tag in ("list", "tuple") and isinstance(raw, list):
        items = [decode(v, depth + 1) for v in raw]
        return items if tag == "list" else tuple(items)
    if tag == "dict" and isinstance(raw, list):
        return {decode(k, depth + 1): decode(v, depth + 1) for k, v in raw}
    raise ValueError(f"malformed value tagged {tag!r}")


def same(got, expected) -> bool:
    return type(got) is type(expected) and got == expected


def grade(source: str, function: str, cases, limits: Limits = Limits()) -> Grade:
    """Run `function` of the module `function.py` (text `source`) on each case's arguments in the sandbox and
    compare the outputs with the expected values here. `cases`: ((args, expected), ...)."""
    nonce = secrets.token_hex(16)
    module = f"{function}.py"
    execution = run({module: source}, {"mode": "probe", "module": module, "function": function,
                                       "cases": [list(a) for a, _ in cases], "nonce": nonce}, limits)
    fail = tuple(False for _ in cases)
    lines = [line[len(nonce) + 1:] for line in execution.stdout.split("\n") if line.startswith(nonce + " ")]
    if execution.status != "exited":
        return Grade(fail, f"no result: {execution.status}")
    if len(lines) != 1:
        return Grade(fail, f"no result: {len(lines)} result lines")
    try:
        outputs = json.loads(lines[0])
        if not isinstance(outputs, list) or len(outputs) != len(cases):
            raise ValueError("wrong number of outputs")
        passed = []
        for out, (_, expected) in zip(outputs, cases):
            if not (isinstance(out, list) and len(out) == 2 and out[0] in ("ok", "error")):
                raise ValueError("malformed output")
            passed.append(out[0] == "ok" and same(decode(out[1]), expected))
    except (ValueError, TypeError, RecursionError) as exc:
        return Grade(fail, f"no result: {str(exc)[:80]}")
    return Grade(tuple(passed), "ok")
