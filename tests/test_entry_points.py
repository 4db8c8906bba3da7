"""Every documented command works from a fresh process: each `python -m agentrl` verb and each stage's entry point,
run with the smallest arguments that reach its validation of params (--help is not enough), in a project whose
params.yaml names an rl variant that does not exist.

The variants a knob may name (loss modes, KL estimators, ...) are registries that the modules implementing them
fill when imported. A process that validates the rl section without importing them answers "no KL estimator is
registered in this process": `python -m agentrl bench` did, on every machine, while every other test passed
(the process that ran them had imported the variants long before). Each command here must instead name the bad
value and the allowed ones, or fail on the one thing its arguments make it fail on, in one line."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from agentrl.pipeline.early import stage_declaration

REPO = Path(__file__).resolve().parents[1]
pytestmark = pytest.mark.slow   # one fresh interpreter per command (torch imported each time)
NOT_REGISTERED = "is registered in this process"
BAD_RL = "rl.kl_kind: unknown value 'nope'; allowed: k1, k2, k3"
STAGES = sorted(p.stem for p in (REPO / "stages").glob("*.py") if p.stem != "__init__")
INSTANCE = {"ablate": ["--arm", "default", "--seed", "0"], "length_pair": ["--seed", "0"], "lab": ["--lab", "menu"],
            "pretrained": ["--model", "smollm2-135m-instruct"]}


@pytest.fixture(scope="module")
def project(tmp_path_factory, store_template):
    """An empty project whose params.yaml is the committed one with rl.kl_kind: nope, and a TinyAgent checkpoint
    where the verbs look for the base policy (untrained: the verbs only need one to load)."""
    from agentrl.core.config import ModelParams
    from agentrl.env.gym.tokenizer import build_tokenizer
    from agentrl.env.tasks import make_tasks
    from agentrl.model.checkpoints import save_policy
    from agentrl.model.policy import ModelConfig, TinyAgent
    root = tmp_path_factory.mktemp("entry")
    tok = build_tokenizer(make_tasks("all"))
    model = TinyAgent(ModelConfig(vocab_size=len(tok.vocab), **ModelParams().to_dict()))
    save_policy(root / "data" / "models" / "base.pt", model, tok.hash)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["rl"]["kl_kind"] = "nope"
    (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    shutil.copy(store_template, root / "mlflow.db")
    return root


def _run(root: Path, args: list[str], params: dict | None = None) -> subprocess.CompletedProcess:
    if params is not None:
        (root / "params.yaml").write_text(yaml.safe_dump(params, sort_keys=False))
    env = {**os.environ, "PYTHONPATH": str(REPO), "DVC_ROOT": str(root), "AGENTRL_LOG_DIR": str(root / "logs"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{root / 'mlflow.db'}"}
    for key in ("DVC_STAGE", "AGENTRL_DEBUG", "AGENTRL_TRACKING_DEFER"):
        env.pop(key, None)
    return subprocess.run([sys.executable, "-m", *args], cwd=root, env=env, capture_output=True, text=True,
                          timeout=300)


def _one_line(out: subprocess.CompletedProcess) -> str:
    lines = [line for line in out.stderr.strip().splitlines() if not line.startswith("warning:")]
    assert len(lines) == 1, out.stderr[-2000:]
    return lines[0]


@pytest.mark.parametrize("stage", STAGES)
def test_each_stage_validates_its_params_with_the_variants_registered(project, stage):
    sections, _ = stage_declaration(stage)
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    if "rl" in sections:
        params["rl"]["kl_kind"] = "nope"
        expected = BAD_RL
    else:   # a stage that does not read rl: an unknown key in the first section it reads, named
        params[sections[0]] = {**(params[sections[0]] or {}), "nope": 1}
        expected = f"{sections[0]}.nope: unknown key"
    out = _run(project, [f"stages.{stage}", *INSTANCE.get(stage, [])], params)
    line = _one_line(out)
    assert out.returncode == 2 and expected in line and NOT_REGISTERED not in out.stderr, (stage, out.stderr[-2000:])


VERBS = {   # verb -> (arguments, a fragment of its one line; None: it ran and said what it checked, exit 0 or 1)
    "check": (["check", "--quick-base"], BAD_RL),
    "params": (["params"], BAD_RL),
    "labcells": (["labcells", "--lab", "menu", "--table"], BAD_RL),
    "opprobe": (["opprobe", "--lab", "menu", "--table"], BAD_RL),
    "labtemps": (["labtemps", "--lab", "menu", "--table"], BAD_RL),
    "labbaselines": (["labbaselines", "--lab", "menu", "--table"], BAD_RL),
    "research": (["research", "stopping", "--seeds", "0", "--steps", "1"], BAD_RL),
    "bench": (["bench", "--steps", "1", "--threads", "1"], None),   # its whole table, from the base it finds
    "labcheck": (["labcheck", "--device", "cuda"], "lab.device: cuda, but torch sees no CUDA device"),
    "envcheck": (["envcheck", "--episodes", "1"], None),
    "audit": (["audit", "reports/none.json:x"], "reports/none.json"),
    "replay": (["replay", "7", "--bundle-dir", "nowhere"], "nowhere"),
    "study": (["study", "labs"], "no lab reports"),
    "sweep": (["sweep", "nope"], "nope"),
    "compare-reports": (["compare-reports", "a", "b"], "a"),
    "deps": (["deps", "--help"], None),
}


def test_every_verb_of_the_cli_is_in_this_test():
    from agentrl.cli import build_parser
    sub = next(a for a in build_parser()._actions if getattr(a, "choices", None) and "check" in a.choices)
    assert set(sub.choices) == set(VERBS)


@pytest.mark.parametrize("verb", sorted(VERBS))
def test_each_verb_reaches_its_validation_in_a_fresh_process(project, verb):
    import torch
    args, expected = VERBS[verb]
    if verb == "labcheck" and torch.cuda.is_available():
        pytest.skip("this machine has a CUDA device: the refusal does not apply")
    out = _run(project, ["agentrl", *args])
    assert NOT_REGISTERED not in out.stderr, out.stderr[-2000:]
    if expected is None:
        assert out.returncode in (0, 1) and "error:" not in out.stderr and out.stdout, out.stderr[-2000:]
    else:
        line = _one_line(out)
        assert out.returncode in (1, 2) and expected in line, (verb, out.stderr[-2000:])
