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
import re
import runpy
import shutil
import signal
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


@pytest.fixture(scope="module", autouse=True)
def report_the_counts():
    """Examples per target and their outcomes, printed once the module's targets have run, whatever their order
    (pytest -s shows them; docs/testing.md quotes a run)."""
    yield
    for target, counts in sorted(STATS.items()):
        seconds = counts.pop("seconds", 0)
        print(f"fuzz {target}: {sum(counts.values())} examples in {seconds} s ({dict(sorted(counts.items()))})")


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
    return {p.relative_to(root).as_posix(): p.read_bytes() if p.stat().st_size < 1 << 30 else p.stat().st_size
            for w in WATCHED for p in sorted((root / w).rglob("*")) if p.is_file() and not p.is_symlink()}


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


# ---------------------------------------------------------------- the params file as bytes

CONTROLS = ["\x00", "\x01", "\x07", "\x08", "\t", "\r", "\x0b", "\x0c", "\x1b", "\x7f", "\x85", "\u2028", "\u2029",
            "\n", "\r\n", "\ufeff", "\u202e"]
NUMBER_AT = re.compile(rb"(?<=: )-?[0-9][0-9.e+-]*(?=[ ,}\n])")


@st.composite
def params_bytes(draw, original: bytes):
    """params.yaml damaged as bytes, not as YAML values: inserted, replaced or deleted bytes, control characters,
    a number of many digits, deep nesting, another encoding or line ending, a cut, an oversized file."""
    how = draw(st.sampled_from(["insert", "replace", "delete", "control", "digits", "nesting", "encoding", "lines",
                                "truncate", "oversize"]))
    at = draw(st.integers(0, len(original)))
    if how == "insert":
        return original[:at] + draw(st.binary(min_size=1, max_size=8)) + original[at:]
    if how == "replace":
        return original[:at] + draw(st.binary(min_size=1, max_size=16)) + original[at + draw(st.integers(1, 16)):]
    if how == "delete":
        return original[:at] + original[at + draw(st.integers(1, 64)):]
    if how == "control":
        return original[:at] + draw(st.sampled_from(CONTROLS)).encode() + original[at:]
    if how == "digits":
        spans = [m.span() for m in NUMBER_AT.finditer(original)]
        start, end = draw(st.sampled_from(spans))
        digits = b"9" * draw(st.sampled_from([19, 20, 21, 40, 41, 4300, 4301, 5000]))
        return original[:start] + draw(st.sampled_from([b"", b"-"])) + digits + original[end:]
    if how == "nesting":
        depth = draw(st.sampled_from([63, 64, 65, 1000, 3000]))
        open_, close = draw(st.sampled_from([(b"[", b"]"), (b"{a: ", b"}")]))
        return original + b"deep: " + open_ * depth + b"1" + close * depth + b"\n"
    if how == "encoding":
        return original.decode().encode(draw(st.sampled_from(["utf-16", "utf-32", "latin-1", "cp1252"]))) + \
            draw(st.sampled_from([b"", b"# \xe9\n", b"# \xff\xfe\n"]))
    if how == "lines":
        return draw(st.sampled_from([b"\xef\xbb\xbf", b""])) + \
            original.replace(b"\n", draw(st.sampled_from([b"\r\n", b"\r", b"\n\n", b"\x0b"])))
    if how == "truncate":
        return original[:at]
    return original + b"#" + b"x" * draw(st.sampled_from([(1 << 20) - len(original) - 2, 1 << 20])) + b"\n"


BYTES_STAGES = ["train", "ablate", "tasks"]


@pytest.mark.parametrize("stage", BYTES_STAGES)
def test_the_params_file_as_bytes(ws, stage):
    """What stages/__init__.py reads before torch (agentrl.pipeline.early) and then the stage's own door: one
    line and exit 2, or a run given exactly what the file says; never a traceback, never a byte written on a
    refusal."""
    from agentrl.core.boundary import guard
    from agentrl.pipeline import early
    root, env, pristine = ws
    original = (pristine / "params.yaml").read_bytes()
    t0 = time.time()

    @FUZZ
    @given(content=params_bytes(original))
    def run(content):
        restore(root, pristine)
        (root / "params.yaml").write_bytes(content)
        before = files(root)
        with inside(root, env):
            instance = INSTANCE.get(stage)
            err = io.StringIO()
            with contextlib.redirect_stderr(err):
                code = guard(stage, early._check, stage, instance.split("@")[1] if instance else None, "params.yaml")
            if code == 0:
                code, rest, _ = entry(stage, door=stage not in REAL_BODY)
                err.write(rest)
        judge(f"stage {stage} params bytes", code, err.getvalue(), before, files(root))
    run()
    STATS[f"stage {stage} params bytes"]["seconds"] = round(time.time() - t0)


# ---------------------------------------------------------------- what kind of file an input is

def _make_kind(path: Path, kind: str) -> None:
    """Replace `path` with a file system object of `kind`."""
    path.unlink(missing_ok=True)
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "directory":
        path.mkdir()
    elif kind == "device":
        path.symlink_to("/dev/zero")
    elif kind == "dangling":
        path.symlink_to(path.parent / "nowhere")
    elif kind == "loop":
        path.symlink_to(path)
    elif kind == "sparse":   # larger than any input bound, without the disk space
        with open(path, "wb") as f:
            f.truncate((4 << 30) + 1)


def _hung(signum, frame):
    raise TimeoutError("no answer within 120 s")


# what two verbs' argv name on purpose and stop on first: --moved's base snapshot (tests/ is not in the workspace),
# check's missing model
STOPPED_FIRST_ON = ("missing input tests/fixtures", "checkpoint nonexistent.pt")
KINDS = ["fifo", "directory", "device", "dangling", "loop", "sparse"]
KIND_TARGETS = [("stage", s, r, None) for s, r in FILES] + [("verb", v, r, a) for v, r, a in VERBS]


@pytest.mark.parametrize("who,name,rel,argv", KIND_TARGETS, ids=[f"{n}:{r}" for _, n, r, _ in KIND_TARGETS])
def test_every_input_as_another_kind_of_file(ws, who, name, rel, argv):
    """Every kind in KINDS for each input of FILES and VERBS: one line, exit 2 (audit and compare-reports may also
    answer 1), within a bound (a FIFO's open or /dev/zero's read would wait forever), nothing written."""
    root, env, pristine = ws
    t0 = time.time()
    for kind in KINDS:
        restore(root, pristine)
        _make_kind(root / rel, kind)
        before = files(root)
        signal.signal(signal.SIGALRM, _hung)
        signal.alarm(120)   # a hang fails the test instead of the whole run
        try:
            with inside(root, env):
                code, err = verb(argv) if who == "verb" else entry(name)[:2]
        finally:
            signal.alarm(0)
        allowed = (1, 2) if name in ("audit", "compare-reports") else (2,)
        judge(f"{who} {name} {rel} as a file kind", code, err, before, files(root), allowed=allowed)
        if code == 2 and not any(other in err for other in STOPPED_FIRST_ON):
            assert rel in err or Path(rel).name in err, (kind, err)   # the line names the file
    (root / rel).unlink(missing_ok=True) if not (root / rel).is_dir() else (root / rel).rmdir()
    STATS[f"{who} {name} {rel} as a file kind"]["seconds"] = round(time.time() - t0)


# ---------------------------------------------------------------- names with control characters

NAME_TEXT = st.builds(lambda a, c, b: a + c + b, st.sampled_from(["", "ok", "a_1", "0"]), st.sampled_from(CONTROLS),
                      st.sampled_from(["", "x", "0", "_"]))


def _odd_names(root: Path) -> list[str]:
    return [str(p) for p in root.rglob("*") if any(ord(ch) < 32 or ch in "\x7f\x85\u2028\u2029" for ch in p.name)]


@pytest.mark.parametrize("where", ["arm", "instance", "lab", "seed"])
def test_names_with_control_characters(ws, where):
    """An arm name, a stage instance ($DVC_STAGE), a lab name (--lab) or a seed argument holding a control
    character: one line and exit 2 before anything runs, and no path with that character made."""
    root, env, pristine = ws
    t0 = time.time()

    @FUZZ
    @given(name=NAME_TEXT if where == "arm" else NAME_TEXT.filter(lambda n: "\x00" not in n))   # argv, environ: no NUL
    def run(name):
        restore(root, pristine)
        stage, extra_env, argv = "ablate", {}, None
        if where == "arm":
            raw = yaml.safe_load((pristine / "params.yaml").read_text())
            raw["ablate"]["arms"] = {name: {}}
            (root / "params.yaml").write_text(yaml.safe_dump(raw, allow_unicode=True))
            extra_env = {"DVC_STAGE": "ablate@default-0"}   # every arm's name is checked, whichever instance runs
        elif where == "instance":
            extra_env = {"DVC_STAGE": f"ablate@{name}-0"}
        elif where == "lab":
            stage, argv = "lab", ["--lab", name]
        else:
            stage, argv = "length_pair", ["--seed", name]
        before = files(root)
        with inside(root, {**env, **extra_env}):
            code, err = _entry_with(stage, argv, extra_env)
        judge(f"{where} name", code, err, before, files(root), allowed=(2,))
        assert not _odd_names(root), _odd_names(root)
    run()
    STATS[f"{where} name"]["seconds"] = round(time.time() - t0)


def _entry_with(stage: str, argv: list | None, extra_env: dict) -> tuple[int, str]:
    """The early check then the stage script, as `python -m stages.<stage> [argv]` runs them in-process."""
    from agentrl.core.boundary import guard
    from agentrl.pipeline import early
    sys.argv = [f"stages/{stage}.py"] + list(argv or [])
    instance = extra_env.get("DVC_STAGE", "").partition("@")[2] or None
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        code = guard(stage, early._check, stage, instance, "params.yaml")
        if code == 0:
            try:
                runpy.run_path(f"stages/{stage}.py", run_name="__main__")
            except SystemExit as exc:
                code = exc.code
    return code, err.getvalue()


# ---------------------------------------------------------------- signals at any moment

ENDING = {signal.SIGINT: 130, signal.SIGTERM: 143, signal.SIGHUP: 129, signal.SIGQUIT: 131}


def test_an_ending_signal_at_any_moment(ws):
    """`python -m stages.select` (a real stage process: the early check, torch's import, the MLflow run, the body,
    the outputs) sent SIGINT, SIGTERM, SIGHUP or SIGQUIT after a random delay: it finishes (0) or ends with the
    signal's code and one line; its outputs are the old bytes or the new ones, never a mix or a partial file, and
    no MLflow run is left RUNNING. (A signal in the interpreter's first milliseconds, before any project code runs,
    meets the system's default: killed by the signal, nothing written.)"""
    import sqlite3
    root, env, pristine = ws
    restore(root, pristine)
    with inside(root, env):
        assert entry("select")[0] == 0
    finished = files(root)   # what a run to the end writes (select is deterministic but for its provenance record)

    def same(a: dict, b: dict, k: str) -> bool:
        if not k.startswith("reports/provenance/") or k not in a or k not in b:
            return a.get(k) == b.get(k)
        return k.endswith(".md") or json.loads(a[k]).keys() == json.loads(b[k]).keys()   # whole, if not equal
    t0 = time.time()

    @settings(max_examples=max(4, BUDGET // 2), deadline=None, database=None, derandomize=BUDGET <= 15,
              suppress_health_check=list(HealthCheck))
    @given(sig=st.sampled_from(sorted(ENDING)), delay=st.floats(0.0, 8.0))
    def run(sig, delay):
        restore(root, pristine)
        before = files(root)
        p = subprocess.Popen([sys.executable, "-m", "stages.select"], cwd=root, env={**os.environ, **env},
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        time.sleep(delay)
        p.send_signal(sig)
        _, err = p.communicate(timeout=120)
        STATS.setdefault("signal stage select", Counter())[f"exit {p.returncode}"] += 1
        assert "Traceback" not in err and "unexpected" not in err, err[-2000:]
        after = files(root)
        keys = set(before) | set(after) | set(finished)
        if p.returncode == 0:
            assert all(same(after, finished, k) for k in keys), sorted(k for k in keys if not same(after, finished, k))
        elif p.returncode == -sig:
            assert after == before and err == ""
        else:
            assert p.returncode == ENDING[sig], (p.returncode, err[-2000:])
            lines = [line for line in err.splitlines() if not line.startswith("warning:")]
            assert len(lines) == 1 and lines[0].startswith("error: select"), err[-2000:]
            mixed = [k for k in keys if not (same(after, before, k) or same(after, finished, k))]
            assert not mixed, mixed
        with contextlib.closing(sqlite3.connect(root.parent / "store.db")) as db:
            assert db.execute("select count(*) from runs where status = 'RUNNING'").fetchone()[0] == 0
    run()
    STATS["signal stage select"]["seconds"] = round(time.time() - t0)


# ---------------------------------------------------------------- a refused param under DVC itself

@pytest.fixture(scope="module")
def dvc_repo(tmp_path_factory):
    """A git + DVC repository: the real `tasks` stage and a stage reading its output, built and committed."""
    from test_restore import DVC, built_repo
    root = tmp_path_factory.mktemp("dvcfuzz") / "repo"
    return root, built_repo(root, root.parent / "mlflow.db"), DVC


FAMILIES = yaml.safe_load((REPO / "params.yaml").read_text())["tasks"]["families"]


def test_a_refused_param_under_dvc_repro_and_dvc_exp_run(dvc_repo):
    """Any value of a stage's param, set in params.yaml for `dvc repro` or with `dvc exp run -S`: the stage runs, or
    it refuses in one line and the workspace is as it was (every output the same bytes, `dvc status` naming only the
    param)."""
    from test_restore import _run, _tree
    root, env, dvc = dvc_repo
    before = _tree(root)
    t0 = time.time()

    @settings(max_examples=max(3, BUDGET // 3), deadline=None, database=None, derandomize=BUDGET <= 15,
              suppress_health_check=list(HealthCheck))
    @given(value=st.one_of(VALUES, st.lists(st.sampled_from(FAMILIES + ["nope", ""]), max_size=3)),
           how=st.sampled_from(["repro", "exp run"]))
    def run(value, how):
        _run(["git", "checkout", "-q", "--", "."], root, env)
        _run([dvc, "checkout", "-q", "--force"], root, env)
        assert _tree(root) == before
        if how == "repro":
            params = yaml.safe_load((root / "params.yaml").read_text())
            params["tasks"]["families"] = value
            (root / "params.yaml").write_text(yaml.safe_dump(params, allow_unicode=True))
            args = [dvc, "repro"]
        else:
            text = yaml.safe_dump(value, default_flow_style=True, allow_unicode=True).strip().removesuffix("...")
            args = [dvc, "exp", "run", "-S", f"tasks.families={text.strip()}"]
        out = _run(args, root, env, check=False)
        STATS.setdefault(f"dvc {how} param", Counter())[f"exit {out.returncode}"] += 1
        assert "Traceback" not in out.stderr and "unexpected" not in out.stderr, out.stderr[-2000:]
        if out.returncode == 0:
            return   # accepted: the stages ran
        ours = [line for line in out.stderr.splitlines() if line.startswith(("error:", "warning:"))]
        assert len(ours) <= 1 and all("tasks.families" in line for line in ours), out.stderr[-2000:]
        assert _tree(root) == before
        status = json.loads(_run([dvc, "status", "--json"], root, env).stdout)
        assert status in ({}, {"tasks": [{"changed deps": {"params.yaml": {"tasks": "modified"}}}]}), status
    run()
    _run(["git", "checkout", "-q", "--", "."], root, env)
    STATS.setdefault("dvc repro param", Counter())["seconds"] = round(time.time() - t0)


# ---------------------------------------------------------------- a signal at every phase of run creation

RUN_EXISTS = {"create", "created", "params"}   # held from the run's creation on: the signal acts once it exists


@pytest.mark.parametrize("phase", ["provenance", "probe", "store", "orphans", "create", "created", "params"])
def test_a_signal_at_every_phase_of_run_creation(tmp_path, store_template, phase):
    """SIGHUP, SIGTERM and SIGINT while a stage's run is being created, held at each phase in turn: the stage ends
    with the signal's code and its line, and the store holds no RUNNING run (none, or one KILLED saying why)."""
    import sqlite3

    from test_boundary import _make_probe_project
    from test_run_lifecycle import ENDING, STAGE, signal_at

    from agentrl.tracking.run import PHASES
    assert phase in PHASES
    root = _make_probe_project(tmp_path)
    (root / "stage.py").write_text(STAGE.replace("REPO", repr(str(REPO))))
    t0 = time.time()
    for sig, (code, reason) in ENDING.items():
        db = tmp_path / f"{signal.Signals(sig).name}.db"
        shutil.copy(store_template, db)
        got, lines = signal_at(root, f"sqlite:///{db}", phase, sig, hold=1.5)
        STATS.setdefault(f"signal at {phase}", Counter())[f"exit {got}"] += 1
        assert got == code and lines[-1] == f"error: probe: {reason}" and len(lines) == 2, (phase, sig, lines)
        with contextlib.closing(sqlite3.connect(db)) as con:
            rows = con.execute("select status from runs").fetchall()
            tags = dict(con.execute("select key, value from tags where key = 'killed_reason'").fetchall())
        assert rows == ([("KILLED",)] if phase in RUN_EXISTS else []), (phase, sig, rows)
        assert not rows or tags["killed_reason"] == f"probe: {reason}"
    STATS[f"signal at {phase}"]["seconds"] = round(time.time() - t0)


# ---------------------------------------------------------------- model directories, a file at a time

MODEL_FILES = ["config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"]
DAMAGE = ["missing", "empty", "cut", "garbage", "directory"]


@pytest.mark.parametrize("name", MODEL_FILES)
def test_model_directories_missing_or_damaging_each_file(ws, tmp_path_factory, name):
    """A lab whose model directory lacks one file, or holds it empty, cut short, as garbage or as a directory (each
    kind, each example): the lab stage's early check refuses it in one line naming the directory, exit 2, before
    torch or anything written (tests/test_model_dir.py: never reading the weights). A template cut where it still
    renders, or garbage that is one, may pass: then the check has nothing to say."""
    from test_model_dir import tiny_model_dir

    from agentrl.core.boundary import guard
    from agentrl.pipeline import early
    root, env, pristine = ws
    base = tmp_path_factory.mktemp("models")
    t0 = time.time()

    @settings(max_examples=max(3, BUDGET // 3), deadline=None, database=None, derandomize=BUDGET <= 15,
              suppress_health_check=list(HealthCheck))
    @given(cut=st.integers(0, 10_000), garbage=st.binary(max_size=64))
    def run(cut, garbage):
        for how in DAMAGE:
            restore(root, pristine)
            model = tiny_model_dir(base / f"m{len(list(base.iterdir()))}")
            data = (model / name).read_bytes()
            (model / name).unlink()
            if how == "directory":
                (model / name).mkdir()
            elif how != "missing":
                (model / name).write_bytes({"empty": b"", "cut": data[:cut % max(1, len(data))],
                                            "garbage": garbage}[how])
            raw = yaml.safe_load((pristine / "params.yaml").read_text())
            raw["lab"]["configs"]["x"] = {"model": str(model)}
            (root / "params.yaml").write_text(yaml.safe_dump(raw))
            before, err = files(root), io.StringIO()
            with inside(root, env), contextlib.redirect_stderr(err):
                code = guard("lab@x", early._check, "lab", "x", "params.yaml")
            if code == 0:   # a directory the format can drive after all: only a template cut or replaced may be one
                STATS.setdefault(f"model dir {name}", Counter())[f"{how}: passed"] += 1
                assert name == "chat_template.jinja" and how in ("cut", "garbage"), (name, how)
                continue
            STATS.setdefault(f"model dir {name}", Counter())[f"{how}: exit {code}"] += 1
            lines = [line for line in err.getvalue().splitlines() if not line.startswith("warning:")]
            assert code == 2 and len(lines) == 1 and lines[0].startswith("error: lab.configs.x.model: "), lines
            assert str(model) in lines[0] and "lab@x: unexpected" not in lines[0] and before == files(root)
    run()
    STATS[f"model dir {name}"]["seconds"] = round(time.time() - t0)
