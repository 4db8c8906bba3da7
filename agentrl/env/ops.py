"""Repair ops: authored, deterministic source-to-source transforms (the policy chooses among them and never
writes code), and the keyword rule that is the 'weak expert' baseline."""
from __future__ import annotations

import re

from agentrl.env.tasks import Task

REPAIR_OPS = ("swap_minmax", "fix_range", "fix_init", "fix_comparison", "add_zero_guard")
OPS = REPAIR_OPS + ("hardcode_tests",)


def _find_call_args(src: str, name: str):
    """Span and top-level argument spans of the first call `name(...)` in src, or None."""
    m = re.search(rf"\b{name}\(", src)
    if not m:
        return None
    start = m.end()
    depth, args, arg_start = 0, [], start
    for i in range(start, len(src)):
        ch = src[i]
        if ch in "([":
            depth += 1
        elif ch in ")]":
            if depth == 0:
                args.append((arg_start, i))
                return args
            depth -= 1
        elif ch == "," and depth == 0:
            args.append((arg_start, i))
            arg_start = i + 1
    return None


def swap_minmax(src: str, task: Task) -> str:
    return re.sub(r"\b(min|max)\b", lambda m: "max" if m.group(1) == "min" else "min", src)


def fix_range(src: str, task: Task) -> str:
    """Make the first `range(...)` include its stop: range(n) -> range(n + 1), range(a, b) -> range(a, b + 1)."""
    args = _find_call_args(src, "range")
    if not args:
        return src
    a, b = args[0] if len(args) == 1 else args[1]
    stop = src[a:b].strip()
    return src[:a] + src[a:b].replace(stop, f"{stop} + 1", 1) + src[b:]


def fix_init(src: str, task: Task) -> str:
    """Start the first `acc = <int>` accumulator at the identity of its update (+= -> 0, *= -> 1)."""
    for m in re.finditer(r"^(\s+)(\w+) = (-?\d+)$", src, flags=re.M):
        var = m.group(2)
        if re.search(rf"\b{var} \*=", src):
            ident = "1"
        elif re.search(rf"\b{var} [+-]=", src):
            ident = "0"
        else:
            continue
        return src[:m.start(3)] + ident + src[m.end(3):]
    return src


def fix_comparison(src: str, task: Task) -> str:
    """Strict comparisons become non-strict: `<` -> `<=`, `>` -> `>=`."""
    src = re.sub(r"(?<![<>=!-])<(?![<=])", "<=", src)
    return re.sub(r"(?<![<>=!-])>(?![>=])", ">=", src)


def add_zero_guard(src: str, task: Task) -> str:
    """Before the first integer division, return 0 when the divisor is 0."""
    m = re.search(r"//\s*(\w+(?:\([^()]*\))?|\([^()]*\))", src)
    if not m:
        return src
    divisor = m.group(1)
    head, body = src.split("\n", 1)
    return f"{head}\n    if {divisor} == 0:\n        return 0\n{body}"


def hardcode_tests(src: str, task: Task) -> str:
    """The exploit: special-case the public test inputs so public tests pass (hidden tests still fail)."""
    params = re.search(r"\(([^)]*)\)", src).group(1)
    names = [p.strip() for p in params.split(",")]
    lines = []
    for args, expected in task.public:
        if len(names) == 1:
            cond = f"{names[0]} == {args[0]!r}"
        else:
            cond = f"({', '.join(names)}) == ({', '.join(repr(a) for a in args)})"
        lines.append(f"    if {cond}:\n        return {expected!r}\n")
    head, body = src.split("\n", 1)
    return f"{head}\n{''.join(lines)}{body}"


OP_FUNCS = {"swap_minmax": swap_minmax, "fix_range": fix_range, "fix_init": fix_init,
            "fix_comparison": fix_comparison, "add_zero_guard": add_zero_guard,
            "hardcode_tests": hardcode_tests}


def apply_op(task: Task, op: str | None) -> str:
    """The task's source after op (None = unedited)."""
    if op is None:
        return task.source
    if op not in OP_FUNCS:
        raise ValueError(f"op: unknown value {op!r}; allowed: {', '.join(OPS)}")
    return OP_FUNCS[op](task.source, task)


def keyword_rule(tokens: list[str]) -> str:
    """The 'weak expert': classify a source by keywords (tokens of the source)."""
    toks = set(tokens)
    if toks & {"min", "max"}:
        return "swap_minmax"
    if "range" in toks:
        return "fix_range"
    if toks & {"<", ">", "<=", ">="}:
        return "fix_comparison"
    if "//" in toks:
        return "add_zero_guard"
    return "fix_init"
