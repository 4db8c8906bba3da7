"""Which matrix instance a stage process is, without anything user-written passing through a shell.

DVC interpolates `${item...}` into a stage's `cmd` verbatim and runs it with the shell, so an arm name like
`x;touch pwned` in params.yaml would run before any project code could refuse it. The matrix stages' commands
therefore carry no item at all (`python -m stages.ablate`): the process learns its instance from `$DVC_STAGE`,
which DVC sets to the stage's name (`ablate@default-0`, DVC >= 3.49), matched against the instances the params
generate; the name itself is never parsed into a value. Outside DVC, the stage's flags name the instance.
"""
from __future__ import annotations

import argparse
import os
import re
import sys

from agentrl.core.config import ARM_NAME, SEED_MAX, UserError, read_params_file

DVC_STAGE = "DVC_STAGE"
DIGITS = re.compile(r"[0-9]{1,20}")   # int() would also take " 7\t", "1_0" and "٣"


def seed_arg(text: str) -> int:
    """A seed flag's value: ASCII digits, whole, in [0, SEED_MAX]."""
    if not DIGITS.fullmatch(text) or int(text) > SEED_MAX:
        raise argparse.ArgumentTypeError(f"expected a seed: digits 0-9, in [0, {SEED_MAX}], got {ascii(text)[:80]}")
    return int(text)


class StageArguments(argparse.ArgumentParser):
    """A stage script's flags; a bad one is the boundary's one line and exit 2 (argparse would print its usage
    first)."""

    def error(self, message: str):
        print(f"error: {self.prog.removesuffix('.py')}: {message[:300]}", file=sys.stderr)
        sys.exit(2)


def _text(value) -> str:
    """An item as DVC writes it into a generated stage name (dvc.parsing: to_str)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def matrix_instance(stage: str, items: dict[str, list], given: dict, params_path: str = "params.yaml") -> dict:
    """The item of matrix stage `stage` this process runs: `given` (command-line flags) if any were passed, else the
    combination of `items` (name -> the values params.yaml lists) whose generated name equals $DVC_STAGE.
    Raises UserError naming what is wrong."""
    if any(v is not None for v in given.values()):
        if any(v is None for v in given.values()):
            raise UserError(f"{stage}: pass all of {', '.join('--' + k for k in given)} (or run it under dvc repro)")
        return given
    name = os.environ.get(DVC_STAGE, "")
    if not name:
        raise UserError(f"{stage}: no instance named: run it under `dvc repro` (which sets ${DVC_STAGE}) or pass "
                        + ", ".join(f"--{k}" for k in given))
    combos: list[dict] = [{}]
    for key, values in items.items():
        combos = [{**c, key: v} for c in combos for v in values]
    found = [c for c in combos if f"{stage}@" + "-".join(_text(v) for v in c.values()) == name.rsplit(":", 1)[-1]]
    if len(found) != 1:
        raise UserError(f"{stage}: ${DVC_STAGE}={name[:80]!r} is {'no' if not found else 'more than one'} instance "
                        f"of the matrix in {params_path}; run `dvc repro` again after fixing params.yaml")
    return found[0]


def ablation_instance(arm: str | None, seed: int | None, params_path: str = "params.yaml") -> tuple[str, int]:
    """(arm, seed) of an `ablate` instance, every arm name and seed checked first."""
    ablate = read_params_file(params_path).get("ablate") or {}
    arms, seeds = ablate.get("arms"), ablate.get("seeds")
    if not isinstance(arms, dict) or not isinstance(seeds, list):
        raise UserError(f"{params_path}: ablate.arms must be a mapping and ablate.seeds a list")
    for name in arms:
        if not isinstance(name, str) or not ARM_NAME.fullmatch(name):
            raise UserError(f"{params_path}: ablate.arms: {str(name)[:80]!r}: an arm name is letters, digits and _ "
                            "(it names DVC stages)")
    check_seeds("ablate.seeds", seeds, params_path)
    item = matrix_instance("ablate", {"arm": list(arms), "seed": seeds}, {"arm": arm, "seed": seed}, params_path)
    if item["arm"] not in arms:
        raise UserError(f"ablate: unknown arm {str(item['arm'])[:80]!r}; arms in {params_path}: {', '.join(arms)}")
    check_seeds("--seed", [item["seed"]], params_path)
    return item["arm"], item["seed"]


def length_pair_instance(seed: int | None, params_path: str = "params.yaml") -> int:
    seeds = (read_params_file(params_path).get("length") or {}).get("seeds")
    if not isinstance(seeds, list):
        raise UserError(f"{params_path}: length.seeds must be a list")
    check_seeds("length.seeds", seeds, params_path)
    return matrix_instance("length_pair", {"seed": seeds}, {"seed": seed}, params_path)["seed"]


def check_seeds(field: str, seeds: list, params_path: str) -> None:
    for seed in seeds:
        if isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed <= SEED_MAX:
            raise UserError(f"{params_path}: {field}: expected integers in [0, {SEED_MAX}], got {str(seed)[:80]!r}")
