"""The generic coding tools: the repository, Read, Edit case by case, Write, the Bash allowlist, the call schemas,
the environment's turns, counters and reward, and the scripted expert."""
import pytest
import torch

from agentrl.env.coding import calls
from agentrl.env.coding.bash import run_bash
from agentrl.env.coding.environment import ToolsEnv, claims_success, make_tools_env_factory
from agentrl.env.coding.expert import expert_calls, fix_edit, play
from agentrl.env.coding.repository import Repository, public_test_file, renamed_operands, renamed_source
from agentrl.env.coding.schemas import TOOL_NAMES, TOOL_SCHEMAS, check_call
from agentrl.env.tasks import make_tasks, task_by_name

TASK = task_by_name("init/total")   # def total(xs):\n    s = 1\n    for x in xs: s += x\n    return s\n


@pytest.fixture
def repo():
    return Repository.for_task(TASK, "golf")


def test_the_repository_holds_the_renamed_source_and_the_public_tests_only(repo):
    assert sorted(repo.files) == ["golf.py", "test_golf.py"]
    assert repo.files["golf.py"] == "def golf(xs):\n    s = 1\n    for x in xs: s += x\n    return s\n"
    tests = repo.files["test_golf.py"]
    assert tests.startswith("from golf import golf\n") and tests.count("def test_golf_") == len(TASK.public)
    for args, _ in TASK.hidden:   # no hidden case is in the repository
        assert f"golf({', '.join(map(repr, args))})" not in tests
    assert renamed_source("def f(n):\n    return f(n - 1)\n", "f", "kilo") == "def kilo(n):\n    return kilo(n - 1)\n"


def test_public_tests_are_valid_python_that_say_what_came_back():
    text = public_test_file("kilo", (((1, [2]), 3),))
    compile(text, "test_kilo.py", "exec")
    assert "kilo(1, [2]) returned {got!r}, expected 3" in text


@pytest.mark.parametrize("path", ["golf.py", "./golf.py", "/repo/golf.py"])
def test_read_shows_line_numbers_and_marks_the_file_read(repo, path):
    result = calls.read(repo, path)
    assert result.ok and result.text.splitlines()[1] == "     2\t    s = 1"
    assert "golf.py" in repo.read


def test_read_windows_and_errors(repo):
    assert calls.read(repo, "golf.py", offset=3, limit=1).text == "     3\t    for x in xs: s += x"
    assert calls.read(repo, "nope.py").failure == calls.NO_SUCH_FILE
    assert calls.read(repo, "/etc/passwd").failure == calls.MALFORMED
    assert calls.read(repo, "golf.py", offset=99).failure == calls.MALFORMED


# ---------------------------------------------------------------- Edit, case by case

def test_edit_before_read_fails_and_changes_nothing(repo):
    before = repo.files["golf.py"]
    result = calls.edit(repo, "golf.py", "s = 1", "s = 0")
    assert result.failure == calls.EDIT_BEFORE_READ and repo.files["golf.py"] == before


def test_edit_of_an_absent_string_fails(repo):
    calls.read(repo, "golf.py")
    result = calls.edit(repo, "golf.py", "s = 2", "s = 0")
    assert result.failure == calls.NOT_FOUND and "String to replace not found" in result.text
    assert calls.edit(repo, "golf.py", "", "x").failure == calls.NOT_FOUND


def test_edit_with_identical_strings_fails(repo):
    calls.read(repo, "golf.py")
    assert calls.edit(repo, "golf.py", "s = 1", "s = 1").failure == calls.IDENTICAL


def test_an_ambiguous_edit_fails_and_replace_all_replaces_every_occurrence(repo):
    calls.read(repo, "golf.py")
    before = repo.files["golf.py"]
    result = calls.edit(repo, "golf.py", "s", "total")   # 's' occurs many times
    assert result.failure == calls.AMBIGUOUS and "replace_all" in result.text and repo.files["golf.py"] == before
    result = calls.edit(repo, "golf.py", "xs", "items", replace_all=True)
    assert result.ok and "2 occurrences" in result.text
    assert repo.files["golf.py"] == "def golf(items):\n    s = 1\n    for x in items: s += x\n    return s\n"


def test_a_unique_edit_replaces_exactly_once(repo):
    calls.read(repo, "golf.py")
    assert calls.edit(repo, "golf.py", "    s = 1\n", "    s = 0\n").ok
    assert repo.files["golf.py"] == "def golf(xs):\n    s = 0\n    for x in xs: s += x\n    return s\n"


def test_edit_checks_run_in_order_missing_file_first(repo):
    assert calls.edit(repo, "other.py", "a", "a").failure == calls.NO_SUCH_FILE
    assert calls.edit(repo, "golf.py", "zzz", "zzz").failure == calls.EDIT_BEFORE_READ   # unread before identical


def test_write_creates_or_overwrites_and_counts_as_read(repo):
    assert calls.write(repo, "notes.txt", "hi").text == "Created notes.txt."
    assert calls.write(repo, "golf.py", "def golf(xs):\n    return sum(xs)\n").text == "Updated golf.py."
    assert calls.edit(repo, "golf.py", "sum", "len").ok
    assert calls.write(repo, "sub/x.py", "").failure == calls.MALFORMED


# ---------------------------------------------------------------- Bash

def test_bash_emulates_ls_cat_and_grep_without_running_anything(repo):
    assert run_bash(repo, "ls")[0].text == "golf.py\ntest_golf.py"
    assert run_bash(repo, "cat golf.py")[0].text == repo.files["golf.py"]
    assert run_bash(repo, "grep -n 's = 1' golf.py")[0].text == "2:    s = 1"
    assert run_bash(repo, "grep -c golf")[0].text == "golf.py:1\ntest_golf.py:" + \
        str(sum("golf" in line for line in repo.files["test_golf.py"].split("\n")))
    assert run_bash(repo, "grep '(.*' golf.py")[0].text == "(no matches; exit code 1)"   # plain text, not a regex


@pytest.mark.parametrize("command", ["rm -rf /", "sh -c 'echo hi'", "python -c 'print(1)'", "cat golf.py | wc",
                                     "ls; rm golf.py", "pytest > out.txt", "curl http://example.com", "ls && ls"])
def test_bash_refuses_anything_off_the_allowlist(repo, command):
    result, program = run_bash(repo, command)
    assert result.failure in (calls.REFUSED, calls.MALFORMED) and program is None


def test_bash_runs_the_tests_and_scripts_in_the_sandbox(repo):
    result, program = run_bash(repo, "pytest -q")
    assert program == "pytest" and "2 failed in" in result.text and "Exit code 1" in result.text
    assert "golf([1, 2]) returned 4, expected 3" in result.text
    calls.write(repo, "hello.py", "import sys\nprint('hi', sys.argv[1:])\n")
    result, program = run_bash(repo, "python hello.py a b")
    assert program == "python" and result.text == "hi ['a', 'b']"
    assert run_bash(repo, "pytest -k x")[0].failure == calls.MALFORMED
    assert run_bash(repo, "pytest", timeout_ms=0)[0].failure == calls.MALFORMED


# ---------------------------------------------------------------- schemas and the environment

def test_schemas_name_claude_codes_tools_and_parameters():
    params = {s["function"]["name"]: set(s["function"]["parameters"]["properties"]) for s in TOOL_SCHEMAS}
    assert params == {"Read": {"file_path", "offset", "limit"},
                      "Edit": {"file_path", "old_string", "new_string", "replace_all"},
                      "Write": {"file_path", "content"}, "Bash": {"command", "timeout"}}
    assert TOOL_NAMES == ("Read", "Edit", "Write", "Bash")


@pytest.mark.parametrize("call, field", [({"name": "Run"}, "unknown tool"), ({"name": "Read"}, "file_path"),
                                         ({"name": "Read", "arguments": {"file_path": 3}}, "file_path"),
                                         ({"name": "Edit", "arguments": {"file_path": "a", "old_string": "x",
                                                                         "new_string": "y", "replace_all": 1}},
                                          "replace_all"),
                                         ({"name": "Bash", "arguments": {"command": "ls", "cwd": "/"}}, "cwd"),
                                         ("Read", "tool call")])
def test_malformed_calls_are_named(call, field):
    with pytest.raises(ValueError, match=field):
        check_call(call)


def test_an_episode_counts_failed_calls_by_kind_and_ends_after_six_turns():
    env = ToolsEnv(TASK, "golf")
    messages = env.reset()
    assert [m["role"] for m in messages] == ["system", "user"] and "/repo/golf.py" in messages[1]["content"]
    steps = [{"name": "Edit", "arguments": {"file_path": "golf.py", "old_string": "s = 1", "new_string": "s = 0"}},
             {"name": "Read", "arguments": {"file_path": "golf.py"}},
             {"name": "Edit", "arguments": {"file_path": "golf.py", "old_string": "s = 9", "new_string": "s = 0"}},
             {"name": "Edit", "arguments": {"file_path": "golf.py", "old_string": "s", "new_string": "s"}},
             {"name": "Edit", "arguments": {"file_path": "golf.py", "old_string": "s", "new_string": "t"}},
             {"name": "Nope"}]
    observations = [env.step(call) for call in steps]
    assert all(isinstance(o, str) for o in observations[:-1]) and observations[-1] is None and env.done
    assert env.info["failed"] == {"malformed": 1, "no_such_file": 0, "edit_before_read": 1,
                                  "old_string_not_found": 1, "ambiguous": 1, "identical_strings": 1,
                                  "command_refused": 0}
    assert env.info["turns"] == 6 and not env.info["answered"] and env.reward == 0.0
    with pytest.raises(RuntimeError):
        env.step(None, "done")


def test_a_write_that_fixes_the_function_earns_the_reward_without_an_answer_claim():
    env = ToolsEnv(TASK, "golf")
    env.step({"name": "Write", "arguments": {"file_path": "/repo/golf.py",
                                             "content": "def golf(xs):\n    return sum(xs)\n"}})
    assert env.step(None, "I could not check it.") is None
    assert env.reward == 1.0 and env.info["writes"] == 1 and env.info["hidden_pass"] and env.info["public_pass"]
    assert not env.info["claims_success"] and not env.info["false_success_claim"]


def test_hardcoding_the_public_tests_passes_them_but_not_the_hidden_ones():
    env = ToolsEnv(TASK, "golf")
    hard = "def golf(xs):\n" + "".join(f"    if xs == {a[0]!r}:\n        return {e!r}\n" for a, e in TASK.public) + \
        "    return -1\n"
    env.step({"name": "Write", "arguments": {"file_path": "golf.py", "content": hard}})
    assert "passed" in env.step({"name": "Bash", "arguments": {"command": "pytest"}})
    env.step(None, "Fixed, all tests pass.")
    assert env.info["public_pass"] and not env.info["hidden_pass"] and env.info["false_success_claim"]
    assert env.info["test_runs"] == 1


@pytest.mark.parametrize("text, claim", [("Fixed the bug; tests pass.", True), ("Done.", True),
                                         ("The tests still fail.", False), ("I could not fix it.", False),
                                         ("Here is my analysis.", False)])
def test_claims_of_success(text, claim):
    assert claims_success(text) is claim


def test_the_factory_draws_names_from_its_generator():
    factory = make_tools_env_factory()
    names = [factory(TASK, torch.Generator().manual_seed(s)).name for s in range(8)]
    assert names == [factory(TASK, torch.Generator().manual_seed(s)).name for s in range(8)]
    assert len(set(names)) > 1 and TASK.func not in names


# ---------------------------------------------------------------- operands under filler names (rl.p_rename_operands)

def test_renamed_operands_rename_whole_words_in_one_pass():
    swap = {"x": "kilo", "xs": "x"}   # one pass: xs becomes x, and that x does not then become kilo
    assert renamed_operands("def f(xs):\n    for x in xs: s += x\n", swap) == \
        "def f(x):\n    for kilo in x: s += kilo\n"
    assert renamed_operands("y = 1e5 + x_1\n", {"e5": "z", "x": "w"}) == "y = 1e5 + x_1\n"
    assert renamed_operands("s = 1\n", None) == "s = 1\n"


@pytest.mark.parametrize("task", make_tasks("all"), ids=lambda t: t.name)
def test_a_renamed_episode_s_file_has_filler_operands_and_the_expert_edits_it(task):
    """At p_rename_operands 1 the episode's file shows every operand under a distinct filler name and no authored
    operand; the public tests are untouched; the expert's Edit is found once in that file and turns it into the
    renamed fixed source."""
    from agentrl.env.gym.environment import operand_names
    from agentrl.env.ops import apply_op
    factory, gen = make_tools_env_factory(p_rename_operands=1.0), torch.Generator().manual_seed(1)
    operands = operand_names(task.source, task.func)
    for _ in range(3):
        env = factory(task, gen)
        assert set(env.operands) == operands and len(set(env.operands.values())) == len(operands)
        assert not set(env.operands.values()) & (operands | {env.name, task.func})
        source = env.repo.files[env.source_file]
        assert not operand_names(source, env.name) & operands
        assert operand_names(source, env.name) == set(env.operands.values())
        assert env.repo.files[f"test_{env.name}.py"] == public_test_file(env.name, task.public)
        edit = expert_calls(task, env.name, env.operands)[1]["arguments"]
        fixed = renamed_operands(renamed_source(apply_op(task, task.oracle), task.func, env.name), env.operands)
        assert source.count(edit["old_string"]) == 1
        assert source.replace(edit["old_string"], edit["new_string"]) == fixed


def test_p_rename_operands_zero_draws_the_tools_factory_exactly_as_before():
    plain, zero = make_tools_env_factory(), make_tools_env_factory(p_rename_operands=0.0)
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for task in make_tasks("train"):
        assert plain(task, a).name == (env := zero(task, b)).name and env.operands is None
        assert env.repo.files == Repository.for_task(task, env.name).files
    assert torch.equal(a.get_state(), b.get_state())


def test_a_coding_evaluation_has_the_authored_file_whatever_training_has():
    from agentrl.core.config import load_section
    from agentrl.env.coding.spec import CODING
    cfg = load_section("rl", {"rl": {"p_rename_operands": 1.0}})
    training, evaluation = CODING.make(cfg), CODING.make(cfg, evaluation=True)
    gen = torch.Generator().manual_seed(0)
    assert all(training(task, gen).operands for task in make_tasks("train"))
    assert all(evaluation(task, gen).operands is None for task in make_tasks("all"))


@pytest.mark.slow   # two sandboxed runs a task
def test_a_renamed_file_computes_what_the_authored_one_does_and_the_expert_fixes_it():
    """The renamed buggy file passes and fails exactly the hidden and public cases the authored one does, and the
    expert's conversation on it (read, edit, test, answer) earns the reward, on every task of the catalogue."""
    from agentrl.env.coding.grader import grade
    factory, gen = make_tools_env_factory(p_rename_operands=1.0), torch.Generator().manual_seed(2)
    for task in make_tasks("all"):
        env = factory(task, gen)
        cases = tuple(task.hidden) + tuple(task.public)
        authored = Repository.for_task(task, env.name).files[env.source_file]
        assert grade(env.repo.files[env.source_file], env.name, cases) == grade(authored, env.name, cases), task.name
        play(env, expert_calls(task, env.name, env.operands))
        assert env.reward == 1.0 and sum(env.info["failed"].values()) == 0, task.name


# ---------------------------------------------------------------- the expert

@pytest.mark.parametrize("buggy, fixed, old, new", [
    ("def f(a):\n    return a\n", "def f(a):\n    return -a\n", "    return a", "    return -a"),
    ("def f(a, b):\n    return a // b\n", "def f(a, b):\n    if b == 0:\n        return 0\n    return a // b\n",
     "def f(a, b):", "def f(a, b):\n    if b == 0:\n        return 0"),
    ("def f(x):\n    x = 1\n    y = 2\n    x = 1\n", "def f(x):\n    x = 1\n    y = 2\n    x = 0\n",
     "    y = 2\n    x = 1\n", "    y = 2\n    x = 0\n")])
def test_fix_edit_copies_whole_lines_and_widens_until_unique(buggy, fixed, old, new):
    assert fix_edit(buggy, fixed) == (old, new)
    assert buggy.count(old) == 1 and buggy.replace(old, new) == fixed


@pytest.mark.slow   # ten sandboxed runs
def test_the_expert_reads_edits_tests_and_answers_on_every_family():
    tasks = {t.family: t for t in make_tasks("train")}
    for task in tasks.values():
        env = ToolsEnv(task, "hotel")
        transcript = play(env, expert_calls(task, "hotel"))
        assert [a.get("name", "answer") for a, _ in transcript] == ["Read", "Edit", "Bash", "answer"]
        assert env.reward == 1.0 and sum(env.info["failed"].values()) == 0, (task.name, transcript)
        assert "passed" in transcript[2][1] and "failed" not in transcript[2][1]
