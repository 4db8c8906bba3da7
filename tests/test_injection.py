"""Nothing user-written reaches a shell: DVC interpolates `${item...}` into a matrix stage's `cmd` and runs it with
the shell, so the matrix stages' commands carry no item (the stage finds its instance from $DVC_STAGE). `dvc repro`
on hostile arm names and seeds, in a throwaway copy of the project, runs nothing the params wrote."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
pytestmark = pytest.mark.slow   # dvc repro in a subprocess


def _project(tmp_path: Path, edit) -> Path:
    """A copy of the project whose ablate/length_pair inputs exist (as placeholders: the stage must refuse its
    instance before reading them), with params edited by `edit(params)`."""
    repo = tmp_path / "repo"
    repo.mkdir()
    for name in ("agentrl", "stages"):
        shutil.copytree(REPO / name, repo / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", repo / "dvc.yaml")
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    edit(params)
    (repo / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    for path in ("data/tasks/split.json", "data/models/base.pt", "data/models/sft.pt", "data/models/length_start.pt",
                 "data/preflight/gate.json"):
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text("placeholder\n")
    env = _env(tmp_path)
    subprocess.run("git init -q && git config user.email t@example.com && git config user.name t && "
                   f"{BIN / 'dvc'} init -q", shell=True, cwd=repo, check=True, env=env)
    return repo


def _env(tmp_path: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DVC_")}
    env.update(PATH=f"{BIN}:{env['PATH']}", MLFLOW_TRACKING_URI=f"sqlite:///{tmp_path}/store.db")
    return env


def _instances(repo: Path, env) -> list[str]:
    out = subprocess.run([str(BIN / "dvc"), "stage", "list", "--name-only"], cwd=repo, capture_output=True,
                         text=True, env=env, check=True)
    return out.stdout.splitlines()


CANARY = "{canary}"
HOSTILE = [
    ("arm", lambda p, c: p["ablate"].update(arms={f"x;touch {c};true": {}}, seeds=[0]), "ablate@"),
    ("arm-subshell", lambda p, c: p["ablate"].update(arms={f"$(touch {c})": {}}, seeds=[0]), "ablate@"),
    ("seed", lambda p, c: p["ablate"].update(arms={"default": {}}, seeds=[f"0;touch {c}"]), "ablate@"),
    ("length-seed", lambda p, c: p["length"].update(seeds=[f"1 && touch {c}"]), "length_pair@"),
]


@pytest.mark.parametrize("label,edit,prefix", HOSTILE, ids=[h[0] for h in HOSTILE])
def test_dvc_repro_of_a_hostile_matrix_item_runs_nothing_it_wrote(tmp_path, label, edit, prefix):
    canary = tmp_path / "pwned"
    repo = _project(tmp_path, lambda p: edit(p, canary))
    env = _env(tmp_path)
    (stage,) = [s for s in _instances(repo, env) if s.startswith(prefix)]
    assert str(canary) in stage or "touch" in stage     # the hostile text made it into the stage name ...
    out = subprocess.run([str(BIN / "dvc"), "repro", "-s", stage], cwd=repo, capture_output=True, text=True,
                         env=env, timeout=300)
    assert not canary.exists(), f"the shell ran a param: {out.stdout[-2000:]}"   # ... but never into a shell
    assert out.returncode != 0
    errors = [line for line in out.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and ("ablate" in errors[0] or "length" in errors[0]), out.stderr[-2000:]
    assert "Traceback" not in out.stderr


def test_a_valid_instance_finds_itself_from_the_stage_name_dvc_sets(tmp_path):
    repo = _project(tmp_path, lambda p: p["ablate"].update(arms={"default": {}, "kl2": {"rl.kl_coef": 0.1}},
                                                            seeds=[0, 7]))
    out = subprocess.run([str(BIN / "dvc"), "repro", "-s", "ablate@kl2-7"], cwd=repo, capture_output=True,
                         text=True, env=_env(tmp_path), timeout=300)
    # past its instance (kl2, 7), the stage stops at its first missing input, before any output
    assert "error: missing input data/tasks/tokenizer.json" in out.stderr, out.stderr[-2000:]
    assert not (repo / "data" / "ablate").exists()
