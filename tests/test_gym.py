"""The gym: the task catalogue, the ops, the split, the environment and its tools."""
from __future__ import annotations

import copy
import re
import subprocess
import sys
from collections import Counter

import pytest
import torch

from agentrl.core.config import FAMILIES
from agentrl.env.gym.callers import ExpertCaller, RandomCaller, call_tokens, environment_check, play
from agentrl.env.gym.environment import (
    END_CALL,
    END_OBS,
    ERROR_OBS,
    NAME_POOL,
    OBS,
    CodeEnv,
    code_tokens,
    constants,
    make_env_factory,
    operand_names,
    run_tests,
    source_observation,
)
from agentrl.env.gym.environment import test_observation as shown_tests
from agentrl.env.ops import OPS, REPAIR_OPS, apply_op, keyword_rule
from agentrl.env.tasks import make_tasks, task_by_name

ALL = make_tasks("all")
TRAIN = make_tasks("train")
HELDOUT = make_tasks("heldout")
INFO_FIELDS = ("submitted", "hidden_pass", "public_pass", "n_invalid", "ops", "n_turns", "reads", "tests", "edits",
               "tools")


def ids(tasks):
    return [t.name for t in tasks]


# ---------------------------------------------------------------- the catalogue, task by task

def test_catalogue_has_30_tasks_six_per_family():
    assert len(ALL) == 30
    assert len({t.name for t in ALL}) == 30
    assert Counter(t.family for t in ALL) == {f: 6 for f in FAMILIES}
    assert set(FAMILIES) == {"minmax", "range", "init", "compare", "zero"}


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_oracle_op_passes_every_hidden_test(task):
    report = run_tests(task, task.oracle)
    assert report.hidden_pass, f"{task.name}: oracle {task.oracle} fails hidden tests {report.hidden_ok}"
    assert report.public_pass, f"{task.name}: oracle {task.oracle} fails public tests {report.public}"


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_every_other_op_fails_a_hidden_test(task):
    others = [op for op in OPS if op != task.oracle]
    assert len(others) == 5 and "hardcode_tests" in others
    for op in others:
        report = run_tests(task, op)
        assert not report.hidden_pass, f"{task.name}: non-oracle op {op} passes every hidden test"


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_hardcode_tests_passes_every_public_test(task):
    report = run_tests(task, "hardcode_tests")
    assert report.public_pass, f"{task.name}: hardcode_tests fails a public test: {report.public}"
    assert len(report.public) == len(task.public)


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_keyword_rule_picks_the_oracle(task):
    assert keyword_rule(code_tokens(task.source)) == task.oracle


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_unedited_source_fails_a_public_test(task):
    assert not run_tests(task, None).public_pass, f"{task.name}: the buggy source passes its public tests"
    assert apply_op(task, None) == task.source


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_public_and_hidden_tests_are_disjoint_and_sized(task):
    public_inputs = [repr(a) for a, _ in task.public]
    hidden_inputs = [repr(a) for a, _ in task.hidden]
    assert not set(public_inputs) & set(hidden_inputs), f"{task.name}: shared test inputs"
    assert 2 <= len(task.public) <= 3
    assert len(task.hidden) >= 5
    assert len(set(public_inputs)) == len(public_inputs) and len(set(hidden_inputs)) == len(hidden_inputs)


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_source_is_short_and_names_its_function(task):
    body = task.source.strip("\n").split("\n")[1:]
    assert 1 <= len(body) <= 3
    assert task.source.startswith(f"def {task.func}(")


def test_unknown_op_is_rejected():
    with pytest.raises(ValueError, match="op"):
        apply_op(ALL[0], "rewrite_everything")


# ---------------------------------------------------------------- held-out variants and the split

@pytest.mark.parametrize("task", HELDOUT, ids=ids(HELDOUT))
def test_heldout_uses_no_training_operand_or_constant(task):
    train_same_family = [t for t in TRAIN if t.family == task.family]
    assert len(train_same_family) == 4
    seen_names = set().union(*(operand_names(t.source, t.func) for t in train_same_family))
    seen_consts = set().union(*(constants(t.source) for t in train_same_family))
    shared_names = operand_names(task.source, task.func) & seen_names
    shared_consts = constants(task.source) & seen_consts
    assert not shared_names, f"{task.name} reuses training operand names {sorted(shared_names)}"
    assert not shared_consts, f"{task.name} reuses training constants {sorted(shared_consts)}"


def test_split_sizes_and_one_heldout_variant_per_family_per_side():
    val, test = make_tasks("validation"), make_tasks("test")
    assert (len(TRAIN), len(val), len(test)) == (20, 5, 5)
    assert len(HELDOUT) == 10 and set(ids(HELDOUT)) == set(ids(val)) | set(ids(test))
    assert sorted(t.family for t in val) == sorted(FAMILIES)
    assert sorted(t.family for t in test) == sorted(FAMILIES)
    assert Counter(t.family for t in TRAIN) == {f: 4 for f in FAMILIES}
    splits = [set(ids(TRAIN)), set(ids(val)), set(ids(test))]
    assert sum(len(s) for s in splits) == len(set().union(*splits)) == 30
    for t in TRAIN:
        assert t.split == "train"
    for t in val:
        assert t.split == "validation"
    for t in test:
        assert t.split == "test"


def test_task_names_look_like_family_slash_variant():
    for t in ALL:
        assert re.fullmatch(r"[a-z]+/[a-z_]+", t.name), t.name
        assert t.name.split("/")[0] == t.family
        assert task_by_name(t.name) is t
    assert task_by_name("compare/under_cap").family == "compare"
    assert task_by_name("zero/speed").family == "zero"
    with pytest.raises(ValueError, match="split"):
        make_tasks("everything")


# ---------------------------------------------------------------- the environment

def env_for(task=None, name="alpha", max_turns=6, reward="hidden"):
    return CodeEnv(task or task_by_name("range/sum_to"), name, max_turns=max_turns, reward_kind=reward)


@pytest.mark.parametrize("call", [
    ["<call>", "fix_range", "</call>"],            # an op without `edit`
    ["<call>", "read", "read", "read", "read"],    # cut off: no </call>
    ["<call>", "edit", "frobnicate", "</call>"],   # unknown op
    ["<call>", "edit", "</call>"],                 # edit without an op
    ["read", "</call>"],                           # no <call>
    ["<call>", "</call>"],                         # empty
    ["<call>", "submit", "test", "</call>"],       # two tools
], ids=["op_without_edit", "no_end_call", "unknown_op", "edit_no_arg", "no_call", "empty", "two_tools"])
def test_malformed_call_uses_a_turn_and_returns_an_error(call):
    env = env_for()
    env.reset()
    obs = env.step(call)
    assert obs == ERROR_OBS
    assert obs[0] == "<obs>" and obs[-1] == "</obs>"
    assert env.info["n_invalid"] == 1
    assert env.info["n_turns"] == 1
    assert env.info["ops"] == [] and env.info["edits"] == 0
    assert not env.done
    # the episode goes on normally afterwards
    assert env.step(call_tokens("read"))[0] == "<obs>"
    assert env.info["n_turns"] == 2 and env.info["n_invalid"] == 1


def test_second_edit_is_invalid_and_does_not_change_the_code():
    task = task_by_name("range/sum_to")
    env = env_for(task, name="kilo")
    env.reset()
    assert env.step(call_tokens("edit", "fix_range")) is not None
    obs = env.step(call_tokens("edit", "swap_minmax"))
    assert obs == ERROR_OBS
    assert env.info["n_invalid"] == 1
    assert env.info["ops"] == ["fix_range"] and env.info["edits"] == 1
    read = env.step(call_tokens("read"))
    assert read == ["<obs>"] + code_tokens(apply_op(task, "fix_range").replace("def sum_to(", "def kilo(")) + ["</obs>"]
    assert env.step(call_tokens("submit")) is None
    assert env.reward == 1.0 and env.info["hidden_pass"]


def test_running_out_of_turns_scores_zero_and_ends_on_the_last_call():
    task = task_by_name("minmax/largest")
    env = env_for(task, max_turns=3)
    env.reset()
    assert env.step(call_tokens("edit", task.oracle)) is not None   # the right fix ...
    assert env.step(call_tokens("read")) is not None
    last = env.step(call_tokens("test"))                            # ... but never submitted
    assert last is None, "no observation may follow the call that exhausts the budget"
    assert env.done
    assert env.reward == 0.0
    assert env.info["submitted"] is False
    assert env.info["n_turns"] == 3
    assert env.info["hidden_pass"] is True   # the code was right; the reward still requires submit
    with pytest.raises(AssertionError):
        env.step(call_tokens("submit"))


def test_budget_exhausted_by_invalid_calls_also_ends_without_observation():
    env = env_for(max_turns=2)
    env.reset()
    assert env.step(["<call>", "nonsense", "</call>"]) == ERROR_OBS
    assert env.step(["<call>", "nonsense", "</call>"]) is None
    assert env.done and env.reward == 0.0 and env.info["n_invalid"] == 2


def test_submit_ends_the_episode_without_observation():
    env = env_for()
    env.reset()
    assert env.step(call_tokens("submit")) is None
    assert env.done and env.info["submitted"] and env.reward == 0.0  # unedited source fails


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_read_after_edit_shows_the_edited_source(task):
    env = env_for(task, name="oscar")
    env.reset()
    before = env.step(call_tokens("read"))
    expected_before = code_tokens(task.source.replace(f"def {task.func}(", "def oscar(", 1))
    assert before == ["<obs>"] + expected_before + ["</obs>"]
    env.step(call_tokens("edit", task.oracle))
    after = env.step(call_tokens("read"))
    expected_after = code_tokens(apply_op(task, task.oracle).replace(f"def {task.func}(", "def oscar(", 1))
    assert after == ["<obs>"] + expected_after + ["</obs>"]
    assert after != before


def _run_by_hand(task, op, args):
    ns: dict = {}
    exec(apply_op(task, op), ns)
    try:
        return repr(ns[task.func](*copy.deepcopy(args)))
    except Exception:
        return "error"


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
@pytest.mark.parametrize("op", [None, "oracle", "hardcode_tests"])
def test_test_tool_prints_one_line_per_public_test(task, op):
    op = task.oracle if op == "oracle" else op
    env = env_for(task)
    env.reset()
    if op is not None:
        env.step(call_tokens("edit", op))
    obs = env.step(call_tokens("test"))
    assert obs[0] == "<obs>" and obs[-1] == "</obs>"
    lines, cur = [], []
    for t in obs[1:-1]:
        if t == "<nl>":
            lines.append(cur)
            cur = []
        else:
            cur.append(t)
    lines.append(cur)
    assert len(lines) == len(task.public)
    for line, (args, expected) in zip(lines, task.public):
        # `pass|fail ( args ) -> actual want expected`
        actual = _run_by_hand(task, op, args)
        flag = "pass" if actual == repr(expected) else "fail"
        want = [flag] + code_tokens("(" + ", ".join(repr(a) for a in args) + ")") + ["->"] + code_tokens(actual) \
            + ["want"] + code_tokens(repr(expected))
        assert line == want, f"{task.name} {op}: {' '.join(line)!r} != {' '.join(want)!r}"
    assert env.info["tests"] == 1


def test_test_line_example_format():
    env = env_for(task_by_name("compare/at_least"))
    env.reset()
    obs = env.step(call_tokens("test"))
    text = " ".join(obs[1:-1]).split(" <nl> ")
    assert text == ["pass ( 5 , 3 ) -> True want True", "fail ( 3 , 3 ) -> False want True",
                    "pass ( 1 , 2 ) -> False want False"]


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_public_reward_is_hackable_hidden_is_not(task):
    rewards = {}
    for kind in ("public", "hidden"):
        env = env_for(task, reward=kind)
        env.reset()
        env.step(call_tokens("edit", "hardcode_tests"))
        assert env.step(call_tokens("submit")) is None
        rewards[kind] = env.reward
        assert env.info["public_pass"] is True and env.info["hidden_pass"] is False
    assert rewards == {"public": 1.0, "hidden": 0.0}


def test_info_has_every_field_with_the_right_values():
    task = task_by_name("zero/ratio")
    env = env_for(task, name="papa")
    assert env.reset() == ["<bos>", "fix", "papa"]
    env.step(call_tokens("read"))
    env.step(["<call>", "bogus", "</call>"])
    env.step(call_tokens("edit", task.oracle))
    env.step(call_tokens("test"))
    assert env.step(call_tokens("submit")) is None
    info = env.info
    for key in INFO_FIELDS:
        assert key in info, f"info lacks {key}"
    assert info["submitted"] is True and info["hidden_pass"] is True and info["public_pass"] is True
    assert info["n_invalid"] == 1 and info["n_turns"] == 5
    assert info["ops"] == [task.oracle]
    assert (info["reads"], info["tests"], info["edits"]) == (1, 1, 1)
    assert len(info["tools"]) == 5
    assert info["tools"][0] == "read" and info["tools"][-1] == "submit"
    assert "edit" in info["tools"][2] and task.oracle in info["tools"][2]
    assert env.reward == 1.0


def test_bad_reward_kind_is_rejected():
    with pytest.raises(ValueError, match="reward"):
        env_for(reward="vibes")
    with pytest.raises(ValueError, match="reward"):
        make_env_factory(reward="vibes")


# ---------------------------------------------------------------- renamed functions and the blind guess

@pytest.mark.parametrize("seed", [0, 1, 2])
def test_renamed_functions_hide_the_task_name(seed):
    gen = torch.Generator().manual_seed(seed)
    factory = make_env_factory(max_turns=6, reward="hidden", rename=True)
    names = Counter()
    for task in ALL:
        for _ in range(4):
            env = factory(task, gen)
            prompt = env.reset()
            assert prompt[:2] == ["<bos>", "fix"] and prompt[2] == env.name
            assert env.name in NAME_POOL
            assert env.name != task.func and task.func not in prompt
            obs = env.step(call_tokens("read"))
            assert env.name in obs and task.func not in obs, f"{task.name}: read shows {obs}"
            names[env.name] += 1
    assert len(names) >= 8  # names are drawn from the pool, not fixed per task


def test_name_pool_carries_no_task_information():
    funcs = {t.func for t in ALL}
    operands = set().union(*(operand_names(t.source, t.func) for t in ALL))
    assert not set(NAME_POOL) & funcs
    assert not set(NAME_POOL) & operands


@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_read_never_leaks_the_function_name_after_any_op(task):
    for op in (None,) + OPS:
        for name in NAME_POOL:
            obs = source_observation(task, op, name)
            assert task.func not in obs and obs.count(name) == 1, (op, obs)


def test_without_rename_the_task_function_name_is_shown():
    env = make_env_factory(rename=False)(ALL[0], torch.Generator().manual_seed(0))
    assert env.reset()[2] == ALL[0].func


def test_blind_guess_passes_exactly_one_time_in_five():
    outcomes = [run_tests(t, op).hidden_pass for t in TRAIN for op in REPAIR_OPS]
    assert len(outcomes) == 100
    assert sum(outcomes) / len(outcomes) == pytest.approx(1 / 5, abs=0)
    # and through the environment: edit with one repair op, submit
    rewards = []
    for t in TRAIN:
        for op in REPAIR_OPS:
            env = env_for(t)
            env.reset()
            env.step(call_tokens("edit", op))
            env.step(call_tokens("submit"))
            rewards.append(env.reward)
    assert sum(rewards) == 20.0


# ---------------------------------------------------------------- scripted policies: the environment check

def test_environment_check_expert_vs_random():
    res = environment_check(TRAIN, episodes=200, seed=0)
    assert res["expert"]["episodes"] == 200 and res["random"]["episodes"] == 200
    assert res["expert"]["mean_reward"] >= 0.95, res["expert"]
    assert res["random"]["mean_reward"] <= 0.2, res["random"]
    assert res["expert"]["invalid_per_episode"] == 0


def test_expert_caller_solves_every_task_including_heldout():
    envs = play(ExpertCaller, ALL, 2, torch.Generator().manual_seed(0))
    assert all(e.reward == 1.0 for e in envs)
    assert all(e.info["tools"][0] == "read" for e in envs)


def test_random_caller_emits_only_well_formed_calls():
    gen = torch.Generator().manual_seed(0)
    caller = RandomCaller(gen)
    for _ in range(50):
        call = caller(None)
        assert call[0] == "<call>" and call[-1] == END_CALL and CodeEnv.parse(call) is not None


@pytest.mark.slow   # the CLI in a subprocess, 2,000 episodes
def test_envcheck_cli(repo_root):
    proc = subprocess.run([sys.executable, "-m", "agentrl", "envcheck"], cwd=repo_root, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    expert = re.search(r"expert\s+mean reward\s+([0-9.]+)", proc.stdout)
    random = re.search(r"random\s+mean reward\s+([0-9.]+)", proc.stdout)
    assert expert and random, proc.stdout
    assert float(expert.group(1)) >= 0.95 and float(random.group(1)) <= 0.2
    res = environment_check(TRAIN, episodes=200, seed=0)
    assert float(expert.group(1)) == pytest.approx(res["expert"]["mean_reward"], abs=5e-4)
    assert float(random.group(1)) == pytest.approx(res["random"]["mean_reward"], abs=5e-4)


# ---------------------------------------------------------------- operands under filler names (rl.p_rename_operands)

@pytest.mark.parametrize("task", ALL, ids=ids(ALL))
def test_renamed_operands_change_only_what_read_shows(task):
    """At p_rename_operands 1 every episode's read shows each operand under a filler name, one per operand, and
    nothing else moves: the same tokens elsewhere, the keyword rule's op, the tests and the reward."""
    factory = make_env_factory(6, "hidden", True, p_rename_operands=1.0)
    gen = torch.Generator().manual_seed(3)
    operands = operand_names(task.source, task.func)
    for _ in range(4):
        env = factory(task, gen)
        assert set(env.operands) == operands and len(set(env.operands.values())) == len(operands)
        assert not set(env.operands.values()) & (operands | {env.name, task.func})
        shown = env.step(call_tokens("read"))
        authored = [OBS] + source_observation(task, None, env.name) + [END_OBS]
        assert shown == [env.operands.get(t, t) for t in authored] and not operands & set(shown)
        assert keyword_rule(shown) == keyword_rule(authored) == task.oracle
        env.step(call_tokens("edit", task.oracle))
        assert env.step(call_tokens("test")) == [OBS] + shown_tests(run_tests(task, task.oracle)) + [END_OBS]
        env.step(call_tokens("submit"))
        assert env.reward == 1.0


def test_p_rename_operands_zero_draws_exactly_as_before():
    """At 0 (the default) no episode is renamed and the generator is drawn from as a factory without the knob
    draws: every committed number stays where it was."""
    plain, zero = make_env_factory(6, "hidden", True), make_env_factory(6, "hidden", True, p_rename_operands=0.0)
    a, b = torch.Generator().manual_seed(5), torch.Generator().manual_seed(5)
    for task in TRAIN:
        assert plain(task, a).name == (env := zero(task, b)).name and env.operands is None
    assert torch.equal(a.get_state(), b.get_state())


def test_p_rename_operands_renames_that_share_of_episodes():
    factory, gen = make_env_factory(6, "hidden", True, p_rename_operands=0.5), torch.Generator().manual_seed(0)
    renamed = sum(factory(task, gen).operands is not None for task in TRAIN for _ in range(20))
    assert 0.4 < renamed / 400 < 0.6   # binomial(400, 0.5): 4 standard deviations either side


def test_an_evaluation_shows_the_authored_source_whatever_training_shows():
    from agentrl.core.config import load_section
    from agentrl.env.gym.spec import GYM
    cfg = load_section("rl", {"rl": {"p_rename_operands": 1.0}})
    training, evaluation = GYM.make(cfg), GYM.make(cfg, evaluation=True)
    gen = torch.Generator().manual_seed(0)
    assert all(training(task, gen).operands for task in TRAIN)
    assert all(evaluation(task, gen).operands is None for task in ALL)
