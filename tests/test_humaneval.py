"""HumanEval repair tasks (agentrl.env.humaneval): sources cleaned, asserts read, mutants judged by the gym's own
grader (a planted mutant that breaks nothing and one whose repair fails are both rejected), splits by problem, the
pins equal to the Makefile's, and the task source wired into the labs."""
import gzip
import json
import re
from pathlib import Path

import pytest
import torch

from agentrl.core.artifacts import StageError
from agentrl.core.knobs import ConfigError
from agentrl.env import humaneval as he
from agentrl.env.tasks import TASK_SOURCES, Task, make_tasks, task_from_record, task_record

REPO = Path(__file__).resolve().parents[1]

PROMPT = '''from typing import List
import math


def total_up_to(n: int) -> int:
    """ Sum of 0..n.
    >>> total_up_to(3)
    6
    """
'''
SOLUTION = "    s = 0\n    for i in range(n + 1):\n        s += i\n    return s\n"
CHECK = '''

def check(candidate):
    assert candidate(3) == 6
    assert candidate(1) == 1
    assert candidate(4) == 10
    assert candidate(0) == 0
    assert abs(candidate(2) - 3) < 1e-6
    assert candidate(5) == 15, "five"
    for i in range(3):
        assert candidate(i) == i * (i + 1) // 2
'''


def raw(task_id="HumanEval/900", prompt=PROMPT, solution=SOLUTION, test=CHECK, entry="total_up_to"):
    return {"task_id": task_id, "prompt": prompt, "canonical_solution": solution, "test": test, "entry_point": entry}


def task_of(source, cases, public=2):
    return Task("t/x", "", "total_up_to", source, tuple(cases[:public]), tuple(cases[public:]), "", "")


def test_the_source_is_the_function_alone_imports_inside_no_docstring_or_annotations():
    src = he.clean_source(PROMPT, SOLUTION, "total_up_to")
    assert src.startswith("def total_up_to(n):\n    import math\n    s = 0\n")
    assert '"""' not in src and "List" not in src and "->" not in src
    helper = PROMPT + SOLUTION + "\n\ndef helper(x):\n    return x\n"
    assert he.clean_source(helper, "", "total_up_to") is None
    assert he.clean_source("def f(x):\n", "    return f'{x}'\n", "f") is None   # an f-string: no rename follows it


def test_asserts_of_the_usable_forms_are_read_and_the_rest_counted():
    cases, other = he.assert_cases(CHECK + "    assert candidate(7)\n    assert not candidate(8)\n")
    assert cases == [((3,), 6), ((1,), 1), ((4,), 10), ((0,), 0), ((5,), 15), ((7,), True), ((8,), False)]
    assert other == 2    # the abs(...) < 1e-6 one and the loop's candidate(i) (not literals)


def test_a_problem_keeps_only_asserts_the_canonical_solution_passes_under_the_graders_type_check():
    problem = he.problem_of(raw(test=CHECK + "    assert candidate(2) == 3.0\n"))
    assert problem.cases == (((3,), 6), ((1,), 1), ((4,), 10), ((0,), 0), ((5,), 15))
    assert problem.dropped == 3     # two unusable forms, and 3.0 (a float) against the int the solution returns


def test_a_planted_mutant_that_breaks_no_assert_is_rejected():
    cases = he.problem_of(raw()).cases
    harmless = "def total_up_to(n):\n    s = 0\n    for i in range(1, n + 1):\n        s += i\n    return s\n"
    assert he.judge(task_of(harmless, cases)) == ("breaks_nothing", None)
    # failing the public asserts only is no task either: an unedited submit would earn the hidden-test reward
    only_public = "def total_up_to(n):\n    if n in (3, 1):\n        return -1\n    return n * (n + 1) // 2\n"
    assert he.judge(task_of(only_public, cases)) == ("breaks_public_only", None)


def test_a_planted_mutant_whose_repair_fails_is_rejected_and_one_op_that_repairs_is_the_oracle():
    cases = he.problem_of(raw()).cases
    no_repair = "def total_up_to(n):\n    s = 0\n    for i in range(n + 1):\n        s -= i\n    return s\n"
    assert he.judge(task_of(no_repair, cases)) == ("no_repair", None)
    short = "def total_up_to(n):\n    s = 0\n    for i in range(n):\n        s += i\n    return s\n"
    assert he.judge(task_of(short, cases)) == (None, "fix_range")
    wrong_start = "def total_up_to(n):\n    s = 1\n    for i in range(n + 1):\n        s += i\n    return s\n"
    assert he.judge(task_of(wrong_start, cases)) == (None, "fix_init")


def test_mutants_undo_each_op_at_each_site():
    src = ("def f(xs, k):\n    s = 0\n    for i in range(len(xs) + 1):\n        s += min(i, k)\n"
           "    return s <= k and max(xs) >= 0\n")
    found = {(op, m) for op, _, m in he.mutants(src)}
    ops = sorted(op for op, _ in found)
    assert ops == ["fix_comparison", "fix_comparison", "fix_init", "fix_range", "swap_minmax", "swap_minmax"]
    assert ("fix_range", src.replace("range(len(xs) + 1)", "range(len(xs))")) in found
    assert ("fix_init", src.replace("s = 0", "s = 1")) in found
    assert ("fix_comparison", src.replace("s <= k", "s < k")) in found
    assert ("swap_minmax", src.replace("max(xs)", "min(xs)")) in found
    guarded = "def f(a, b):\n    if b == 0:\n        return 0\n    return a // b\n"
    assert he.mutants(guarded) == [("add_zero_guard", len("def f(a, b):\n"), "def f(a, b):\n    return a // b\n")]


def test_splits_are_by_problem_and_counts_add_up():
    problems = [raw(f"HumanEval/{900 + i}") for i in range(6)]
    tasks, counts = he.build(problems, public=2, min_hidden=2, fractions=(0.5, 0.2, 0.3))
    split_of_problem = {}
    for t in tasks:
        number = re.search(r"humaneval(\d+)_", t.name).group(1)
        assert split_of_problem.setdefault(number, t.split) == t.split
    assert counts["problems_with_tasks"] == 6 and set(split_of_problem.values()) == {"train", "validation", "test"}
    assert sum(counts["tasks_by_split"].values()) == len(tasks) == sum(counts["kept_by_op"].values())
    tried = sum(counts["mutants_tried"].values())
    assert tried == len(tasks) + sum(counts["mutant_rejects"].values())
    assert all(t.family == he.FAMILY_OF_OP[t.oracle] for t in tasks)
    assert "| all |" in he.counts_markdown(counts)


def test_a_task_record_keeps_tuples_sets_and_floats():
    task = Task("range/humaneval1_0", "range", "f", "def f(x):\n    return x\n",
                ((((1, 2),), (1, 2)),), ((({3},), {3}), ((0.5,), 0.5)), "fix_range", "test")
    back = task_from_record(json.loads(json.dumps(task_record(task))))
    assert back == task and type(back.public[0][1]) is tuple


def test_the_data_file_is_checked_against_its_pin(tmp_path):
    bad = tmp_path / "HumanEval.jsonl.gz"
    bad.write_bytes(gzip.compress(b'{"task_id": "HumanEval/0"}\n'))
    with pytest.raises(ValueError, match="is not the pinned"):
        he.load_problems(bad)
    with pytest.raises(FileNotFoundError, match="make install"):
        he.load_problems(tmp_path / "absent.jsonl.gz")


def test_pins_equal_the_makefiles():
    make = (REPO / "Makefile").read_text()
    assert f"HUMANEVAL_WHEEL := {he.WHEEL}" in make
    assert f"HUMANEVAL_WHEEL_SHA256 := {he.WHEEL_SHA256}" in make
    assert f"HUMANEVAL_DATA_SHA256 := {he.DATA_SHA256}" in make


def test_task_sources_are_one_list_and_a_lab_reads_its_own(tmp_path, monkeypatch):
    from agentrl.core.lab_config import TASK_SOURCES as LAB_SOURCES
    from agentrl.core.lab_config import LabRun
    from agentrl.labs.recipe import lab_tasks
    assert tuple(TASK_SOURCES) == LAB_SOURCES
    with pytest.raises(ConfigError, match="LabRun.eval_tasks: .*allowed: authored, humaneval"):
        LabRun(eval_tasks="mbpp")
    with pytest.raises(ValueError, match="unknown source 'mbpp'"):
        make_tasks("train", "mbpp")
    run = LabRun()
    assert lab_tasks(run, "train") == make_tasks("train") and lab_tasks(run, "heldout") == make_tasks("heldout")
    monkeypatch.chdir(tmp_path)
    with pytest.raises(StageError, match="dvc repro humaneval"):
        lab_tasks(LabRun(eval_tasks="humaneval", eval_split="test"), "heldout")
    tasks, _ = he.build([raw(f"HumanEval/{900 + i}") for i in range(6)])
    (tmp_path / "data" / "humaneval").mkdir(parents=True)
    (tmp_path / "data" / "humaneval" / "tasks.json").write_text(
        json.dumps({"tasks": [task_record(t) for t in tasks]}))
    held = lab_tasks(LabRun(eval_tasks="humaneval", eval_split="test"), "heldout")
    assert held and all(t.split == "test" for t in held) and held == [t for t in tasks if t.split == "test"]
    assert lab_tasks(LabRun(tasks="humaneval"), "train") == [t for t in tasks if t.split == "train"]


def test_operands_exclude_attributes_and_strings_and_a_rename_keeps_the_program():
    from agentrl.env.coding.repository import renamed_operands
    from agentrl.env.gym.environment import filler_operands, operand_names, run_tests
    src = ("def count_words(s, n):\n    out = []\n    for i in s.split():\n"
           "        if i not in ['i', 'n']:\n            out.append(i)\n    return len(out) == n\n")
    assert operand_names(src, "count_words") == {"s", "n", "out", "i"}
    task = Task("t/w", "", "count_words", src, (), ((("a i b", 2), True), (("i n", 0), True)), "", "")
    renamed = renamed_operands(src, filler_operands(task, "alpha", torch.Generator().manual_seed(0)))
    assert "'i', 'n'" in renamed and ".split()" in renamed and ".append(" in renamed
    assert run_tests(task, None).hidden_pass and \
        run_tests(Task("t/w2", "", "count_words", renamed, (), task.hidden, "", ""), None).hidden_pass


@pytest.mark.slow
def test_the_committed_build_is_what_the_pinned_file_gives():
    if not he.DATA.is_file():
        pytest.fail(f"{he.DATA} missing: `make install` fetches it")
    from agentrl.core.config import load_section, read_params_file
    cfg = load_section("humaneval", read_params_file(REPO / "params.yaml"), "params.yaml")
    tasks, counts = he.build(he.load_problems(REPO / he.DATA), cfg.public, cfg.min_hidden, cfg.max_source_tokens,
                             tuple(cfg.fractions))
    assert json.loads((REPO / "reports" / "humaneval.json").read_text()) == json.loads(json.dumps(counts))
    assert counts["tasks_by_split"]["test"] >= 20 and counts["problems_by_split"]["test"] >= 15
    from agentrl.env.gym.environment import run_tests
    for t in tasks:   # every kept task: broken as given, repaired by its oracle alone
        assert not run_tests(t, None).hidden_pass and run_tests(t, t.oracle).hidden_pass


def test_study_labs_reads_each_recipes_task_sources(tmp_path):
    from agentrl.studies.labs import task_sources
    assert task_sources("smollm2_he_transfer", REPO / "params.yaml") == ("authored", "humaneval", "test")
    assert task_sources("smollm2_tools_he", REPO / "params.yaml") == ("humaneval", "humaneval", "test")
    assert task_sources("smollm2", REPO / "params.yaml") == ("authored", "authored", "heldout")
    assert task_sources("no_such_recipe", REPO / "params.yaml") == ("authored", "authored", "heldout")
    assert task_sources("smollm2_he", tmp_path / "absent.yaml") == ("authored", "authored", "heldout")


def test_the_keyword_experts_reference_is_right_on_the_authored_tasks_and_can_be_wrong_here():
    assert all(he.keyword_repairs(t) for t in make_tasks("all"))
    cases = he.problem_of(raw()).cases
    # range( and a comparison: the keyword rule says fix_range, the bug is the accumulator's start
    src = "def total_up_to(n):\n    s = 1\n    for i in range(n + 1):\n        s += i if i >= 0 else 0\n    return s\n"
    task = task_of(src, cases)
    assert he.judge(task) == (None, "fix_init") and not he.keyword_repairs(task)
