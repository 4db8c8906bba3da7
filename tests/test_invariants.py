"""The one training loop and its seams: hooks never perturb training, a fault is only its seam overrides, the nine
invariants catch every registered fault (the matrix of SPEC §6, cell by cell), guards stop on non-finite values
and their bundles replay exactly, `git bisect run python -m agentrl check` finds a commit that breaks the trainer,
and the dashboard's fail_turn_limit says how much of length_fail is failures that ran out of turns."""
import copy
import math
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.config import RLConfig
from agentrl.env.tasks import make_tasks
from agentrl.faults.registry import BUGS, EXPECTED_FAILURES, FAULTS, seams_for
from agentrl.rl.guards import BundleGuard, replay_bundle, same_stats
from agentrl.rl.invariants import CHECKS, failed_checks, sanity_checks
from agentrl.rl.rollout import sample_step
from agentrl.rl.trainer import SEAMS, Hook, NonFiniteError, Seams, env_factory_for, group_advantages, train

REPO = Path(__file__).resolve().parents[1]


def test_no_fault_is_the_plain_loop_and_hooks_do_not_perturb_it(rl_base, tok, tmp_path):
    """seams_for(None) is the trainer's own Seams (one code path), and a hook that evaluates on its own generator,
    saves a frozen copy every 2 steps and snapshots bundles leaves the run bit-identical."""
    from agentrl.eval.evaluation import evaluate
    from agentrl.model.checkpoints import save_policy
    assert seams_for(None) is SEAMS

    class EveryTwo(Hook):
        def after_step(self, updates, state):
            if updates % 2 == 0:
                evaluate(state.model, make_tasks("validation"), tok, 4, 1.0, torch.Generator().manual_seed(updates),
                         RLConfig())
                save_policy(tmp_path / f"step_{updates}.pt", state.model, tok.hash,
                            extra={"optimizer": state.optimizer.state_dict()})
    m1, m2 = copy.deepcopy(rl_base), copy.deepcopy(rl_base)
    h1 = train(m1, make_tasks("train"), tok, RLConfig(), 6,
               hooks=[EveryTwo(), BundleGuard(tmp_path / "bundles", RLConfig())])
    h2 = train(m2, make_tasks("train"), tok, RLConfig(), 6, seams=seams_for(None))
    assert len(list(tmp_path.glob("step_*.pt"))) == 3
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert h1 == h2


def test_a_fault_is_exactly_its_seam_overrides():
    for name, fault in FAULTS.items():
        seams = seams_for(name)
        changed = {f for f in Seams.__dataclass_fields__ if getattr(seams, f) is not getattr(SEAMS, f)}
        assert changed == set(fault.overrides), name
        assert fault.expected == frozenset(EXPECTED_FAILURES[name])


def test_the_loop_never_names_a_fault():
    """grep -rn "bug ==" agentrl stages finds nothing outside the fault registry."""
    hits = subprocess.run(["grep", "-rn", "-e", "bug ==", "-e", "fault ==", "agentrl", "stages"], cwd=REPO,
                          capture_output=True, text=True).stdout.splitlines()
    assert [h for h in hits if not h.startswith("agentrl/faults/registry.py")] == []


@pytest.fixture(scope="module")
def matrix(rl_base, tok):
    cfg = RLConfig(kl_coef=0.1)
    batch, _ = sample_step(rl_base, env_factory_for(cfg), make_tasks("train"), tok, cfg,
                           torch.Generator().manual_seed(0))
    return {bug: sanity_checks(rl_base, batch, tok, cfg, seams_for(bug)) for bug in [None, *BUGS]}


CELLS = [(bug, i) for bug in [None, *BUGS] for i in range(1, 10)]


@pytest.mark.parametrize("bug,check", CELLS, ids=[f"{b}-{i}" for b, i in CELLS])
def test_check_matrix_cell(matrix, bug, check):
    value, passed = matrix[bug][CHECKS[check - 1]]
    expected_to_fail = check in EXPECTED_FAILURES[bug]
    assert passed != expected_to_fail, f"{bug}: check {check} ({CHECKS[check - 1]}) value {value}"


def test_clean_margins(matrix):
    clean = {k: float(v) for k, (v, _) in matrix[None].items()}
    print("clean margins:", {k: f"{v:.3g}" for k, v in clean.items()})
    assert clean["mask_is_policy"] == 0
    assert clean["sampler_trainer_gap"] < 1e-4
    assert clean["ratio_is_one"] < 1e-4
    assert clean["group_adv_mean"] < 1e-5
    assert clean["padding_invariance"] < 1e-5
    assert clean["accumulation"] < 1e-4
    assert clean["old_logp_frozen"] > 0
    assert clean["update_direction"] > 0
    assert clean["kl_to_reference"] > 0
    assert failed_checks(matrix[None]) == set()


def test_nan_guard_stops_and_bundle_replays(rl_base, tok, tmp_path):
    model = copy.deepcopy(rl_base)
    calls = []

    def nan_at_step_2(batch, cfg):  # a test-only seam: the advantages of step 2 carry a NaN
        adv = group_advantages(batch, cfg)
        calls.append(1)
        if len(calls) == 3:
            adv = adv.clone()
            adv[0] = float("nan")
        return adv
    seams = Seams(advantages=nan_at_step_2)
    with pytest.raises(NonFiniteError) as err:
        train(model, make_tasks("train"), tok, RLConfig(), 4, seams=seams, hooks=[BundleGuard(tmp_path, RLConfig())])
    bundle = err.value.bundle
    assert bundle and Path(bundle).exists() and "step 2" in str(err.value)
    recorded, replayed = replay_bundle(bundle)
    assert recorded["loss"] != recorded["loss"]  # the recorded loss is NaN (the batch holds the NaN advantage)
    assert same_stats(recorded, replayed)
    out = subprocess.run([sys.executable, "-m", "agentrl", "replay", bundle], capture_output=True, text=True)
    assert out.returncode == 0 and "identical statistics" in out.stdout


def test_spike_bundle_replays_exactly(rl_base, tok, tmp_path):
    model = copy.deepcopy(rl_base)
    history = train(model, make_tasks("train"), tok, RLConfig(), 7,
                    hooks=[BundleGuard(tmp_path, RLConfig(), spike_factor=0.0)])
    bundles = [r["spike_bundle"] for r in history if r.get("spike_bundle")]
    assert bundles, "with spike_factor 0 every step after the warm-up is flagged"
    recorded, replayed = replay_bundle(bundles[-1])
    assert same_stats(recorded, replayed)


def test_check_cli_exit_codes(rl_base, tok, tmp_path):
    from agentrl.model.checkpoints import save_policy
    model = tmp_path / "policy.pt"
    save_policy(model, rl_base, tok.hash)
    ok = subprocess.run([sys.executable, "-m", "agentrl", "check", "--model", str(model)], capture_output=True,
                        text=True, cwd=REPO)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    bad = subprocess.run([sys.executable, "-m", "agentrl", "check", "--model", str(model), "--bug", "sampler_temp"],
                         capture_output=True, text=True, cwd=REPO)
    assert bad.returncode == 1 and "FAILED [2, 3]" in bad.stdout, bad.stdout + bad.stderr
    missing = subprocess.run([sys.executable, "-m", "agentrl", "check", "--model", str(tmp_path / "nope.pt")],
                             capture_output=True, text=True, cwd=REPO)
    assert missing.returncode == 2 and len(missing.stderr.strip().splitlines()) == 1 and "nope.pt" in missing.stderr


def _git(repo, *args):
    return subprocess.run(["git", *args], cwd=repo, capture_output=True, text=True, check=True).stdout


@pytest.mark.slow
def test_git_bisect_finds_the_faulty_commit(tmp_path):
    repo = tmp_path / "history"
    repo.mkdir()
    shutil.copytree(REPO / "agentrl", repo / "agentrl", ignore=shutil.ignore_patterns("__pycache__"))
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.com")
    _git(repo, "config", "user.name", "t")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "good")
    good = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "NOTES").write_text("an unrelated change\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-qm", "notes")
    rollout = repo / "agentrl" / "rl" / "rollout.py"
    src = rollout.read_text()
    faulty = src.replace('self.action_mask = [int(o == OWNER["policy"]) for o in self.owner[1:]]',
                         'self.action_mask = [int(o == OWNER["policy"]) for o in self.owner[:-1]]')
    assert faulty != src
    rollout.write_text(faulty)
    _git(repo, "commit", "-qam", "refactor the action mask")
    bad = _git(repo, "rev-parse", "HEAD").strip()
    (repo / "NOTES").write_text("another unrelated change\n")
    _git(repo, "commit", "-qam", "more notes")
    _git(repo, "bisect", "start", "HEAD", good)
    out = subprocess.run(["git", "bisect", "run", sys.executable, "-m", "agentrl", "check", "--quick-base"], cwd=repo,
                         capture_output=True, text=True)
    assert f"{bad} is the first bad commit" in out.stdout, out.stdout[-3000:] + out.stderr[-3000:]


def test_fail_turn_limit_is_the_share_of_failures_that_ran_out_of_turns():
    from agentrl.rl.dashboard import behavior_stats
    from agentrl.rl.rollout import OWNER, Trajectory

    def episode(n_policy: int, submitted: bool, passed: bool):
        info = {"submitted": submitted, "hidden_pass": passed, "reads": 0, "tests": 0, "edits": 0, "n_turns": 1,
                "n_invalid": 0, "ops": [], "tools": []}
        owner = [OWNER["prompt"]] + [OWNER["policy"]] * n_policy
        return Trajectory(list(range(n_policy + 1)), owner, [0.0] * n_policy, float(submitted and passed), info)

    short_fail, long_fail, passed = episode(10, True, False), episode(42, False, False), episode(13, True, True)
    beh = behavior_stats([short_fail, short_fail, short_fail, long_fail, passed])
    assert beh["fail_turn_limit"] == pytest.approx(1 / 4)
    assert beh["length_fail"] == pytest.approx((3 * 10 + 42) / 4)
    # fewer short failures, same long ones: length_fail rises though no failed episode got longer
    fewer = behavior_stats([short_fail, long_fail, passed, passed, passed])
    assert fewer["fail_turn_limit"] == pytest.approx(1 / 2) and fewer["length_fail"] == pytest.approx(26.0)
    assert math.isnan(behavior_stats([passed])["fail_turn_limit"])
