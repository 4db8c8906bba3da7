"""A property-based fuzzer over what a user hands the pipeline: every params leaf of every stage (wrong types,
boundary and out-of-range numbers, huge and non-finite values, strings with unicode and shell metacharacters,
nulls, duplicate, unknown and missing keys, a missing section) and the input files the stages and verbs read
(empty, truncated, garbage bytes, valid JSON of the wrong shape, a missing key, a wrong value).

Every example runs the real entry point in-process (the stage script as `python -m stages.<name>` runs it, the CLI's
`main`) and must end in either a one-line error with exit code 2 and no output written, or a run whose outputs are
correct; never a traceback (an "unexpected" line, exit 1), a deleted output or a hang. Stages whose body is cheap
run it for real (tasks, select; test and behaviour up to their first checkpoint load); for the others the params
examples stop at the body: what they check is the door every param passes (validation, inputs, threads, the MLflow
run), and an accepted value must reach the stage as written.

Budget: AGENTRL_FUZZ_EXAMPLES examples per target (default 15, as in `make test`); set it higher to search longer.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import runpy
import shutil
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest
import torch
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

REPO = Path(__file__).resolve().parents[1]
BUDGET = int(os.environ.get("AGENTRL_FUZZ_EXAMPLES", "15"))
FUZZ = settings(max_examples=BUDGET, deadline=None, database=None, derandomize=BUDGET <= 15,
                suppress_health_check=list(HealthCheck))
STATS: dict[str, Counter] = {}
pytestmark = pytest.mark.slow   # hundreds of stage entries (each opens or refuses an MLflow run)

STAGES = sorted(p.stem for p in (REPO / "stages").glob("*.py") if p.stem != "__init__")   # __init__ pins numerics
REAL_BODY = {"tasks", "select"}   # cheap enough to run for every accepted example
INSTANCE = {"ablate": "ablate@default-0", "length_pair": None}   # the instance $DVC_STAGE names
WATCHED = ("data", "reports")


# ---------------------------------------------------------------- the workspace

@pytest.fixture(scope="module")
def ws(tmp_path_factory, store_template):
    """A project copy with small real inputs: tasks from the tasks stage, a random-init policy as every starting
    policy, the committed reports; its own store and log directory."""
    root = tmp_path_factory.mktemp("fuzz") / "ws"
    root.mkdir()
    for name in ("agentrl", "stages"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(REPO / "reports", root / "reports")
    for name in ("dvc.yaml", "params.yaml"):
        shutil.copy(REPO / name, root / name)
    shutil.copy(store_template, root.parent / "store.db")
    env = {"MLFLOW_TRACKING_URI": f"sqlite:///{root.parent}/store.db", "DVC_ROOT": str(root),
           "AGENTRL_LOG_DIR": str(root.parent / "logs")}
    with inside(root, env):
        assert entry("tasks")[0] == 0
        from agentrl.core.artifacts import policy_path
        from agentrl.env.gym.tokenizer import load_tokenizer
        from agentrl.model.checkpoints import save_policy
        from agentrl.model.policy import ModelConfig, TinyAgent
        tok = load_tokenizer()
        model = TinyAgent(ModelConfig(len(tok)), generator=torch.Generator().manual_seed(0))
        for name in ("base", "sft", "length_start"):
            save_policy(policy_path(name), model, tok.hash)
    for rel in ("data/preflight/gate.json", "data/ablate/.keep", "data/train/checkpoints/.keep"):
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text('{"gate": "passed"}\n')
    shutil.copy(REPO / "dvc.lock", root / "dvc.lock")   # a DVC project, so audit gets past `dvc status`
    subprocess.run([str(Path(sys.executable).parent / "dvc"), "init", "--no-scm", "-q"], cwd=root, check=True)
    for fixture, dest in (("reports_numbers.json", "snapshot.json"), ("reports_moved.json", "moved.json")):
        shutil.copy(REPO / "tests" / "fixtures" / fixture, root / dest)
    pristine = root.parent / "pristine"
    shutil.copytree(root, pristine)
    return root, env, pristine


@contextlib.contextmanager
def inside(root: Path, env: dict):
    before_env, cwd, threads, argv = dict(os.environ), os.getcwd(), torch.get_num_threads(), sys.argv
    os.environ.update(env)
    os.chdir(root)
    try:
        yield
    finally:
        os.chdir(cwd)
        os.environ.clear()
        os.environ.update(before_env)
        torch.set_num_threads(threads)
        sys.argv = argv


def files(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for w in WATCHED for p in sorted((root / w).rglob("*"))
            if p.is_file()}


def restore(root: Path, pristine: Path) -> None:
    for w in WATCHED + ("params.yaml", "dvc.lock", "snapshot.json", "moved.json"):
        target = root / w
        shutil.rmtree(target) if target.is_dir() else target.unlink(missing_ok=True)
        (shutil.copytree if (pristine / w).is_dir() else shutil.copy)(pristine / w, target)


def entry(stage: str, door: bool = False) -> tuple[int, str, list]:
    """Run stages/<stage>.py as its __main__ does (door: with a body that only records what it was given)."""
    import agentrl.pipeline.stage as stage_mod
    reached, real = [], stage_mod.run_stage

    def door_run_stage(name, sections, inputs, body, **kw):
        return real(name, sections, inputs, lambda ctx: reached.append(ctx.params), **kw)
    sys.argv = [f"stages/{stage}.py"]
    os.environ.pop("DVC_STAGE", None)
    if INSTANCE.get(stage):
        os.environ["DVC_STAGE"] = INSTANCE[stage]
    elif stage in INSTANCE:
        sys.argv += ["--seed", "1"]
    err = io.StringIO()
    stage_mod.run_stage = door_run_stage if door else real
    try:
        with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
            runpy.run_path(f"stages/{stage}.py", run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code
    finally:
        stage_mod.run_stage = real
    return code, err.getvalue(), reached


def verb(argv: list[str]) -> tuple[int, str]:
    from agentrl.cli import main
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = main(argv)
    return code, err.getvalue()


def judge(target: str, code: int, err: str, before: dict, after: dict, allowed=(0, 2)) -> None:
    """The property: one line and exit 2 with nothing written, or a finished run; never a traceback."""
    STATS.setdefault(target, Counter())[f"exit {code}"] += 1
    assert "Traceback" not in err and "unexpected" not in err, err[-2000:]
    assert code in allowed, (code, err[-2000:])
    if code == 2:
        lines = [line for line in err.splitlines() if not line.startswith("warning:")]
        assert len(lines) == 1 and lines[0].startswith("error:") and len(lines[0]) < 600, err[-2000:]
        assert after == before, sorted(k for k in set(before) | set(after) if before.get(k) != after.get(k))


# ---------------------------------------------------------------- what a user can write

SHELLISH = st.sampled_from(["x;touch pwned;true", "$(id)", "`id`", "a b", "'", '"', "\\", "a|b", "../../etc",
                            "", " ", "\u202e", "é", "名前", "\x00", "-rf", "--seed=1", "NaN", "1e-3", "1e999"])
NUMBERS = st.sampled_from([0, -1, 1, 2, 2**63, 2**64 - 1, 2**64, -2**64, 10**40, 0.0, -0.0, 1e-308, 1e308,
                           float("inf"), float("-inf"), float("nan"), 0.5, 1.0, 1.5, 100])
TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
VALUES = st.one_of(st.none(), st.booleans(), NUMBERS, st.integers(), st.floats(), SHELLISH, TEXT,
                   st.lists(st.one_of(NUMBERS, SHELLISH), max_size=3),
                   st.dictionaries(st.one_of(SHELLISH, TEXT), st.one_of(NUMBERS, st.none()),
                                   max_size=2))


def leaves(stage: str) -> list[tuple[str, str]]:
    """(section, key) of every params leaf the stage reads."""
    module = __import__(f"stages.{stage}", fromlist=["SECTIONS"])
    numeric = "numeric=False" not in (REPO / "stages" / f"{stage}.py").read_text()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    sections = (["run"] if numeric else []) + [s for s in module.SECTIONS if s != "run" or not numeric]
    return [(s, k) for s in dict.fromkeys(sections) for k in params[s]]


@st.composite
def params_edit(draw, stage: str):
    """(params.yaml text, (section, key, value) when one leaf was set to a value)."""
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    section, key = draw(st.sampled_from(leaves(stage)))
    how = draw(st.sampled_from(["value", "value", "value", "drop", "unknown", "duplicate", "no-section", "arm"]))
    if how == "value":
        value = draw(VALUES)
        raw[section][key] = value
        return yaml.safe_dump(raw, allow_unicode=True), (section, key, value)
    if how == "drop":
        raw[section].pop(key)
    elif how == "unknown":
        raw[section][draw(SHELLISH) or "x"] = draw(VALUES)
    elif how == "no-section":
        raw.pop(section)
    elif how == "arm":
        raw["ablate"]["arms"] = {draw(st.one_of(SHELLISH, TEXT)): draw(VALUES)}
    text = "\n" + yaml.safe_dump(raw, allow_unicode=True)
    if how == "duplicate":
        text = text.replace(f"\n{section}:\n", f"\n{section}:\n  {key}: 1\n", 1)
    return text, None


def honoured(reached: list, change) -> None:
    """An accepted value reaches the stage as written (a YAML '1e-3' string read as the float it spells)."""
    if change is None or not reached:
        return
    section, key, value = change
    if section not in reached[0] or not hasattr(reached[0][section], key):
        return
    got = getattr(reached[0][section], key)
    assert got == value or (isinstance(value, str) and got == float(value)) or \
        (isinstance(value, list) and list(got) == value), (section, key, value, got)


@pytest.mark.parametrize("stage", STAGES)
def test_every_params_leaf(ws, stage):
    root, env, pristine = ws
    t0 = time.time()

    @FUZZ
    @given(edit=params_edit(stage))
    def run(edit):
        text, change = edit
        restore(root, pristine)
        (root / "params.yaml").write_text(text)
        before = files(root)
        with inside(root, env):
            code, err, reached = entry(stage, door=stage not in REAL_BODY)
        judge(f"stage {stage} params", code, err, before, files(root))
        if code == 0:
            honoured(reached, change)
    run()
    STATS[f"stage {stage} params"]["seconds"] = round(time.time() - t0)


# ---------------------------------------------------------------- what a file on disk can hold

JSON = st.recursive(st.one_of(st.none(), st.booleans(), NUMBERS, SHELLISH),
                    lambda inner: st.one_of(st.lists(inner, max_size=3),
                                            st.dictionaries(TEXT, inner, max_size=3)), max_leaves=8)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for k, v in list(node.items())[:20]:
            yield from _paths(v, prefix + (k,))
    elif isinstance(node, list):
        for i, v in enumerate(node[:3]):
            yield from _paths(v, prefix + (i,))


@st.composite
def damaged(draw, original: bytes):
    how = draw(st.sampled_from(["empty", "truncated", "garbage", "shape", "drop", "retype"]))
    if how == "empty":
        return b""
    if how == "truncated":
        return original[:draw(st.integers(0, max(0, len(original) - 1)))]
    if how == "garbage":
        return draw(st.binary(min_size=1, max_size=200))
    is_json = original.lstrip().startswith((b"{", b"["))
    if how == "shape" or not (is_json or original.startswith(b"schema:")):   # dvc.lock: YAML
        return json.dumps(draw(JSON)).encode()
    doc = json.loads(original) if is_json else yaml.safe_load(original)
    path = draw(st.sampled_from([p for p in _paths(doc) if p]))
    parent = doc
    for part in path[:-1]:
        parent = parent[part]
    if how == "drop":
        parent.pop(path[-1]) if isinstance(parent, dict) else parent.pop(path[-1])
    else:
        parent[path[-1]] = draw(JSON)
    return json.dumps(doc).encode() if is_json else yaml.safe_dump(doc).encode()


FILES = [("select", "reports/train.json"), ("select", "reports/train_dashboard.json"),
         ("test", "reports/selection.json"), ("behaviour", "reports/selection.json"),
         ("test", "data/tasks/split.json"), ("test", "data/tasks/tokenizer.json"),
         ("test", "data/models/base.pt"), ("sft", "data/models/base.pt")]


@pytest.mark.parametrize("stage,rel", FILES, ids=[f"{s}:{r}" for s, r in FILES])
def test_every_input_file_of_a_stage(ws, stage, rel):
    root, env, pristine = ws
    original = (pristine / rel).read_bytes()
    t0 = time.time()

    @FUZZ
    @given(content=damaged(original))
    def run(content):
        restore(root, pristine)
        (root / rel).write_bytes(content)
        before = files(root)
        with inside(root, env):
            code, err, _ = entry(stage)
        judge(f"stage {stage} {rel}", code, err, before, files(root), allowed=(0, 2) if stage == "select" else (2,))
    run()
    STATS[f"stage {stage} {rel}"]["seconds"] = round(time.time() - t0)


VERBS = [("audit", "reports/test.json", ["audit", "reports/test.json:chosen.pass_at_1"]),
         ("audit", "reports/provenance/test.json", ["audit", "reports/test.json:chosen.pass_at_1"]),
         ("audit", "dvc.lock", ["audit", "reports/test.json:chosen.pass_at_1"]),
         ("replay", "data/models/base.pt", ["replay", "data/models/base.pt"]),
         ("compare-reports", "snapshot.json", ["compare-reports", "--snapshot", "snapshot.json"]),
         ("compare-reports", "moved.json", ["compare-reports", "--moved", "moved.json"]),
         ("check", "params.yaml", ["check", "--model", "nonexistent.pt"])]


@pytest.mark.parametrize("name,rel,argv", VERBS, ids=[f"{v}:{r}" for v, r, _ in VERBS])
def test_every_input_file_of_a_verb(ws, name, rel, argv):
    root, env, pristine = ws
    original = (pristine / rel).read_bytes()
    t0 = time.time()
    strategy = params_edit("preflight").map(lambda e: e[0].encode()) if rel == "params.yaml" else damaged(original)

    @FUZZ
    @given(content=strategy)
    def run(content):
        restore(root, pristine)
        (root / rel).write_bytes(content)
        before = files(root)
        with inside(root, env):
            code, err = verb(argv)
        # audit: 1 is "stale"; compare-reports: 1 is "numbers differ" (both answers, not failures)
        judge(f"verb {name} {rel}", code, err, before, files(root),
              allowed=(0, 1, 2) if name in ("audit", "compare-reports") else (2,))
    run()
    STATS[f"verb {name} {rel}"]["seconds"] = round(time.time() - t0)


def test_zz_report_the_counts():
    """Examples per target and their outcomes (pytest -s prints them; docs/testing.md quotes a run)."""
    for target, counts in sorted(STATS.items()):
        seconds = counts.pop("seconds", 0)
        print(f"fuzz {target}: {sum(counts.values())} examples in {seconds} s ({dict(sorted(counts.items()))})")
