"""Divergence guards (docs/guards.md): each limit on synthetic rows, no committed healthy run would be stopped, a
run at rl.lr 1e4 is stopped at its first step with one line and a bundle that replays, and the fault catalogue
records where the guard would have stopped each run."""
import copy
import json
from pathlib import Path

import pytest

from agentrl.core.config import Diverged, RLConfig
from agentrl.env.gym.spec import GYM
from agentrl.rl.guards import LIMITS, BundleGuard, divergence, replay_bundle, same_stats

REPO = Path(__file__).resolve().parents[1]
CALM = {"approx_kl_max": 0.005, "clip_frac_max": 0.1, "malformed": 0.1, "turns": 3.0, "entropy": 0.3, "reward": 0.4}


@pytest.mark.parametrize("change,fragment", [
    ({"approx_kl_max": 0.2}, "approx_kl_max"), ({"clip_frac_max": 0.6}, "clip_frac_max"),
    ({"malformed": 2.0, "turns": 3.0}, "malformed calls"), ({"entropy": 0.01, "reward": 0.2}, "collapsed"),
])
def test_each_limit_fires_alone(change, fragment):
    assert divergence(CALM) is None
    reason = divergence(CALM | change)
    assert reason and fragment in reason and "\n" not in reason


def test_a_learned_policy_may_be_nearly_deterministic():
    assert divergence(CALM | {"entropy": 0.01, "reward": 0.97}) is None


def test_limits_sit_well_beyond_the_healthy_worst():
    for name, (_, limit, healthy) in LIMITS.items():
        assert limit >= 2 * healthy, name


def _healthy_histories():
    out = {"main": json.loads((REPO / "reports/train_dashboard.json").read_text())}
    faults = json.loads((REPO / "reports/faults.json").read_text())
    for name in ("healthy", "kl", "public", "length_twin"):
        out[f"faults:{name}"] = faults["runs"][name]["history"]
    return out, faults


def test_no_committed_healthy_run_would_be_stopped():
    histories, _ = _healthy_histories()
    for name, rows in histories.items():
        assert [(r["step"], divergence(r)) for r in rows if divergence(r)] == [], name


def test_the_catalogue_records_where_the_guard_would_stop():
    _, faults = _healthy_histories()
    runs = faults["runs"]
    assert runs["lr_high"]["guard"] is not None and runs["lr_high"]["guard"]["step"] == 0
    for name in ("healthy", "kl", "public", "length_twin"):
        assert runs[name]["guard"] is None, name


def test_a_huge_learning_rate_is_stopped_at_step_0_with_a_replayable_bundle(rl_base, tok, tmp_path):
    from agentrl.env.tasks import make_tasks
    from agentrl.rl.trainer import train
    cfg = RLConfig(lr=1e4)
    with pytest.raises(Diverged) as err:
        train(copy.deepcopy(rl_base), make_tasks("train"), tok, cfg, 3, env=GYM.make(cfg),
              hooks=[BundleGuard(tmp_path, cfg)])
    msg = str(err.value)
    assert msg.startswith("step 0: training diverged: approx_kl_max") and "\n" not in msg
    bundle = msg.rsplit("replay bundle: ", 1)[1].rstrip(")")
    recorded, replayed = replay_bundle(bundle)
    assert same_stats(recorded, replayed) and recorded["approx_kl_max"] > LIMITS["approx_kl"][1]
