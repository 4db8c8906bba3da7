"""The params loader refuses what YAML lets through: duplicate keys, values the code cannot represent (seeds beyond
64 bits), linked knobs with different bounds; it warns about more threads than cores; `check` reads params.yaml like
every stage; `audit` on a params.yaml DVC cannot parse is one line."""
from __future__ import annotations

import argparse
import shutil
from pathlib import Path

import pytest
import torch
import yaml

from agentrl.core.config import SEED_MAX, ParamsError, load_params

REPO = Path(__file__).resolve().parents[1]


def _params(tmp_path, edit) -> Path:
    text = (REPO / "params.yaml").read_text()
    path = tmp_path / "params.yaml"
    path.write_text(edit(text))
    return path


def test_a_duplicated_key_is_refused_with_the_key_and_its_lines(tmp_path):
    path = _params(tmp_path, lambda t: t.replace("  alpha: 0.05\n  stop_patience", "  alpha: 0.05\n  alpha: 0.1\n"
                                                                                  "  stop_patience", 1))
    lines = path.read_text().splitlines()
    first = lines.index("  alpha: 0.05", lines.index("select:")) + 1
    with pytest.raises(ParamsError) as err:
        load_params(["select"], path)
    assert str(err.value) == f"{path}: duplicate key 'alpha' at line {first + 1} (first at line {first}); keep one"


def test_a_duplicated_section_is_refused(tmp_path):
    path = _params(tmp_path, lambda t: t + "\nrun:\n  seed: 1\n  threads: 2\n")
    with pytest.raises(ParamsError, match="duplicate key 'run'"):
        load_params(["run"], path)


@pytest.mark.parametrize("seed", [SEED_MAX + 1, 2**70, -1])
def test_a_seed_beyond_64_bits_is_refused_before_anything_runs(tmp_path, seed):
    path = _params(tmp_path, lambda t: t.replace("  seed: 0 ", f"  seed: {seed} ", 1))
    with pytest.raises(ParamsError) as err:
        load_params(["run", "rl"], path)
    assert f"run.seed: expected an integer in [0, {SEED_MAX}], got {seed}" in str(err.value)


def test_the_largest_seed_accepted_is_one_torch_takes(tmp_path):
    path = _params(tmp_path, lambda t: t.replace("  seed: 0 ", f"  seed: {SEED_MAX} ", 1))
    params = load_params(["run", "rl"], path)
    assert params["rl"].seed == SEED_MAX
    torch.Generator().manual_seed(params["run"].seed)


@pytest.mark.parametrize("section,key,value", [("ablate", "seeds", f"[0, {SEED_MAX + 1}]"),
                                               ("length", "seeds", f"[{SEED_MAX + 1}]")])
def test_seed_lists_share_the_bound(tmp_path, section, key, value):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw[section][key] = yaml.safe_load(value)
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError, match=f"{section}.{key}: expected .*{SEED_MAX}"):
        load_params([section], path)


@pytest.mark.parametrize("key", ["clip_eps", "clip_eps_low"])
@pytest.mark.parametrize("value", [1.0, 1.5, 0.0])
def test_clip_eps_and_its_low_side_share_their_bounds(tmp_path, key, value):
    raw = yaml.safe_load((REPO / "params.yaml").read_text())
    raw["rl"][key] = value
    path = tmp_path / "params.yaml"
    path.write_text(yaml.safe_dump(raw))
    with pytest.raises(ParamsError) as err:
        load_params(["rl"], path)
    assert f"rl.{key}: expected a finite number in (0, 1)" in str(err.value) and str(err.value).endswith(f"got {value}")


def test_more_threads_than_cores_is_a_warning_line(capsys, monkeypatch):
    from agentrl.core import boundary
    monkeypatch.setattr(boundary.os, "cpu_count", lambda: 2)
    boundary.check_threads(2)
    assert capsys.readouterr().err == ""
    boundary.check_threads(64)
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("warning: run.threads=64 exceeds this machine's 2 cores")


def _check_args(**kw):
    ns = dict(params="params.yaml", rl=None, seed=None, kl_coef=None, threads=None)
    return argparse.Namespace(**(ns | kw))


def test_check_reads_params_yaml_and_its_flags_override_it(tmp_path):
    from agentrl.cli import check_config
    path = _params(tmp_path, lambda t: t.replace("  clip_eps: 0.2", "  clip_eps: 0.3", 1)
                   .replace("  seed: 0 ", "  seed: 7 ", 1).replace("  threads: 2 ", "  threads: 1 ", 1))
    cfg, threads = check_config(_check_args(params=str(path)))
    assert (cfg.clip_eps, cfg.seed, cfg.kl_coef, threads) == (0.3, 7, 0.1, 1)   # kl_coef: preflight.kl_coef
    cfg, threads = check_config(_check_args(params=str(path), rl=[("clip_eps", 0.1)], seed=3, kl_coef=0.2,
                                            threads=2))
    assert (cfg.clip_eps, cfg.seed, cfg.kl_coef, threads) == (0.1, 3, 0.2, 2)


def test_check_refuses_a_bad_params_yaml_in_one_line(tmp_path, capsys):
    from agentrl import cli
    path = _params(tmp_path, lambda t: t.replace("  clip_eps: 0.2", "  clip_eps: 1.5", 1))
    assert cli.main(["check", "--params", str(path), "--quick-base"]) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line == f"error: {path}: rl.clip_eps: expected a finite number in (0, 1), got 1.5"


def test_check_without_a_params_file_uses_the_library_defaults(tmp_path, monkeypatch):
    from agentrl.cli import check_config
    monkeypatch.chdir(tmp_path)
    cfg, threads = check_config(_check_args())
    assert (cfg.clip_eps, cfg.seed, cfg.kl_coef, threads) == (0.2, 0, 0.1, 2)


def test_audit_with_a_yaml_syntax_error_in_params_is_one_line(tmp_path, capsys):
    """DVC's YAMLFileCorruptedError (a rich multi-line report) becomes one line naming the file's line."""
    from agentrl.tracking.audit import main
    root = tmp_path / "repo"
    (root / ".dvc").mkdir(parents=True)
    (root / ".dvc" / "config").write_text("[core]\n    no_scm = True\n")
    (root / "reports").mkdir()
    (root / "reports" / "x.json").write_text('{"v": 1}\n')
    (root / "dvc.yaml").write_text("stages:\n  x:\n    cmd: 'true'\n    params: [run]\n    outs:\n"
                                   "    - reports/x.json:\n        cache: false\n")
    (root / "dvc.lock").write_text("schema: '2.0'\nstages:\n  x:\n    cmd: 'true'\n    outs:\n"
                                   "    - path: reports/x.json\n      md5: 0123456789abcdef0123456789abcdef\n"
                                   "      size: 9\n")
    shutil.copy(REPO / "params.yaml", root / "params.yaml")
    (root / "params.yaml").write_text((root / "params.yaml").read_text().replace("  threads: 2", "  threads: [2", 1))
    assert main("reports/x.json:v", root=root) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    assert line.startswith("error: dvc status x: ") and "params.yaml" in line and "line " in line, line
