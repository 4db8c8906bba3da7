"""Bash, emulated: an allowlist of commands, parsed here and never given to a shell. `ls`, `cat` and `grep` read the
in-memory repository; `pytest` and `python FILE.py` run in the sandbox on a copy of it."""
from __future__ import annotations

import shlex

from agentrl.env.coding.calls import MALFORMED, NO_SUCH_FILE, REFUSED, ToolResult, error
from agentrl.env.coding.repository import Repository
from agentrl.env.coding.sandbox.launch import Execution, Limits, run
from agentrl.env.coding.schemas import MAX_BASH_TIMEOUT_MS

ALLOWED = "pytest, python FILE.py, ls, cat, grep"
OBSERVATION_CHARS = 4000
_OPERATORS = set("|&;<>()")
PYTEST_FLAGS = {"-q": {}, "--quiet": {}, "-v": {"verbose": True}, "-vv": {"verbose": True},
                "--verbose": {"verbose": True}, "-x": {"exitfirst": True}, "--exitfirst": {"exitfirst": True},
                "-s": {}, "--tb=short": {}, "--tb=no": {}, "--tb=line": {}, "-rA": {}}


def clip(text: str, limit: int = OBSERVATION_CHARS) -> str:
    """Head and tail of a long output (a test summary is at the end)."""
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n... [{len(text) - limit} characters omitted] ...\n{text[-half:]}"


def describe(execution: Execution, limits: Limits) -> str:
    """The observation of a sandboxed run: what it printed, then how it ended when that was not a plain exit 0."""
    text = execution.stdout + (("\n" if execution.stdout and not execution.stdout.endswith("\n") else "")
                               + execution.stderr if execution.stderr else "")
    endings = {"timeout": f"Killed: the wall-time limit of {limits.wall_seconds:g} s was reached.",
               "cpu-limit": f"Killed: the CPU-time limit of {limits.cpu_seconds} s was reached.",
               "output-limit": f"Killed: the output passed {limits.output_bytes // 1024} KiB."}
    status = execution.status
    if status in endings:
        tail = endings[status]
    elif status.startswith("signal:"):
        tail = f"Killed by {status.split(':', 1)[1]}."
    else:
        tail = f"Exit code {execution.exit_code}" if execution.exit_code else ""
    return clip(text.rstrip("\n") + ("\n" + tail if tail else "")) or "(no output)"


def _tokens(command: str) -> list[str]:
    lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
    lexer.whitespace_split = True
    return list(lexer)


def run_bash(repo: Repository, command: str, timeout_ms: int | None = None,
             limits: Limits = Limits()) -> tuple[ToolResult, str | None]:
    """The observation and which program ran in the sandbox ('pytest', 'python' or None)."""
    if timeout_ms is not None and not 0 < timeout_ms <= MAX_BASH_TIMEOUT_MS:
        return error(MALFORMED, f"Bash: timeout must be between 1 and {MAX_BASH_TIMEOUT_MS} ms"), None
    try:
        argv = _tokens(command)
    except ValueError as exc:
        return error(MALFORMED, f"Bash: cannot parse the command ({exc})"), None
    if not argv:
        return error(MALFORMED, "Bash: empty command"), None
    if any(set(t) <= _OPERATORS for t in argv):
        return error(REFUSED, f"Bash: pipes, redirection and command lists are not available; run one command "
                              f"({ALLOWED})"), None
    if timeout_ms is not None:
        limits = Limits(**{**limits.__dict__, "wall_seconds": min(limits.wall_seconds, timeout_ms / 1000)})
    head, rest = argv[0], argv[1:]
    if head in ("python", "python3") and rest[:2] == ["-m", "pytest"]:
        head, rest = "pytest", rest[2:]
    if head == "pytest":
        return _pytest(repo, rest, limits), "pytest"
    if head in ("python", "python3"):
        return _python(repo, rest, limits)
    if head == "ls":
        return _ls(repo, rest), None
    if head == "cat":
        return _cat(repo, rest), None
    if head == "grep":
        return _grep(repo, rest), None
    return error(REFUSED, f"Bash: {head!r} is not available here; allowed: {ALLOWED}"), None


def _pytest(repo: Repository, rest: list[str], limits: Limits) -> ToolResult:
    options, targets = {}, []
    for arg in rest:
        if arg.startswith("-"):
            if arg not in PYTEST_FLAGS:
                return error(MALFORMED, f"pytest: option {arg!r} is not available; allowed: "
                                        f"{', '.join(PYTEST_FLAGS)}")
            options.update(PYTEST_FLAGS[arg])
        else:
            file = arg.split("::", 1)[0]
            try:
                name = repo.normalize(file)
            except ValueError as exc:
                return error(MALFORMED, f"pytest: {exc}")
            targets.append(name + arg[len(file):])
    execution = run(dict(repo.files), {"mode": "pytest", "targets": targets, **options}, limits)
    return ToolResult(describe(execution, limits))


def _python(repo: Repository, rest: list[str], limits: Limits) -> tuple[ToolResult, str | None]:
    if not rest or rest[0].startswith("-"):
        return error(REFUSED, f"Bash: only `python FILE.py` is available (no options, no -c); allowed: "
                              f"{ALLOWED}"), None
    try:
        name = repo.normalize(rest[0])
    except ValueError as exc:
        return error(MALFORMED, f"python: {exc}"), None
    if name not in repo.files:
        return error(NO_SUCH_FILE, f"python: can't open file {name!r}: [Errno 2] No such file or directory"), None
    execution = run(dict(repo.files), {"mode": "script", "path": name, "argv": rest[1:]}, limits)
    return ToolResult(describe(execution, limits)), "python"


def _names(repo: Repository, args: list[str], verb: str) -> tuple[list[str], ToolResult | None]:
    names = []
    for arg in args:
        try:
            name = repo.normalize(arg)
        except ValueError as exc:
            return [], error(MALFORMED, f"{verb}: {exc}")
        if name not in repo.files:
            return [], error(NO_SUCH_FILE, f"{verb}: {arg}: No such file or directory")
        names.append(name)
    return names, None


def _ls(repo: Repository, rest: list[str]) -> ToolResult:
    flags = [a for a in rest if a.startswith("-")]
    paths = [a for a in rest if not a.startswith("-") and a.rstrip("/") not in (".", "/repo", "")]
    if any(f not in ("-l", "-a", "-la", "-al", "-1") for f in flags):
        return error(MALFORMED, "ls: options available: -l, -a, -1")
    names, failed = _names(repo, paths, "ls")
    if failed:
        return failed
    shown = names or sorted(repo.files)
    if any("l" in f for f in flags):
        return ToolResult("\n".join(f"-rw-r--r-- 1 user user {len(repo.files[n].encode()):>6} {n}" for n in shown))
    return ToolResult("\n".join(shown))


def _cat(repo: Repository, rest: list[str]) -> ToolResult:
    if not rest or any(a.startswith("-") for a in rest):
        return error(MALFORMED, "cat: give one or more file names (no options)")
    names, failed = _names(repo, rest, "cat")
    if failed:
        return failed
    return ToolResult(clip("".join(repo.files[n] for n in names)) or "(empty)")


def _grep(repo: Repository, rest: list[str]) -> ToolResult:
    flags = set()
    args = list(rest)
    while args and args[0].startswith("-") and len(args[0]) > 1:
        flags |= set(args.pop(0)[1:])
    if flags - set("nicFr"):
        return error(MALFORMED, "grep: options available: -n, -i, -c, -F, -r (the pattern is plain text)")
    if not args:
        return error(MALFORMED, "grep: usage: grep [-n] [-i] [-c] TEXT [FILE...]")
    pattern, paths = args[0], [a for a in args[1:] if a.rstrip("/") not in (".", "/repo")]
    names, failed = _names(repo, paths, "grep")
    if failed:
        return failed
    names = names or sorted(repo.files)
    needle = pattern.lower() if "i" in flags else pattern
    out = []
    for name in names:
        hits = [(i, line) for i, line in enumerate(repo.files[name].split("\n"), 1)
                if needle in (line.lower() if "i" in flags else line)]
        prefix = f"{name}:" if len(names) > 1 else ""
        if "c" in flags:
            out.append(f"{prefix}{len(hits)}")
        else:
            out += [f"{prefix}{f'{i}:' if 'n' in flags else ''}{line}" for i, line in hits]
    return ToolResult(clip("\n".join(out)) if out else "(no matches; exit code 1)")
