"""The coding gym: repair ops, hidden-test execution, the tool-calling environment, scripted callers.

An episode: prompt `<bos> fix NAME`, then turns. Each turn the caller emits one call
`<call> TOOL [ARG] </call>` and (unless the episode just ended) the environment answers `<obs> ... </obs>`.
Only authored code ever runs: the caller chooses among ops, it never writes code.
"""
from __future__ import annotations

import copy
import keyword
import re
from dataclasses import dataclass, field

import torch

from agentrl.config import REWARDS
from agentrl.tasks import Task

REPAIR_OPS = ("swap_minmax", "fix_range", "fix_init", "fix_comparison", "add_zero_guard")
OPS = REPAIR_OPS + ("hardcode_tests",)
TOOLS = ("read", "test", "edit", "submit")
CALL, END_CALL, OBS, END_OBS, NL = "<call>", "</call>", "<obs>", "</obs>", "<nl>"
# Episode function names: unrelated words, so the name carries no family information.
NAME_POOL = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel",
             "india", "juliet", "kilo", "lima", "mike", "oscar", "papa", "quebec")
ERROR_OBS = [OBS, "error", "invalid", "call", END_OBS]
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


# ---------------------------------------------------------------- ops: source -> source transforms

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


def _call(fn, args, expected):
    try:
        got = fn(*copy.deepcopy(args))
    except Exception:  # authored code can raise (ZeroDivisionError is the point of the zero family)
        return False, "error"
    return (type(got) is type(expected) and got == expected), repr(got)


def run_tests(task: Task, op: str | None) -> TestReport:
    """Run the task's public and hidden tests on its source after `op`; cached per (task, op)."""
    key = (task.name, task.source, op)
    if key not in _REPORT_CACHE:
        src = apply_op(task, op)
        ns: dict = {}
        exec(compile(src, f"<{task.name}:{op}>", "exec"), ns)  # noqa: S102 - authored code only
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
    """Tokens of the current source as `read` shows it: the episode's function name (and, for augmented
    demonstrations only, renamed operands)."""
    src = apply_op(task, op)
    src = re.sub(rf"\bdef {task.func}\(", f"def {name}(", src, count=1)
    toks = code_tokens(src)
    return [operands.get(t, t) for t in toks] if operands else toks


def operand_names(source: str, func: str) -> set[str]:
    """Identifiers a source uses, other than keywords, builtins and its function name."""
    import builtins
    idents = set(re.findall(r"[A-Za-z_]\w*", source))
    return {i for i in idents if not keyword.iskeyword(i) and not hasattr(builtins, i) and i != func}


def constants(source: str) -> set[str]:
    return set(re.findall(r"\b\d+\b", source))


# ---------------------------------------------------------------- the environment

def randomize_names(generator: torch.Generator) -> str:
    """An episode's function name, drawn from a pool of unrelated words."""
    return NAME_POOL[int(torch.randint(len(NAME_POOL), (1,), generator=generator))]


@dataclass
class CodeEnv:
    """One episode on one task. `reset()` gives prompt tokens; `step(call_tokens)` gives obs tokens or None."""
    task: Task
    name: str
    max_turns: int = 6
    reward_kind: str = "hidden"
    operands: dict | None = None   # display renaming of operands (augmented demonstrations only)
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

    def _finish(self) -> None:
        report = run_tests(self.task, self.edit)
        self.info["hidden_pass"] = report.hidden_pass
        self.info["public_pass"] = report.public_pass
        passed = report.hidden_pass if self.reward_kind == "hidden" else report.public_pass
        self.reward = float(self.info["submitted"] and passed)
        self.done = True
        return None


def make_env_factory(max_turns: int = 6, reward: str = "hidden", rename: bool = True):
    """env_factory(task, generator) -> CodeEnv with a freshly drawn name (or the task's own if rename=False)."""
    if reward not in REWARDS:
        raise ValueError(f"reward: unknown value {reward!r}; allowed: {', '.join(REWARDS)}")

    def factory(task: Task, generator: torch.Generator) -> CodeEnv:
        name = randomize_names(generator) if rename else task.func
        return CodeEnv(task, name, max_turns=max_turns, reward_kind=reward)
    return factory


# ---------------------------------------------------------------- scripted callers (reference policies)

def call_tokens(tool: str, arg: str | None = None) -> list[str]:
    return [CALL, tool] + ([arg] if arg else []) + [END_CALL]


ALL_CALLS = [call_tokens("read"), call_tokens("test"), call_tokens("submit")] + \
            [call_tokens("edit", op) for op in OPS]


class RandomCaller:
    """Each turn, a uniformly random well-formed call."""

    def __init__(self, generator: torch.Generator):
        self.generator = generator

    def __call__(self, obs: list[str] | None) -> list[str]:
        return list(ALL_CALLS[int(torch.randint(len(ALL_CALLS), (1,), generator=self.generator))])


class ExpertCaller:
    """The keyword-rule expert: read, edit with the keyword rule's op, test, submit."""

    def __init__(self, generator: torch.Generator | None = None):
        self.turn = 0
        self.op = None

    def __call__(self, obs: list[str] | None) -> list[str]:
        self.turn += 1
        if self.turn == 1:
            return call_tokens("read")
        if self.turn == 2:
            self.op = keyword_rule(obs)
            return call_tokens("edit", self.op)
        if self.turn == 3:
            return call_tokens("test")
        return call_tokens("submit")


def run_scripted(env: CodeEnv, caller) -> tuple[list[str], list[int]]:
    """Play one episode with a scripted caller. Returns (tokens, owner) with owner 0/1/2 = prompt/policy/env."""
    toks = env.reset()
    owner = [0] * len(toks)
    obs = None
    while not env.done:
        call = caller(obs)
        toks += call
        owner += [1] * len(call)
        obs = env.step(call)
        if obs is not None:
            toks += obs
            owner += [2] * len(obs)
    return toks, owner


def play(caller_factory, tasks: list[Task], episodes_per_task: int, generator: torch.Generator,
         max_turns: int = 6, reward: str = "hidden", rename: bool = True) -> list[CodeEnv]:
    """Play scripted episodes (caller_factory(generator) -> caller); returns the finished environments."""
    factory = make_env_factory(max_turns, reward, rename)
    envs = []
    for task in tasks:
        for _ in range(episodes_per_task):
            env = factory(task, generator)
            run_scripted(env, caller_factory(generator))
            envs.append(env)
    return envs


def environment_check(tasks: list[Task], episodes: int = 200, seed: int = 0, max_turns: int = 6) -> dict:
    """'Weak expert vs random': play the keyword-rule expert and the uniformly random caller on renamed
    functions. Returns, per policy, the mean reward, the reward distribution and per-family means."""
    out = {}
    for label, caller in (("expert", ExpertCaller), ("random", RandomCaller)):
        gen = torch.Generator().manual_seed(seed)
        per_task = -(-episodes // len(tasks))
        played = play(caller, tasks, per_task, gen, max_turns=max_turns)  # task-major order
        interleaved = [played[t * per_task + i] for i in range(per_task) for t in range(len(tasks))]
        envs = interleaved[:max(episodes, len(tasks))]  # a cut drops the same share of every task
        rewards = [e.reward for e in envs]
        fams: dict[str, list[float]] = {}
        for e in envs:
            fams.setdefault(e.task.family, []).append(e.reward)
        out[label] = {"episodes": len(envs), "mean_reward": sum(rewards) / len(rewards),
                      "reward_counts": {"0": rewards.count(0.0), "1": rewards.count(1.0)},
                      "per_family": {f: sum(r) / len(r) for f, r in sorted(fams.items())},
                      "mean_turns": sum(e.info["n_turns"] for e in envs) / len(envs),
                      "invalid_per_episode": sum(e.info["n_invalid"] for e in envs) / len(envs)}
    return out
