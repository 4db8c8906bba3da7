"""The GRPO trainer learns for real, and reproducibly (issue: policy, rollout and trainer)."""
import copy

import pytest
import torch

from agentrl.core.config import ConfigError, RLConfig
from agentrl.env.gym.spec import GYM
from agentrl.env.tasks import make_tasks
from agentrl.eval.evaluation import action_entropy, evaluate, group_gradient_share
from agentrl.rl.dashboard import behavior_stats
from agentrl.rl.trainer import Hook, train

HELDOUT_SEED = 1234


def heldout_pass(model, tok, cfg, n=16):
    g = torch.Generator().manual_seed(HELDOUT_SEED)
    return evaluate(model, make_tasks("heldout"), tok, n, 1.0, g, cfg, env=GYM.make(cfg, evaluation=True))["pass_rate"]


def mean(rows, key):
    return sum(r[key] for r in rows) / len(rows)


def test_base_policy_statistics(rl_base, tok):
    cfg = RLConfig()
    g = torch.Generator().manual_seed(99)
    train = evaluate(rl_base, make_tasks("train"), tok, 16, 1.0, g, cfg, env=GYM.make(cfg,
                     evaluation=True))["trajs"]       # 320 episodes
    held = evaluate(rl_base, make_tasks("heldout"), tok, 16, 1.0, g, cfg, env=GYM.make(cfg,
                    evaluation=True))["trajs"]      # 160 episodes
    beh = behavior_stats(train)
    stats = {"train_pass": beh["pass_rate"], "heldout_pass": behavior_stats(held)["pass_rate"],
             "reads": beh["reads"], "malformed": beh["malformed"], "hardcode": beh["hardcode"],
             "entropy": action_entropy(rl_base, train, tok), "groups_with_gradient": group_gradient_share(train, 8)}
    print("base statistics:", {k: round(v, 3) for k, v in stats.items()}, f"({rl_base.num_params():,} parameters)")
    assert 0.08 <= stats["train_pass"] <= 0.25
    assert 0.05 <= stats["heldout_pass"] <= 0.30
    assert 0.15 <= stats["reads"] <= 0.5
    assert stats["malformed"] <= 0.2
    assert 0.05 <= stats["hardcode"] <= 0.15
    assert 0.3 <= stats["entropy"] <= 0.8
    assert 0.40 <= stats["groups_with_gradient"] <= 0.85
    assert 150_000 <= rl_base.num_params() <= 200_000


@pytest.fixture(scope="module")
def healthy_run(rl_base, tok):
    """Default config, seed 0, 60 steps; held-out measured after 24 and 60 steps."""
    model, cfg, held = copy.deepcopy(rl_base), RLConfig(), {}

    class HeldOut(Hook):
        def after_step(self, updates, state):
            if updates in (24, 60):
                held[updates] = heldout_pass(state.model, tok, cfg)
    history = train(model, make_tasks("train"), tok, cfg, 60, env=GYM.make(cfg), hooks=[HeldOut()])
    return history, held


def test_healthy_run_learns(healthy_run):
    history, held = healthy_run
    first, last = history[:4], history[20:24]
    print(f"healthy: reward {mean(first, 'reward'):.3f} -> {mean(last, 'reward'):.3f} (24 steps), "
          f"{mean(history[-4:], 'reward'):.3f} (60); held-out {held}; reads {history[23]['reads']:.2f}; "
          f"entropy {history[0]['entropy']:.3f} -> {history[23]['entropy']:.3f}")
    assert mean(last, "reward") - mean(first, "reward") >= 0.3
    assert held[24] >= 0.45
    assert held[60] >= 0.65
    assert history[23]["reads"] >= 0.8
    assert 0.05 < history[23]["entropy"] < history[0]["entropy"]


def test_sampler_matches_trainer_over_a_run(healthy_run):
    history, _ = healthy_run
    gaps = [r["logp_gap"] for r in history[:24]]
    print(f"sampler-trainer log-prob gap over 24 steps: mean {sum(gaps) / len(gaps):.2e}, "
          f"worst token {max(r['logp_gap_max'] for r in history[:24]):.2e}")
    assert sum(gaps) / len(gaps) < 1e-6
    assert max(r["logp_gap_max"] for r in history[:24]) < 1e-5


def test_public_reward_control_hacks(rl_base, tok):
    model, cfg = copy.deepcopy(rl_base), RLConfig(reward="public")
    history = train(model, make_tasks("train"), tok, cfg, 24, env=GYM.make(cfg))
    held = heldout_pass(model, tok, RLConfig())
    print(f"public reward: training reward {mean(history[-4:], 'reward'):.3f}, hardcode at the last step "
          f"{history[-1]['hardcode']:.2f}, held-out hidden pass {held:.3f}")
    assert mean(history[-4:], "reward") >= 0.9
    assert history[-1]["hardcode"] >= 0.8
    assert held <= 0.1


def test_same_seed_same_run_other_seed_differs(rl_base, tok):
    def run(seed):
        model = copy.deepcopy(rl_base)
        return model, train(model, make_tasks("train"), tok, RLConfig(seed=seed), 6, env=GYM.make(RLConfig(seed=seed)))
    (m1, h1), (m2, h2), (m3, h3) = run(0), run(0), run(1)
    assert all(torch.equal(a, b) for a, b in zip(m1.parameters(), m2.parameters()))
    assert h1 == h2
    assert not all(torch.equal(a, b) for a, b in zip(m1.parameters(), m3.parameters()))
    assert h1 != h3


@pytest.mark.parametrize("field,value,fragment", [
    ("group_size", 1, "group_size"), ("lr", -1.0, "lr"), ("loss_mode", "mean", "allowed: token_mean"),
    ("kl_kind", "k4", "allowed: k1, k2, k3"), ("reward", "secret", "allowed: hidden, public"),
    ("epochs", 0, "epochs"), ("adv_std_scale", "yes", "adv_std_scale"), ("temperature", float("nan"), "temperature"),
])
def test_rlconfig_rejects_bad_values(field, value, fragment):
    with pytest.raises(ConfigError) as err:
        RLConfig(**{field: value})
    msg = str(err.value)
    assert fragment in msg and f"RLConfig.{field}" in msg and "\n" not in msg


def test_train_rejects_bad_steps_and_empty_tasks(quick_base, tok):
    with pytest.raises(ConfigError, match="steps"):
        train(quick_base, make_tasks("train"), tok, RLConfig(), 0, env=GYM.make(RLConfig()))
    with pytest.raises(ConfigError, match="tasks"):
        train(quick_base, [], tok, RLConfig(), 1, env=GYM.make(RLConfig()))


def test_an_evaluations_entropy_from_its_sampler_equals_a_second_pass(rl_base, tok):
    """evaluate(token_entropy=True) samples the same episodes (the same ids, rewards, sampler log-probs) and keeps
    each policy token's entropy, whose mean equals action_entropy's second pass over the episodes (the labs' held-out
    entropy, without that pass); without the flag nothing is kept."""
    from agentrl.eval.evaluation import sample_entropy_mean
    cfg = RLConfig()

    def run(flag):
        g = torch.Generator().manual_seed(HELDOUT_SEED)
        return evaluate(rl_base, make_tasks("heldout"), tok, 3, 1.0, g, cfg, env=GYM.make(cfg, evaluation=True),
                        batch_episodes=8, token_entropy=flag)["trajs"]
    plain, kept = run(False), run(True)
    assert [t.ids for t in plain] == [t.ids for t in kept] and [t.reward for t in plain] == [t.reward for t in kept]
    assert [t.sample_logp for t in plain] == [t.sample_logp for t in kept]
    assert all(t.sample_entropy is None for t in plain)
    for t in kept:
        assert len(t.sample_entropy) == len(t.action_mask)
        assert all(e == 0.0 for e, m in zip(t.sample_entropy, t.action_mask) if not m)
    with torch.no_grad():
        second_pass = action_entropy(rl_base, kept, tok)
    assert 0.05 < second_pass and sample_entropy_mean(kept) == pytest.approx(second_pass, rel=1e-5)
