"""A matrix stage's instance comes from $DVC_STAGE (or its flags), matched against the instances params.yaml
generates; a name that matches none, or params with an unsafe arm name or seed, is one line."""
from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import yaml

from agentrl.core.config import UserError
from agentrl.pipeline.instances import StageArguments, ablation_instance, length_pair_instance, seed_arg

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture
def params(tmp_path):
    def write(section: str, **values) -> str:
        raw = yaml.safe_load((REPO / "params.yaml").read_text())
        raw[section].update(values)
        path = tmp_path / "params.yaml"
        path.write_text(yaml.safe_dump(raw))
        return str(path)
    return write


def test_the_instance_is_the_one_dvc_named(params, monkeypatch):
    path = params("ablate", arms={"default": {}, "kl_2": {}}, seeds=[0, 11])
    monkeypatch.setenv("DVC_STAGE", "ablate@kl_2-11")
    assert ablation_instance(None, None, path) == ("kl_2", 11)
    assert ablation_instance("default", 0, path) == ("default", 0)   # flags win (outside DVC)
    monkeypatch.setenv("DVC_STAGE", "length_pair@3")
    assert length_pair_instance(None, params("length", seeds=[1, 3])) == 3


@pytest.mark.parametrize("stage_name,fragment", [("ablate@kl_2-12", "is no instance"), ("", "run it under `dvc repro`"),
                                                 ("ablate@x;touch pwned;true-0", "is no instance")])
def test_a_name_that_is_no_instance_is_one_line(params, monkeypatch, stage_name, fragment):
    monkeypatch.setenv("DVC_STAGE", stage_name)
    with pytest.raises(UserError, match=fragment):
        ablation_instance(None, None, params("ablate", arms={"default": {}, "kl_2": {}}, seeds=[0, 11]))


@pytest.mark.parametrize("arms,seeds,fragment", [({"x;touch pwned;true": {}}, [0], "an arm name is letters"),
                                                 ({"nl\n": {}}, [0], "an arm name is letters"),
                                                 ({"default": {}}, ["0;touch pwned"], "ablate.seeds: expected"),
                                                 ({"default": {}}, [2**64], "ablate.seeds: expected")])
def test_unsafe_names_and_seeds_are_refused_before_matching(params, monkeypatch, arms, seeds, fragment):
    monkeypatch.setenv("DVC_STAGE", "ablate@default-0")
    with pytest.raises(UserError, match=fragment):
        ablation_instance(None, None, params("ablate", arms=arms, seeds=seeds))


@pytest.mark.parametrize("text", ["7", "0", "18446744073709551615"])
def test_a_seed_flag_of_digits_is_its_integer(text):
    assert seed_arg(text) == int(text)


@pytest.mark.parametrize("text", ["\t0", "0\n", " 7", "1_0", "\u0663", "+1", "-1", "0x1", "18446744073709551616", ""])
def test_a_seed_flag_is_digits_whole(text):
    """int() takes surrounding whitespace, underscores and other scripts' digits: `--seed $'\\t0'` ran seed 0."""
    with pytest.raises(argparse.ArgumentTypeError, match="digits 0-9"):
        seed_arg(text)


def test_a_bad_stage_flag_is_one_line_and_exit_2(capsys):
    parser = StageArguments(prog="length_pair")
    parser.add_argument("--seed", type=seed_arg)
    with pytest.raises(SystemExit) as exit_:
        parser.parse_args(["--seed", "\x01"])
    assert exit_.value.code == 2
    assert capsys.readouterr().err.splitlines() == [
        "error: length_pair: argument --seed: expected a seed: digits 0-9, in [0, 18446744073709551615], got '\\x01'"]
