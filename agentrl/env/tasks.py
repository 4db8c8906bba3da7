"""The task catalogue: 5 bug families x 6 variants of small buggy Python functions.

Each variant is authored by hand: a buggy source, public tests (shown by the `test` tool), hidden tests
(used for the reward, disjoint from the public ones) and the oracle op that repairs it. Variants 1-4 of a
family are for training; 5 (validation) and 6 (test) are held out and use operand names and constants that
never appear in the family's training variants.
"""
from __future__ import annotations

from dataclasses import dataclass

from agentrl.core.config import FAMILIES

ORACLE_OP = {
    "minmax": "swap_minmax",
    "range": "fix_range",
    "init": "fix_init",
    "compare": "fix_comparison",
    "zero": "add_zero_guard",
}
SPLITS = ("train", "validation", "test", "heldout", "all")


@dataclass(frozen=True)
class Task:
    name: str            # "family/variant"
    family: str
    func: str            # function name in the authored source
    source: str          # buggy source, 4-space indented
    public: tuple        # ((args, expected), ...)
    hidden: tuple
    oracle: str          # the op that repairs it
    split: str           # train | validation | test

    def to_dict(self) -> dict:
        return {"name": self.name, "family": self.family, "func": self.func, "source": self.source,
                "public": [[list(a), e] for a, e in self.public],
                "hidden": [[list(a), e] for a, e in self.hidden],
                "oracle": self.oracle, "split": self.split}


def _t(*cases):
    """Test cases written as (arg1, ..., expected)."""
    return tuple((tuple(c[:-1]), c[-1]) for c in cases)


# (variant, source, public, hidden); order: 4 train, then validation, then test.
_CATALOGUE = {
    "minmax": [
        ("largest", "def largest(xs):\n    return min(xs)\n",
         _t(([3, 7, 5], 7), ([2, 9], 9)),
         _t(([4, 1, 8], 8), ([6], 6), ([5, 5, 2], 5), ([-3, -1], -1), ([10, 0, 20], 20))),
        ("smallest", "def smallest(vals):\n    return max(vals)\n",
         _t(([3, 7, 5], 3), ([9, 2], 2)),
         _t(([4, 1, 8], 1), ([6], 6), ([5, 5, 2], 2), ([-3, -1], -3), ([10, 0, 20], 0))),
        ("cap", "def cap(n, k):\n    return max(n, k)\n",
         _t((5, 3, 3), (2, 8, 2)),
         _t((9, 4, 4), (1, 1, 1), (7, 6, 6), (0, 5, 0), (12, 10, 10))),
        ("best_pair", "def best_pair(a, b, x):\n    return min(a + b, b + x)\n",
         _t((1, 2, 3, 5), (4, 0, 1, 4)),
         _t((2, 2, 2, 4), (5, 1, 0, 6), (0, 3, 4, 7), (1, 1, 9, 10), (6, 2, 1, 8))),
        ("peak", "def peak(readings):\n    return min(readings)\n",
         _t(([3, 7, 5], 7), ([2, 9], 9)),
         _t(([4, 1, 8], 8), ([6], 6), ([5, 5, 2], 5), ([-3, -1], -1), ([10, 0, 20], 20))),
        ("ceiling", "def ceiling(temp):\n    return max(temp, 40)\n",
         _t((50, 40), (12, 12)),
         _t((41, 40), (40, 40), (0, 0), (99, 40), (39, 39))),
    ],
    "range": [
        ("sum_to", "def sum_to(n):\n    return sum(range(n))\n",
         _t((3, 6), (1, 1)),
         _t((4, 10), (5, 15), (2, 3), (6, 21), (0, 0))),
        ("squares", "def squares(k):\n    return [x * x for x in range(1, k)]\n",
         _t((3, [1, 4, 9]), (1, [1])),
         _t((2, [1, 4]), (4, [1, 4, 9, 16]), (0, []), (5, [1, 4, 9, 16, 25]), (-1, []))),
        ("factorial", "def factorial(n):\n    p = 1\n    for i in range(1, n): p *= i\n    return p\n",
         _t((3, 6), (4, 24)),
         _t((1, 1), (2, 2), (5, 120), (6, 720), (0, 1))),
        ("count_up", "def count_up(lo, hi):\n    return list(range(lo, hi))\n",
         _t((1, 3, [1, 2, 3]), (5, 5, [5])),
         _t((0, 2, [0, 1, 2]), (4, 6, [4, 5, 6]), (7, 7, [7]), (3, 4, [3, 4]), (9, 8, []))),
        ("evens", "def evens(limit):\n    return [q for q in range(2, limit, 2)]\n",
         _t((6, [2, 4, 6]), (4, [2, 4])),
         _t((8, [2, 4, 6, 8]), (2, [2]), (3, [2]), (10, [2, 4, 6, 8, 10]), (5, [2, 4]))),
        ("tail_sum", "def tail_sum(stop):\n    return sum(range(3, stop))\n",
         _t((5, 12), (3, 3)),
         _t((4, 7), (6, 18), (7, 25), (2, 0), (8, 33))),
    ],
    "init": [
        ("total", "def total(xs):\n    s = 1\n    for x in xs: s += x\n    return s\n",
         _t(([1, 2], 3), ([4], 4)),
         _t(([], 0), ([5, 5], 10), ([2, 3, 4], 9), ([-1, 1], 0), ([7, 0], 7))),
        ("product", "def product(vals):\n    p = 0\n    for v in vals: p *= v\n    return p\n",
         _t(([2, 3], 6), ([5], 5)),
         _t(([], 1), ([1, 4], 4), ([2, 2, 2], 8), ([3, -1], -3), ([6, 1], 6))),
        ("count_items", "def count_items(items):\n    c = 1\n    for i in items: c += 1\n    return c\n",
         _t(([7, 8], 2), ([], 0)),
         _t(([1], 1), ([3, 3, 3], 3), ([0, 0, 0, 0], 4), ([9, 2], 2), ([5, 6, 7, 8, 9], 5))),
        ("sum_squares", "def sum_squares(xs):\n    acc = 1\n    for n in xs: acc += n * n\n    return acc\n",
         _t(([1, 2], 5), ([3], 9)),
         _t(([], 0), ([2, 2], 8), ([1, 1, 1], 3), ([-2], 4), ([4, 0], 16))),
        ("weight", "def weight(grams):\n    w = 5\n    for g in grams: w += g\n    return w\n",
         _t(([10, 20], 30), ([3], 3)),
         _t(([], 0), ([1, 1], 2), ([4, 6, 8], 18), ([-2, 2], 0), ([9], 9))),
        ("scale", "def scale(ratios):\n    f = 3\n    for r in ratios: f *= r\n    return f\n",
         _t(([2, 4], 8), ([7], 7)),
         _t(([], 1), ([1, 5], 5), ([3, 3], 9), ([2, -2], -4), ([10, 1], 10))),
    ],
    "compare": [
        ("at_least", "def at_least(x, lo):\n    return x > lo\n",
         _t((5, 3, True), (3, 3, True), (1, 2, False)),
         _t((4, 4, True), (0, 0, True), (2, 5, False), (9, 1, True), (6, 7, False))),
        ("count_below", "def count_below(xs, k):\n    return len([x for x in xs if x < k])\n",
         _t(([1, 5, 3], 3, 2), ([9], 4, 0)),
         _t(([2, 2], 2, 2), ([1, 2, 3], 3, 3), ([], 1, 0), ([7, 8], 8, 2), ([4, 6], 5, 1))),
        ("between", "def between(n, lo, hi):\n    return lo < n < hi\n",
         _t((1, 1, 5, True), (3, 1, 5, True), (9, 1, 5, False)),
         _t((5, 1, 5, True), (2, 2, 2, True), (0, 1, 5, False), (4, 4, 8, True), (7, 3, 7, True))),
        ("all_within", "def all_within(vals, b):\n    return all(v < b for v in vals)\n",
         _t(([1, 2], 2, True), ([5], 3, False)),
         _t(([4, 4], 4, True), ([1], 1, True), ([0, 9], 8, False), ([], 0, True), ([2, 3], 3, True))),
        ("under_cap", "def under_cap(weight, allowed):\n    return weight < allowed\n",
         _t((6, 6, True), (9, 2, False)),
         _t((3, 3, True), (1, 4, True), (8, 7, False), (0, 0, True), (5, 5, True))),
        ("in_band", "def in_band(level):\n    return 20 < level < 80\n",
         _t((20, True), (50, True), (90, False)),
         _t((80, True), (79, True), (19, False), (81, False), (21, True))),
    ],
    "zero": [
        ("ratio", "def ratio(a, b):\n    return a // b\n",
         _t((6, 3, 2), (5, 0, 0)),
         _t((7, 2, 3), (0, 0, 0), (9, 0, 0), (8, 4, 2), (1, 0, 0))),
        ("rate", "def rate(n, xs):\n    return n // len(xs)\n",
         _t((6, [1, 2], 3), (4, [], 0)),
         _t((9, [1, 1, 1], 3), (0, [], 0), (7, [], 0), (8, [5, 5, 5, 5], 2), (5, [2], 5))),
        ("per_item", "def per_item(x, k):\n    return x // k\n",
         _t((10, 5, 2), (4, 0, 0)),
         _t((9, 3, 3), (7, 0, 0), (0, 0, 0), (12, 4, 3), (2, 0, 0))),
        ("share", "def share(vals, n):\n    return sum(vals) // n\n",
         _t(([4, 4], 2, 4), ([3], 0, 0)),
         _t(([6], 3, 2), ([1, 1], 0, 0), ([5], 0, 0), ([10, 10], 5, 4), ([], 0, 0))),
        ("speed", "def speed(dist, hours):\n    return dist // hours\n",
         _t((60, 3, 20), (15, 0, 0)),
         _t((10, 2, 5), (8, 0, 0), (0, 0, 0), (9, 3, 3), (4, 0, 0))),
        ("chunks", "def chunks(size, parts):\n    return (size + 7) // parts\n",
         _t((5, 3, 4), (1, 0, 0)),
         _t((9, 4, 4), (3, 0, 0), (0, 0, 0), (13, 5, 4), (2, 0, 0))),
    ],
}
_SPLIT_OF_VARIANT = ("train", "train", "train", "train", "validation", "test")


def _build_catalogue() -> tuple[Task, ...]:
    out = []
    for family in FAMILIES:
        variants = _CATALOGUE[family]
        assert len(variants) == 6, family
        for (variant, source, public, hidden), split in zip(variants, _SPLIT_OF_VARIANT):
            func = source.split("(", 1)[0].removeprefix("def ").strip()
            out.append(Task(f"{family}/{variant}", family, func, source, public, hidden,
                            ORACLE_OP[family], split))
    return tuple(out)


CATALOGUE = _build_catalogue()


def of_split(tasks, split: str) -> list[Task]:
    """The tasks of one split: train, validation, test, heldout (validation and test) or all."""
    if split not in SPLITS:
        raise ValueError(f"split: unknown value {split!r}; allowed: {', '.join(SPLITS)}")
    if split == "all":
        return list(tasks)
    if split == "heldout":
        return [t for t in tasks if t.split in ("validation", "test")]
    return [t for t in tasks if t.split == split]


def task_record(task: Task) -> dict:
    """A task as JSON, its test cases as Python literals (tuples, sets and floats survive the trip): the form of
    data/humaneval/tasks.json."""
    return {"name": task.name, "family": task.family, "func": task.func, "source": task.source,
            "public": [repr(c) for c in task.public], "hidden": [repr(c) for c in task.hidden],
            "oracle": task.oracle, "split": task.split}


def task_from_record(record: dict) -> Task:
    import ast
    cases = {k: tuple(ast.literal_eval(c) for c in record[k]) for k in ("public", "hidden")}
    return Task(record["name"], record["family"], record["func"], record["source"], cases["public"],
                cases["hidden"], record["oracle"], record["split"])


def humaneval_tasks(path=None) -> tuple[Task, ...]:
    """The tasks stage humaneval built from HumanEval's functions (data/humaneval/tasks.json), with a one-line error
    where it has not run."""
    from pathlib import Path

    from agentrl.core.artifacts import DATA, StageError, read_json
    path = Path(path) if path is not None else DATA / "humaneval" / "tasks.json"
    if not path.is_file():
        raise StageError(f"{path}: not found; build the HumanEval tasks first (dvc repro humaneval)")
    return tuple(task_from_record(r) for r in read_json(path)["tasks"])


TASK_SOURCES = {"authored": lambda: CATALOGUE, "humaneval": humaneval_tasks}


def make_tasks(split: str = "all", source: str = "authored") -> list[Task]:
    """Tasks of one split of a source. The authored catalogue: 'train' (20), 'validation' (5), 'test' (5),
    'heldout' (10) or 'all' (30); humaneval: its build's splits (reports/humaneval.md)."""
    if source not in TASK_SOURCES:
        raise ValueError(f"tasks: unknown source {source!r}; allowed: {', '.join(TASK_SOURCES)}")
    if split not in SPLITS:
        raise ValueError(f"split: unknown value {split!r}; allowed: {', '.join(SPLITS)}")
    return of_split(TASK_SOURCES[source](), split)


def task_by_name(name: str) -> Task:
    for t in CATALOGUE:
        if t.name == name:
            return t
    raise KeyError(f"task: unknown name {name!r}")


def load_split(path=None) -> dict:
    """{'train': [Task], 'validation': [...], 'test': [...], 'heldout': [...]} from the tasks stage's split file,
    with a one-line error for a missing, corrupted or empty split."""
    from agentrl.core.artifacts import SPLIT, StageError, read_json
    path = SPLIT if path is None else path
    split = read_json(path)
    if not isinstance(split, dict):
        raise StageError(f"{path}: expected an object with train, validation and test lists; re-run the tasks stage")
    out = {}
    for part in ("train", "validation", "test"):
        names = split.get(part)
        if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
            raise StageError(f"{path}: {part}: expected a list of task names; re-run the tasks stage")
        if not names:
            raise StageError(f"{path}: {part}: empty; every split needs at least one task (tasks.families)")
        try:
            out[part] = [task_by_name(n) for n in names]
        except KeyError as exc:
            raise StageError(f"{path}: {part}: unknown task {exc}; re-run the tasks stage") from None
    out["heldout"] = out["validation"] + out["test"]
    return out
