"""params.yaml: the committed file validates; bad input gets one line naming the field and the
allowed values, before any compute and before any output is written (checked end to end on the tasks stage)."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.core.config import (
    REWARDS,
    SECTIONS,
    ParamsError,
    RLConfig,
    defaults,
    load_params,
    load_section,
    read_params_file,
)
from agentrl.core.variants import KL_KINDS, LOSS_MODES

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def committed() -> dict:
    return yaml.safe_load((REPO / "params.yaml").read_text())


def test_committed_params_validate(committed):
    raw = read_params_file(REPO / "params.yaml")
    assert raw == committed
    assert set(raw) <= set(SECTIONS)
    for name in raw:
        obj = load_section(name, raw)
        for key, value in (raw[name] or {}).items():
            assert getattr(obj, key) == value, f"{name}.{key}"
    loaded = load_params(list(SECTIONS), REPO / "params.yaml")
    assert set(loaded) == set(SECTIONS)


def test_rl_section_maps_onto_rlconfig(committed):
    rl = load_section("rl", committed)
    assert isinstance(rl, RLConfig)
    assert rl.group_size == committed["rl"]["group_size"]
    assert rl.seed == 0  # the seed comes from run.seed, not the rl section


def _write(tmp_path, committed, section, key, value, drop=False) -> None:
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in committed.items()}
    if drop:
        raw[section].pop(key)
    elif section not in raw:
        raw[section] = {key: value}
    else:
        raw[section][key] = value
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))


BAD = [
    # (section, key, value, text the one-line message must contain)
    ("tasks", "foo", 1, ["tasks.foo", "unknown key", "families"]),
    ("tasks", "families", 3, ["tasks.families"]),
    ("tasks", "families", ["minmax", "sorting"], ["tasks.families", "minmax, range, init, compare, zero"]),
    ("rl", "lr", "abc", ["rl.lr", "abc"]),
    ("rl", "lr", True, ["rl.lr"]),
    ("rl", "lr", "1e999", ["rl.lr"]),
    ("run", "threads", 2.0, ["run.threads"]),
    ("rl", "group_size", 1, ["rl.group_size", ">= 2"]),
    ("rl", "group_size", True, ["rl.group_size"]),
    ("rl", "group_size", 2.5, ["rl.group_size"]),
    ("run", "threads", 0, ["run.threads", ">= 1"]),
    ("run", "seed", -1, ["run.seed"]),
    ("rl", "loss_mode", "sum", ["rl.loss_mode", "sum", *LOSS_MODES]),
    ("rl", "kl_kind", "k4", ["rl.kl_kind", "k4", *KL_KINDS]),
    ("rl", "reward", "vibes", ["rl.reward", "vibes", *REWARDS]),
    ("rl", "seed", 3, ["rl.seed"]),
    ("train", "steps", 0, ["train.steps"]),
    ("model", "n_head", 5, ["model.n_head"]),
    ("bogus", "x", 1, ["bogus", "unknown section", "rl"]),
]


@pytest.mark.parametrize("section,key,value,needles", BAD,
                         ids=[f"{s}.{k}={v!r}" for s, k, v, _ in BAD])
def test_bad_values_give_one_line_naming_the_field(tmp_path, monkeypatch, committed, section, key, value, needles):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, committed, section, key, value)
    with pytest.raises(ParamsError) as exc:
        load_params([s for s in SECTIONS])
    msg = str(exc.value)
    assert "\n" not in msg, msg
    assert msg.startswith("params.yaml: "), msg
    for needle in needles:
        assert needle in msg, f"{needle!r} not in {msg!r}"
    if section in SECTIONS:
        assert msg.startswith(f"params.yaml: {section}.{key}"), msg


def test_message_format_example(tmp_path, monkeypatch, committed):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, committed, "rl", "group_size", 1)
    with pytest.raises(ParamsError) as exc:
        load_params(["rl"])
    assert str(exc.value).startswith("params.yaml: rl.group_size: ")


@pytest.mark.parametrize("text,expected", [("1e-3", 1e-3), ("3E-4", 3e-4), ("2e-4", 2e-4)])
def test_yaml_exponent_strings_are_floats(tmp_path, monkeypatch, committed, text, expected):
    monkeypatch.chdir(tmp_path)
    raw = {k: (dict(v) if isinstance(v, dict) else v) for k, v in committed.items()}
    body = yaml.safe_dump(raw, sort_keys=False).replace(f"  lr: {committed['rl']['lr']}\n", f"  lr: {text}\n", 1)
    assert f"lr: {text}" in body
    (tmp_path / "params.yaml").write_text(body)
    assert yaml.safe_load(body)["rl"]["lr"] == text  # YAML 1.1 reads it as a string ...
    rl = load_params(["rl"])["rl"]
    assert rl.lr == pytest.approx(expected) and isinstance(rl.lr, float)  # ... and we accept it


def test_exponent_string_is_not_accepted_for_int_fields(tmp_path, monkeypatch, committed):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, committed, "train", "steps", "1e2")
    with pytest.raises(ParamsError, match="train.steps"):
        load_params(["train"])


def test_missing_keys_take_defaults(tmp_path, monkeypatch, committed):
    monkeypatch.chdir(tmp_path)
    _write(tmp_path, committed, "rl", "clip_eps", None, drop=True)
    assert load_params(["rl"])["rl"].clip_eps == 0.2


def test_missing_or_invalid_file(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ParamsError, match="not found"):
        read_params_file("params.yaml")
    (tmp_path / "params.yaml").write_text("rl: [unclosed\n")
    with pytest.raises(ParamsError) as exc:
        read_params_file("params.yaml")
    assert "\n" not in str(exc.value)


# ---------------------------------------------------------------- end to end through the tasks stage

@pytest.fixture
def repo_copy(tmp_path):
    """A temp copy of the repo (agentrl/, stages/, params.yaml, dvc.yaml), its own git repo and MLflow store."""
    root = tmp_path / "repo"
    root.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for d in ("agentrl", "stages"):
        shutil.copytree(REPO / d, root / d, ignore=ignore)
    for f in ("params.yaml", "dvc.yaml", ".gitignore"):
        if (REPO / f).exists():
            shutil.copy2(REPO / f, root / f)
    subprocess.run(["git", "init", "-q"], cwd=root, check=True)
    env = {k: v for k, v in os.environ.items() if k not in ("DVC_ROOT", "PYTHONPATH")}
    env["MLFLOW_TRACKING_URI"] = f"sqlite:///{(tmp_path / 'store' / 'mlflow.db').as_posix()}"
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    (tmp_path / "store").mkdir()
    return root, env, tmp_path / "store"


def _run_tasks_stage(root, env):
    return subprocess.run([sys.executable, "-m", "stages.tasks"], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


@pytest.mark.slow
@pytest.mark.parametrize("key,value,field", [("foo", 1, "tasks.foo"), ("families", 3, "tasks.families")])
def test_tasks_stage_rejects_bad_params_before_writing(repo_copy, key, value, field):
    root, env, store = repo_copy
    raw = yaml.safe_load((root / "params.yaml").read_text())
    raw["tasks"][key] = value
    (root / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    proc = _run_tasks_stage(root, env)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    err = proc.stderr.strip()
    assert len(err.splitlines()) == 1, err
    assert err.startswith("error:") and field in err, err
    assert not (root / "data").exists()
    assert not any(store.iterdir()), "the MLflow store was touched before params were validated"
    assert not (root / "mlflow.db").exists()


@pytest.mark.slow
def test_tasks_stage_writes_deterministic_bytes(repo_copy):
    root, env, store = repo_copy
    proc = _run_tasks_stage(root, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = root / "data" / "tasks"
    names = ("tasks.json", "split.json", "tokenizer.json")
    for n in names:
        assert (out / n).is_file(), n
    first = {n: (out / n).read_bytes() for n in names}
    import json
    split = json.loads(first["split.json"])
    assert (len(split["train"]), len(split["validation"]), len(split["test"])) == (20, 5, 5)
    assert len(json.loads(first["tasks.json"])["tasks"]) == 30
    from agentrl.env.gym.tokenizer import build_tokenizer
    from agentrl.env.tasks import make_tasks
    tok = build_tokenizer(make_tasks("all"))
    vocab = json.loads(first["tokenizer.json"])
    assert vocab["vocab"] == tok.vocab and vocab["hash"] == tok.hash
    from agentrl.env.gym.tokenizer import Tokenizer
    assert Tokenizer.from_json(first["tokenizer.json"].decode()).hash == vocab["hash"]
    proc = _run_tasks_stage(root, env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    for n in names:
        assert (out / n).read_bytes() == first[n], f"{n} changed between two identical runs"
    assert not list(out.glob("*.tmp"))


def test_committed_params_are_the_library_defaults(committed):
    """params.yaml pins every knob at its declared default, and names every key (the schema is the one source).
    lab.configs is a table of entries: it holds the built-in labs as declared, and may add labs of its own (the
    pretrained ones name a directory `make install` and stage pretrained create), each a valid LabRun."""
    from agentrl.core.lab_config import config_run
    for name in SECTIONS:
        if name != "lab":
            assert committed[name] == defaults(name), name
    lab, default = dict(committed["lab"]), defaults("lab")
    configs = lab.pop("configs")
    assert lab == {k: v for k, v in default.items() if k != "configs"}
    assert {k: configs[k] for k in default["configs"]} == default["configs"]
    for name in set(configs) - set(default["configs"]):
        assert config_run(configs, name).model, name   # an added lab runs a model of its own (or its base's)


def test_a_missing_section_is_an_error(tmp_path, monkeypatch, committed):
    monkeypatch.chdir(tmp_path)
    raw = {k: v for k, v in committed.items() if k != "rl"}
    (tmp_path / "params.yaml").write_text(yaml.safe_dump(raw, sort_keys=False))
    with pytest.raises(ParamsError, match="params.yaml: rl: missing section"):
        load_params(["rl"])
