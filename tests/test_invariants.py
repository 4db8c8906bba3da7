"""The one training loop and its seams: hooks never perturb training, a fault is only its seam overrides, the nine
invariants catch every registered fault (the fault matrix, cell by cell), guards stop on non-finite values
and their bundles replay exactly, `git bisect run python -m agentrl check` finds a commit that breaks the trainer,
and the dashboard's fail_turn_limit says how much of length_fail is failures that ran out of turns."""
import copy
import math
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from agentrl.core.config import RLConfig
from agentrl.core.variants import KL_KINDS, LOSS_MODES
from agentrl.env.gym.spec import GYM
from agentrl.env.tasks import make_tasks
from agentrl.faults.registry import BUGS, EXPECTED_FAILURES, FAULTS, seams_for
from agentrl.rl.guards import BundleGuard, replay_bundle, same_stats
from agentrl.rl.invariants import CHECKS, failed_checks, margin, sanity_checks
from agentrl.rl.rollout import sample_step
from agentrl.rl.trainer import SEAMS, Hook, NonFiniteError, Seams, group_advantages, train

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
                         RLConfig(), env=GYM.make(RLConfig(), evaluation=True))
                save_policy(tmp_path / f"step_{updates}.pt", state.model, tok.hash,
                            extra={"optimizer": state.optimizer.state_dict()})
    m1, m2 = copy.deepcopy(rl_base), copy.deepcopy(rl_base)
    h1 = train(m1, make_tasks("train"), tok, RLConfig(), 6, env=GYM.make(RLConfig()),
               hooks=[EveryTwo(), BundleGuard(tmp_path / "bundles", RLConfig())])
    h2 = train(m2, make_tasks("train"), tok, RLConfig(), 6, env=GYM.make(RLConfig()), seams=seams_for(None))
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
    batch, _ = sample_step(rl_base, GYM.make(cfg), make_tasks("train"), tok, cfg,
                           torch.Generator().manual_seed(0))
    return {bug: sanity_checks(rl_base, batch, tok, cfg, seams_for(bug)) for bug in [None, *BUGS]}


CELLS = [(bug, i) for bug in [None, *BUGS] for i in range(1, 10)]


@pytest.mark.parametrize("bug,check", CELLS, ids=[f"{b}-{i}" for b, i in CELLS])
def test_check_matrix_cell(matrix, bug, check):
    value, passed = matrix[bug][CHECKS[check - 1]]
    expected_to_fail = check in EXPECTED_FAILURES[bug]
    assert passed != expected_to_fail, f"{bug}: check {check} ({CHECKS[check - 1]}) value {value}"


def test_clean_margins(matrix):
    """On the stage's own batch every value clears its threshold by at least 10x on its side: the clean trainer's
    inside, each fault's outside on the invariants it is expected to fail (margins over 20 batches:
    docs/preflight.md)."""
    clean = {k: float(v) for k, (v, _) in matrix[None].items()}
    print("clean margins:", {k: f"{v:.3g}" for k, v in clean.items()})
    assert failed_checks(matrix[None]) == set() and matrix[None].errors == {}
    assert clean["mask_is_policy"] == 0
    assert clean["update_direction"] > 0
    for bug in [None, *BUGS]:
        for i in EXPECTED_FAILURES[bug] | ({1, 2, 3, 4, 5, 6, 7, 9} if bug is None else set()):
            name = CHECKS[i - 1]
            factor = margin(name, matrix[bug][name][0])
            assert factor is None or factor >= 10, (bug, name, matrix[bug][name][0], factor)


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
        train(model, make_tasks("train"), tok, RLConfig(), 4, env=GYM.make(RLConfig()), seams=seams,
              hooks=[BundleGuard(tmp_path, RLConfig())])
    bundle = err.value.bundle
    assert bundle and Path(bundle).exists() and "step 2" in str(err.value)
    recorded, replayed = replay_bundle(bundle)
    assert recorded["loss"] != recorded["loss"]  # the recorded loss is NaN (the batch holds the NaN advantage)
    assert same_stats(recorded, replayed)
    out = subprocess.run([sys.executable, "-m", "agentrl", "replay", bundle], capture_output=True, text=True)
    assert out.returncode == 0 and "identical statistics" in out.stdout


def test_spike_bundle_replays_exactly(rl_base, tok, tmp_path):
    model = copy.deepcopy(rl_base)
    history = train(model, make_tasks("train"), tok, RLConfig(), 7, env=GYM.make(RLConfig()),
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


@pytest.mark.slow
def test_git_bisect_names_the_commit_that_negates_the_advantages(rl_base, tok, tmp_path):
    """A source mutation (not a registry fault): `a = r.mean() - r` in compute_advantages, committed between
    unrelated commits; `git bisect run python -m agentrl check` names that commit (invariant 8 compares the update
    with advantages re-derived from the rewards, so the bug cannot move both sides)."""
    from agentrl.faults.mutations import bisect_demo
    from agentrl.model.checkpoints import save_policy
    save_policy(tmp_path / "base.pt", rl_base, tok.hash)
    res = bisect_demo("advantage_sign", str(tmp_path / "base.pt"), tmp_path / "demo", threads=2)
    assert res["named"] == res["bad"], res["stdout"][-3000:] + res["stderr"][-3000:]


def test_fail_turn_limit_is_the_share_of_failures_that_ran_out_of_turns():
    from agentrl.env.base import EpisodeRecord
    from agentrl.rl.dashboard import behavior_stats
    from agentrl.rl.rollout import OWNER, Trajectory

    def episode(n_policy: int, submitted: bool, passed: bool):
        record = EpisodeRecord("t", "f", "f", turns=1, malformed=0, finished=submitted, passed=passed)
        owner = [OWNER["prompt"]] + [OWNER["policy"]] * n_policy
        return Trajectory(list(range(n_policy + 1)), owner, [0.0] * n_policy, float(submitted and passed), record)

    short_fail, long_fail, passed = episode(10, True, False), episode(42, False, False), episode(13, True, True)
    beh = behavior_stats([short_fail, short_fail, short_fail, long_fail, passed])
    assert beh["fail_turn_limit"] == pytest.approx(1 / 4)
    assert beh["length_fail"] == pytest.approx((3 * 10 + 42) / 4)
    # fewer short failures, same long ones: length_fail rises though no failed episode got longer
    fewer = behavior_stats([short_fail, long_fail, passed, passed, passed])
    assert fewer["fail_turn_limit"] == pytest.approx(1 / 2) and fewer["length_fail"] == pytest.approx(26.0)
    assert math.isnan(behavior_stats([passed])["fail_turn_limit"])


# ---------------------------------------------------------------- independent references and every loss mode

@pytest.fixture(scope="module")
def small_batch(quick_base, tok):
    cfg = RLConfig(group_size=4, tasks_per_step=2, kl_coef=0.1)
    trajs, _ = sample_step(quick_base, GYM.make(cfg), make_tasks("train"), tok, cfg,
                           torch.Generator().manual_seed(0))
    return trajs


def test_references_agree_with_the_correct_trainer(quick_base, tok, small_batch):
    """The references re-derive what the trainer computes: same mask, advantages, log-probs, and the same loss
    gradient (token by token) in every loss mode and KL estimator, with every term of the loss active."""
    from agentrl.rl import references as refs
    from agentrl.rl.invariants import probe_offsets
    from agentrl.rl.objectives import compute_advantages
    from agentrl.rl.trainer import forward_logp, minibatch_loss, prepare_batch
    batch = prepare_batch(small_batch, tok, RLConfig())
    assert torch.equal(refs.policy_token_mask(small_batch, batch["ids"].shape[1]), batch["action_mask"])
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    for estimator in ("grpo", "rloo"):
        for scale in ("none", "group", "batch"):
            assert torch.allclose(refs.group_advantages(rewards, batch["group"], estimator, scale).float(),
                                  compute_advantages(rewards, batch["group"], estimator=estimator, scale=scale),
                                  atol=1e-6), (estimator, scale)
    batch["advantages"] = compute_advantages(rewards, batch["group"])
    with torch.no_grad():
        logp = forward_logp(quick_base, batch["ids"])[0]
    assert torch.allclose(refs.log_probs(quick_base, batch["ids"]).float(), logp, atol=1e-5)
    old, ref = logp + probe_offsets(logp.shape, 3), logp + probe_offsets(logp.shape, 4)
    settings = [{"loss_mode": mode, "kl_kind": kind} for mode in LOSS_MODES for kind in KL_KINDS] + [
        # the research knobs' policy terms (every ratio is away from 1 on the probe inputs)
        {"clip_eps_low": 0.1, "clip_eps_high": 0.28}, {"clip_ratio_c": 1.5}, {"ratio_level": "sequence"},
        {"ratio_level": "sequence", "loss_mode": "seq_mean_token_mean"}]
    for setting in settings:
        cfg = RLConfig(kl_coef=0.1, entropy_coef=0.1, **setting)
        grads = []
        for loss_fn in (lambda m, cfg=cfg: minibatch_loss(m, batch, old, ref, cfg)[0],
                        lambda m, cfg=cfg: refs.minibatch_loss(m, batch, old, ref, cfg)):
            m = copy.deepcopy(quick_base)
            loss_fn(m).backward()
            grads.append(torch.cat([p.grad.flatten() for p in m.parameters()]).double())
        assert float((grads[0] - grads[1]).norm() / grads[1].norm()) < 1e-5, setting


def test_padding_and_gradient_checks_hold_in_every_loss_mode(quick_base, tok, small_batch):
    """Invariants 5 and 6 (the two that read the loss mode and KL estimator) pass in every loss mode and with every
    KL estimator, with seq_mean_token_sum_norm's constant normaliser; its old normaliser (rows x padded width) moved
    with padding. (Every full combination: the slow test below.)"""
    from agentrl.rl.invariants import check_gradient, check_padding, passes
    from agentrl.rl.objectives import aggregate_loss
    from agentrl.rl.trainer import mb_view, minibatch_slices, prepare_batch
    for mode, kind in [(m, "k3") for m in LOSS_MODES] + [("token_mean", k) for k in KL_KINDS if k != "k3"]:
        cfg = RLConfig(group_size=4, tasks_per_step=2, loss_mode=mode, kl_kind=kind, kl_coef=0.1)
        batch = prepare_batch(small_batch, tok, cfg)
        pad = check_padding(quick_base, small_batch, tok, cfg, SEAMS, batch,
                            lambda w=None, cfg=cfg: prepare_batch(small_batch, tok, cfg, SEAMS, w))
        grad = check_gradient(quick_base, mb_view(batch, minibatch_slices(8, 2)[0]), cfg, SEAMS)
        assert passes("padding_invariance", pad["padding_invariance"]), (mode, kind, pad)
        assert passes("accumulation", grad["accumulation"]), (mode, kind, grad)
    per_token, mask = torch.ones(2, 3), torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    wider = (torch.cat([per_token, torch.ones(2, 4)], 1), torch.cat([mask, torch.zeros(2, 4)], 1))
    mode = "seq_mean_token_sum_norm"
    assert float(aggregate_loss(per_token, mask, mode, 16)) == float(aggregate_loss(*wider, mode, 16)) == 3 / 32
    assert float(aggregate_loss(per_token, mask, mode)) != float(aggregate_loss(*wider, mode))


def _enumerated_rl_knobs():
    """Every RLConfig knob with a finite set of values (allowed strings, booleans), each non-default value."""
    from dataclasses import fields
    out = []
    for f in fields(RLConfig):
        spec = f.metadata.get("spec")
        if spec is None:
            continue
        values = (spec.allowed() or ()) if spec.kind is str else (True, False) if spec.kind is bool else ()
        out += [(f.name, v) for v in values if v != f.default]
    return out


# numeric knobs, each at a typical non-default setting (the enumerated ones are picked up by _enumerated_rl_knobs)
NUMERIC = [("clip_eps_high", 0.28, None, None), ("clip_eps_low", 0.1, "clip_eps_high", 0.28),
           ("clip_ratio_c", 3.0, None, None), ("lr_warmup", 5, "lr_schedule", "cosine"),
           ("entropy_coef", 0.01, None, None), ("entropy_target", 0.5, None, None), ("microbatches", 4, None, None),
           ("epochs", 2, None, None), ("curriculum_window", 3, "curriculum", "pass_rate"),
           ("ratio_level", "sequence", "loss_mode", "seq_mean_token_mean"),   # GSPO as its papers run it
           ("p_rename_operands", 1.0, None, None)]
KNOBS = [("loss_mode", m, "kl_kind", k) for m in LOSS_MODES for k in KL_KINDS] + \
        [(name, value, None, None) for name, value in _enumerated_rl_knobs()
         if name not in ("loss_mode", "kl_kind")] + \
        NUMERIC


@pytest.mark.parametrize("knob,value,knob2,value2", KNOBS, ids=[f"{a}={b}" + (f",{c}={d}" if c else "")
                                                              for a, b, c, d in KNOBS])
def test_preflight_passes_for_every_loss_mode_kl_estimator_and_enumerated_knob(rl_base, tok, knob, value, knob2,
                                                                                 value2):
    """Every combination of loss mode and KL estimator, and every other value of every RLConfig knob with a finite
    set of values (research knobs declared as choices or booleans are picked up as they are added). Checked at
    step 3 of 10 after three steps at entropy 0.3, with the config and task weights the loop would use there, so
    a learning-rate schedule, an entropy target and the curriculum are in effect, not at their step-0 values."""
    from agentrl.rl import curriculum, schedule
    cfg = RLConfig(kl_coef=0.1, **{knob: value}, **({knob2: value2} if knob2 else {}))
    tasks = make_tasks("train")
    history = [{"entropy": 0.3, "entropy_coef": 0.0, "task_pass": {tasks[0].name: [8, 8]}}] * 3
    step_cfg = schedule.step_config(cfg, 3, 10, history)
    if knob == "entropy_target":
        assert step_cfg.entropy_coef > 0
    if knob2 == "lr_schedule" or knob == "lr_schedule":
        assert step_cfg.lr < cfg.lr
    batch, _ = sample_step(rl_base, GYM.make(cfg), tasks, tok, step_cfg, torch.Generator().manual_seed(0),
                           weights=curriculum.task_weights(cfg, tasks, history))
    res = sanity_checks(rl_base, batch, tok, step_cfg)
    assert failed_checks(res) == set(), {k: v for k, v in res.items() if not v[1]} | res.errors
