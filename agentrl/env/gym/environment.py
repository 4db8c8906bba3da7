"""The coding gym: hidden-test execution, observations, and the tool-calling environment.

An episode: prompt `<bos> fix NAME`, then turns. Each turn the caller emits one call
`<call> TOOL [ARG] </call>` and (unless the episode just ended) the environment answers `<obs> ... </obs>`.
Only authored code ever runs: the caller chooses among ops, it never writes code.
"""
from __future__ import annotations

import contextlib
import copy
import keyword
import re
import signal
import sys
import threading
from dataclasses import dataclass, field

import torch

from agentrl.core.config import REWARDS
from agentrl.env.base import EpisodeRecord
from agentrl.env.ops import OPS, apply_op
from agentrl.env.tasks import Task

TOOLS = ("read", "test", "edit", "submit")
CALL, END_CALL, OBS, END_OBS, NL = "<call>", "</call>", "<obs>", "</obs>", "<nl>"
# Episode function names: unrelated words, so the name carries no family information.
NAME_POOL = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
             "india", "juliet", "kilo", "lima", "mike", "oscar", "papa", "quebec")
ERROR_OBS = [OBS, "error", "invalid", "call", END_OBS]
CALL_KINDS = {"read": "read", "test": "test", "edit": "edit", "submit": "finish", "invalid": "invalid"}
EDITED_OBS = [OBS, "edited", END_OBS]

_TOKEN_RE = re.compile(r"\d+|[A-Za-z_]\w*|<=|>=|==|!=|//|\+=|-=|\*=|->|\S")


def code_tokens(text: str) -> list[str]:
    """Word-level tokens of code or test output; line breaks become `<nl>`, indentation is dropped."""
    out: list[str] = []
    for line in text.strip("\n").split("\n"):
        toks = _TOKEN_RE.findall(line)
        if toks:
            if out:
                out.append(NL)
            out.extend(toks)
    return out


# ---------------------------------------------------------------- test execution (deterministic, cached)

@dataclass(frozen=True)
class TestReport:
    public: tuple      # ((ok, args, actual_repr, expected), ...)
    hidden_ok: tuple   # (bool, ...)

    @property
    def public_pass(self) -> bool:
        return all(r[0] for r in self.public)

    @property
    def hidden_pass(self) -> bool:
        return all(self.hidden_ok)


_REPORT_CACHE: dict[tuple[str, str, str | None], TestReport] = {}
CALL_LINES = 100_000   # Python lines one test call may run (the authored programs need a few dozen) ...
CALL_SECONDS = 2.0     # ... and wall-clock seconds, a backstop for a program stuck outside Python lines


class ProgramTimeout(Exception):
    """A candidate program ran past its budget; it fails that test and the episode goes on."""


@contextlib.contextmanager
def time_limit(lines: int = CALL_LINES, seconds: float = CALL_SECONDS):
    """Stop the code run inside after `lines` executed Python lines (deterministic) or `seconds` of wall time
    (main thread only), raising ProgramTimeout."""
    count = [0]

    def local(frame, event, arg):
        if event == "line":
            count[0] += 1
            if count[0] > lines:
                raise ProgramTimeout(f"more than {lines} lines")
        return local

    def on_alarm(signum, frame):
        raise ProgramTimeout(f"more than {seconds} s")

    alarm = threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer")
    if alarm:
        previous_handler = signal.signal(signal.SIGALRM, on_alarm)
        signal.setitimer(signal.ITIMER_REAL, seconds)
    previous_trace = sys.gettrace()
    sys.settrace(lambda frame, event, arg: local)
    try:
        yield
    finally:
        sys.settrace(previous_trace)
        if alarm:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous_handler)


def _call(fn, args, expected):
    try:
        with time_limit():
            got = fn(*copy.deepcopy(args))
    except ProgramTimeout:
        return False, "timeout"
    except Exception:  # authored code can raise (ZeroDivisionError is the point of the zero family)
        return False, "error"
    return (type(got) is type(expected) and got == expected), repr(got)


def run_tests(task: Task, op: str | None) -> TestReport:
    """Run the task's public and hidden tests on its source after `op`; cached per (task, op)."""
    key = (task.name, task.source, op)
    if key not in _REPORT_CACHE:
        src = apply_op(task, op)
        ns: dict = {}
        with time_limit():
            exec(compile(src, f"<{task.name}:{op}>", "exec"), ns)
        fn = ns[task.func]
        public = tuple((*_call(fn, a, e), a, e) for a, e in task.public)
        public = tuple((ok, a, got, e) for ok, got, a, e in public)
        hidden = tuple(_call(fn, a, e)[0] for a, e in task.hidden)
        _REPORT_CACHE[key] = TestReport(public, hidden)
    return _REPORT_CACHE[key]


def _fmt_args(args) -> str:
    return "(" + ", ".join(repr(a) for a in args) + ")"


def test_observation(report: TestReport) -> list[str]:
    """One line per public test: `fail ( 2 , 2 ) -> False want True`."""
    lines = [f"{'pass' if ok else 'fail'} {_fmt_args(a)} -> {got} want {e!r}" for ok, a, got, e in report.public]
    return code_tokens("\n".join(lines))


def source_observation(task: Task, op: str | None, name: str, operands: dict | None = None) -> list[str]:
    """Tokens of the current source as `read` shows it: the episode's function name (and, where the episode draws
    them, its operands' filler names)."""
    src = apply_op(task, op)
    src = re.sub(rf"\bdef {task.func}\(", f"def {name}(", src, count=1)
    toks = code_tokens(src)
    return [operands.get(t, t) for t in toks] if operands else toks


def operand_names(source: str, func: str) -> set[str]:
    """The variables a source names (parameters, locals, loop and comprehension targets), other than builtins,
    imported modules and its function name: never an attribute (`xs.append`) and never a word inside a string
    literal, so renaming them (filler_operands) keeps what the program computes. For the authored catalogue (no
    attributes, strings or imports) this is every identifier that is not a keyword or builtin."""
    import ast
    import builtins
    tree = ast.parse(source)
    imported = {(a.asname or a.name).split(".")[0] for n in ast.walk(tree)
                if isinstance(n, (ast.Import, ast.ImportFrom)) for a in n.names}
    idents = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name)} | \
        {n.arg for n in ast.walk(tree) if isinstance(n, ast.arg)}
    return {i for i in idents if not keyword.iskeyword(i) and not hasattr(builtins, i) and i != func
            and i not in imported}


def constants(source: str) -> set[str]:
    return set(re.findall(r"\b\d+\b", source))


# ---------------------------------------------------------------- the environment

def randomize_names(generator: torch.Generator) -> str:
    """An episode's function name, drawn from a pool of unrelated words."""
    return NAME_POOL[int(torch.randint(len(NAME_POOL), (1,), generator=generator, device=generator.device))]


@dataclass
class CodeEnv:
    """One episode on one task. `reset()` gives prompt tokens; `step(call_tokens)` gives obs tokens or None."""
    task: Task
    name: str
    max_turns: int = 6
    reward_kind: str = "hidden"
    operands: dict | None = None   # display renaming of operands (filler_operands)
    edit: str | None = None
    done: bool = False
    reward: float = 0.0
    info: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.reward_kind not in REWARDS:
            raise ValueError(f"reward: unknown value {self.reward_kind!r}; allowed: {', '.join(REWARDS)}")
        self.info = {"task": self.task.name, "family": self.task.family, "name": self.name,
                     "submitted": False, "hidden_pass": False, "public_pass": False, "n_invalid": 0,
                     "ops": [], "n_turns": 0, "reads": 0, "tests": 0, "edits": 0, "tools": []}

    def reset(self) -> list[str]:
        return ["<bos>", "fix", self.name]

    @staticmethod
    def parse(call: list[str]) -> tuple[str, str | None] | None:
        """(tool, arg) for a well-formed call, else None."""
        if len(call) < 3 or call[0] != CALL or call[-1] != END_CALL:
            return None
        body = call[1:-1]
        if len(body) == 1 and body[0] in ("read", "test", "submit"):
            return body[0], None
        if len(body) == 2 and body[0] == "edit" and body[1] in OPS:
            return "edit", body[1]
        return None

    def step(self, call: list[str]) -> list[str] | None:
        """Apply one call. Returns the observation, or None when the episode has ended."""
        assert not self.done, "step() after the episode ended"
        info = self.info
        info["n_turns"] += 1
        parsed = self.parse(call)
        if parsed is not None and parsed[0] == "edit" and self.edit is not None:
            parsed = None  # only one edit per episode
        if parsed is None:
            info["n_invalid"] += 1
            info["tools"].append("invalid")
            obs = ERROR_OBS
        else:
            tool, arg = parsed
            info["tools"].append(tool if arg is None else f"edit:{arg}")
            if tool == "read":
                info["reads"] += 1
                obs = [OBS] + source_observation(self.task, self.edit, self.name, self.operands) + [END_OBS]
            elif tool == "test":
                info["tests"] += 1
                obs = [OBS] + test_observation(run_tests(self.task, self.edit)) + [END_OBS]
            elif tool == "edit":
                info["edits"] += 1
                info["ops"].append(arg)
                self.edit = arg
                obs = EDITED_OBS
            else:  # submit
                info["submitted"] = True
                return self._finish()
        if info["n_turns"] >= self.max_turns:
            return self._finish()
        return list(obs)

    def record(self) -> EpisodeRecord:
        """The episode as every environment describes one; its counts: reads, test runs, edits, and `hardcode` (it
        applied hardcode_tests); its fact: whether the public tests pass."""
        info = self.info
        return EpisodeRecord(
            info["task"], info["family"], info["name"], turns=info["n_turns"], malformed=info["n_invalid"],
            finished=info["submitted"], passed=info["hidden_pass"], calls=tuple(info["tools"]),
            kinds=tuple(CALL_KINDS[c.split(":")[0]] for c in info["tools"]),
            counts={"reads": info["reads"], "tests": info["tests"], "edits": info["edits"],
                    "hardcode": "hardcode_tests" in info["ops"]},
            facts={"public_pass": info["public_pass"]})

    def _finish(self) -> None:
        report = run_tests(self.task, self.edit)
        self.info["hidden_pass"] = report.hidden_pass
        self.info["public_pass"] = report.public_pass
        passed = report.hidden_pass if self.reward_kind == "hidden" else report.public_pass
        self.reward = float(self.info["submitted"] and passed)
        self.done = True
        return None


def filler_operands(task: Task, episode_name: str, generator: torch.Generator) -> dict:
    """Map the task's operands to distinct filler names (from the function-name pool, minus the episode's
    function name), so that which identifiers a source uses carries no information about its family."""
    names = sorted(operand_names(task.source, task.func))
    pool = [n for n in NAME_POOL if n != episode_name]
    picks = torch.randperm(len(pool), generator=generator, device=generator.device)[:len(names)].tolist()
    return {old: pool[i] for old, i in zip(names, picks)}


def draw_operands(task: Task, episode_name: str, generator: torch.Generator, p_rename_operands: float) -> dict | None:
    """With probability p_rename_operands, the episode's filler names for the task's operands; else None (at 0 the
    generator is not drawn from)."""
    if p_rename_operands > 0 and \
            float(torch.rand((), generator=generator, device=generator.device)) < p_rename_operands:
        return filler_operands(task, episode_name, generator)
    return None


def make_env_factory(max_turns: int = 6, reward: str = "hidden", rename: bool = True, p_rename_operands: float = 0.0):
    """env_factory(task, generator) -> CodeEnv with a freshly drawn name (or the task's own if rename=False); with
    p_rename_operands > 0 that share of episodes shows the source's operands under filler names, also drawn per
    episode (at 0 the generator is drawn from exactly as before)."""
    if reward not in REWARDS:
        raise ValueError(f"reward: unknown value {reward!r}; allowed: {', '.join(REWARDS)}")

    def factory(task: Task, generator: torch.Generator) -> CodeEnv:
        name = randomize_names(generator) if rename else task.func
        return CodeEnv(task, name, max_turns=max_turns, reward_kind=reward,
                       operands=draw_operands(task, name, generator, p_rename_operands))
    return factory
