"""The research knobs of rl: (issue #19): DAPO clip-higher, dual clip, GSPO sequence ratios, RLOO, reward scaling,
dynamic sampling, the learning-rate schedule, the entropy target and the curriculum. Every formula against
hand-computed vectors, every registry against its declared values, the defaults bit-identical to the run from
before the knobs existed, the per-step state resumable (every knob through the nine invariants: test_invariants.py)."""
from __future__ import annotations

import copy
import dataclasses
import hashlib
import json
import math
from pathlib import Path

import pytest
import torch

from agentrl.core import config
from agentrl.core.config import ConfigError, RLConfig
from agentrl.env.gym.spec import GYM
from agentrl.env.tasks import make_tasks
from agentrl.rl import curriculum, rollout, schedule
from agentrl.rl.objectives import clip_objective, compute_advantages, dual_clip, policy_loss, sequence_ratio
from agentrl.rl.trainer import make_optimizer, train

REPO = Path(__file__).resolve().parents[1]


def close(x, expected, tol=1e-6):
    x, expected = torch.as_tensor(x, dtype=torch.float64), torch.as_tensor(expected, dtype=torch.float64)
    assert x.shape == expected.shape and torch.allclose(x, expected, atol=tol, rtol=0), (x.tolist(), expected.tolist())


# ---------------------------------------------------------------- hand-computed vectors (the issue's)

def test_rloo_advantages():
    one = torch.zeros(4, dtype=torch.long)
    close(compute_advantages(torch.tensor([1.0, 0, 0, 0]), one, estimator="rloo"), [1, -1 / 3, -1 / 3, -1 / 3])
    close(compute_advantages(torch.tensor([1.0, 1, 0, 0]), one, estimator="rloo"), [2 / 3, 2 / 3, -2 / 3, -2 / 3])
    # per group, and proportional to GRPO's (n / (n - 1)), so mean 0 per group
    r, g = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    close(compute_advantages(r, g, estimator="rloo"), compute_advantages(r, g) * 4 / 3)


def test_clip_higher():
    # (low, high) = (0.2, 0.28): ratio 1.5 with A = +1 is clipped at 1.28; ratio 0.5 with A = -1 at 0.8
    close(clip_objective(torch.tensor([1.5]), torch.tensor([1.0]), 0.2, 0.28), [-1.28])
    close(clip_objective(torch.tensor([0.5]), torch.tensor([-1.0]), 0.2, 0.28), [0.8])
    cfg = RLConfig(clip_eps_high=0.28)
    assert cfg.clip_range == (0.2, 0.28)
    loss, stats = policy_loss(torch.log(torch.tensor([[1.5, 0.5]])), torch.zeros(1, 2), torch.tensor([[1.0, -1.0]]),
                              torch.ones(1, 2), cfg)
    close(loss, (-1.28 + 0.8) / 2)
    assert stats["clip_frac"] == 1.0


def test_dual_clip():
    plain = clip_objective(torch.tensor([5.0]), torch.tensor([-1.0]), 0.2, 0.2)
    close(plain, [5.0])
    close(dual_clip(plain, torch.tensor([-1.0]), 3.0), [3.0])
    close(dual_clip(torch.tensor([-1.2]), torch.tensor([1.0]), 3.0), [-1.2])   # A > 0: untouched
    loss, _ = policy_loss(torch.log(torch.tensor([[5.0]])), torch.zeros(1, 1), torch.tensor([-1.0]), torch.ones(1, 1),
                          RLConfig(clip_ratio_c=3.0))
    close(loss, 3.0)


def test_gspo_sequence_ratio():
    logp = torch.tensor([[0.1, 0.3, 5.0]], requires_grad=True)  # the third position is padding
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    s = sequence_ratio(logp, torch.zeros(1, 3), mask)
    close(s[0, :2], [math.exp(0.2)] * 2)
    assert abs(math.exp(0.2) - 1.2214) < 1e-4
    loss, stats = policy_loss(logp, torch.zeros(1, 3), torch.tensor([1.0]), mask, RLConfig(ratio_level="sequence"))
    close(loss, -1.2)
    assert stats["clip_frac"] == 1.0 and abs(stats["ratio_max"] - math.exp(0.2)) < 1e-6


def test_gspo_gradient_is_the_sequence_objectives():
    """Unclipped, seq_mean_token_mean: d loss / d logp_t = -A s / |y| for every policy token of the row."""
    logp = torch.tensor([[0.02, -0.01, 0.03]], requires_grad=True)
    mask = torch.ones(1, 3)
    cfg = RLConfig(ratio_level="sequence", loss_mode="seq_mean_token_mean")
    policy_loss(logp, torch.zeros(1, 3), torch.tensor([2.0]), mask, cfg)[0].backward()
    s = math.exp(0.04 / 3)
    close(logp.grad, [[-2.0 * s / 3] * 3])


def test_reward_scales():
    r, g = torch.tensor([1.0, 0, 0, 0, 1, 1, 1, 0]), torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    batch_sd = float(r.std(unbiased=True))
    close(compute_advantages(r, g, scale="batch"), compute_advantages(r, g) / (batch_sd + 1e-6))
    close(compute_advantages(r, g, scale="group"), compute_advantages(r, g, std_scale=True))
    assert RLConfig(adv_std_scale=True).reward_scale == "group" and RLConfig().reward_scale == "none"
    assert RLConfig(scale_rewards="batch").reward_scale == "batch"
    with pytest.raises(config.ConfigError, match="scale_rewards"):
        RLConfig(adv_std_scale=True, scale_rewards="batch")


def test_each_knob_allows_exactly_its_registry_names_and_the_invariants_derive_each():
    """One source of truth: a knob's allowed values are the names its variants registered under (no list to keep
    equal), and each objective variant is registered with its independent re-derivation (agentrl.rl.references)."""
    from agentrl.core import variants
    from agentrl.rl import references as refs
    expected = {"adv_estimator": ("grpo", "rloo"), "scale_rewards": ("none", "group", "batch"),
                "ratio_level": ("token", "sequence"), "policy_loss": ("clip",),
                "loss_mode": ("token_mean", "seq_mean_token_mean", "seq_mean_token_sum", "seq_mean_token_sum_norm"),
                "kl_kind": ("k1", "k2", "k3"), "keep": ("all", "informative", "resample"),
                "lr_schedule": ("constant", "linear", "cosine"), "curriculum": ("none", "pass_rate")}
    specs = {f.name: f.metadata["spec"] for f in dataclasses.fields(RLConfig)}
    for key, names in expected.items():
        assert specs[key].allowed() == names, key
    for registry in variants.OBJECTIVE:
        key = registry.field.removeprefix("rl.")
        assert registry.names() == expected[key], key
        for name in registry.names():   # a function of the independent module, not the formula registered with it
            derivation = refs.reference(registry, name)
            assert derivation.__module__ == refs.__name__ and derivation is not registry[name], (key, name)
    with pytest.raises(config.ConfigError, match=r"^RLConfig.kl_kind: unknown value 'k4'; allowed: k1, k2, k3$"):
        RLConfig(kl_kind="k4")
    with pytest.raises(config.ConfigError, match=r"^rl.adv_estimator: unknown value 'ppo'; allowed: grpo, rloo$"):
        compute_advantages(torch.ones(2), torch.zeros(2, dtype=torch.long), estimator="ppo")
    with pytest.raises(config.ConfigError, match=r"^rl.adv_estimator: unknown value 'ppo'; allowed: grpo, rloo$"):
        refs.group_advantages(torch.ones(2), torch.zeros(2), estimator="ppo")   # never silently GRPO


# ---------------------------------------------------------------- schedule, entropy target, curriculum

def test_lr_schedules():
    f = lambda cfg, steps=10: [schedule.lr_factor(cfg, s, steps) for s in range(steps)]
    assert f(RLConfig()) == [1.0] * 10
    assert f(RLConfig(lr_warmup=4))[:5] == [0.25, 0.5, 0.75, 1.0, 1.0]
    close(f(RLConfig(lr_schedule="linear")), [1 - s / 10 for s in range(10)])
    close(f(RLConfig(lr_warmup=2, lr_schedule="cosine"), 6), [0.5, 1.0, 1.0, 0.5 * (1 + math.cos(math.pi / 4)), 0.5,
                                                              0.5 * (1 + math.cos(3 * math.pi / 4))])
    assert all(x > 0 for x in f(RLConfig(lr_schedule="cosine"), 1000))
    cfg = RLConfig()
    assert schedule.step_config(cfg, 3, 10, [{"entropy": 0.1}]) is cfg   # the defaults: the run's own config


def test_entropy_target_coefficient_follows_from_the_history():
    cfg = RLConfig(entropy_target=0.3, entropy_coef_lr=0.5)
    assert schedule.entropy_coef_at(cfg, []) == 0.0
    h = [{"entropy": 0.1, "entropy_coef": 0.0}]
    close(schedule.entropy_coef_at(cfg, h), 0.1)                                        # 0 + 0.5 * (0.3 - 0.1)
    close(schedule.entropy_coef_at(cfg, h + [{"entropy": 0.5, "entropy_coef": 0.05}]), 0.0)   # floored at 0
    assert schedule.entropy_coef_at(cfg, h + [{"entropy_coef": 0.07}]) == 0.07       # nothing trained: unchanged
    assert schedule.step_config(cfg, 1, 10, h).entropy_coef == pytest.approx(0.1)


def test_curriculum_weights_favour_tasks_neither_solved_nor_failed():
    tasks = make_tasks("train")[:3]
    cfg = RLConfig(curriculum="pass_rate", curriculum_window=2)
    history = [{"task_pass": {tasks[0].name: [8, 8]}}, {"task_pass": {tasks[0].name: [8, 8], tasks[1].name: [4, 8]}}]
    w = curriculum.task_weights(cfg, tasks, history)
    close(w, [(17 / 18) * (1 / 18), 0.25, 0.25])   # solved 16/16 -> p 17/18; half -> 0.5; unseen -> 0.5
    assert curriculum.task_weights(RLConfig(), tasks, history) is None
    old = [{"task_pass": {tasks[2].name: [0, 8]}}] + history   # outside the window of 2 steps
    assert curriculum.task_weights(cfg, tasks, old) == w


def test_weighted_task_choice_is_distinct_and_follows_the_weights():
    tasks = make_tasks("train")
    g = torch.Generator().manual_seed(0)
    picks = rollout.choose_weighted_tasks(tasks, 8, [1.0] * 19 + [1e-9], g)
    assert len({t.name for t in picks}) == 8 and tasks[-1] not in picks
    counts = {t.name: 0 for t in tasks}
    for _ in range(300):
        counts[rollout.choose_weighted_tasks(tasks, 1, [10.0] + [1.0] * 19, g)[0].name] += 1
    assert counts[tasks[0].name] > 60   # weight 10 of 29: about a third


def test_family_draw_spreads_a_step_over_the_families():
    tasks = make_tasks("train")   # 5 families x 4 tasks
    families = {t.family for t in tasks}
    g = torch.Generator().manual_seed(0)
    uniform_spread = [len({t.family for t in rollout.choose_tasks(tasks, 5, g)}) for _ in range(200)]
    assert min(uniform_spread) < 5   # a uniform draw of 5 of the 20 misses a family in 93% of draws
    counts = {t.name: 0 for t in tasks}
    for _ in range(200):
        picks = rollout.choose_by_family(tasks, 5, g)
        assert {t.family for t in picks} == families and len({t.name for t in picks}) == 5
        four = rollout.choose_by_family(tasks, 4, g)
        assert len({t.family for t in four}) == 4
        for t in picks:
            counts[t.name] += 1
    assert min(counts.values()) > 25 and max(counts.values()) < 75   # within a family each task ~50 of 200
    whole = rollout.choose_by_family(tasks, 20, g)
    assert sorted(t.name for t in whole) == sorted(t.name for t in tasks)   # distinct until the pool is spent
    assert [len({t.family for t in whole[i:i + 5]}) for i in range(0, 20, 5)] == [5, 5, 5, 5]
    assert len(rollout.choose_by_family(tasks, 23, g)) == 23
    a = rollout.choose_by_family(tasks, 7, torch.Generator().manual_seed(3))
    assert a == rollout.choose_by_family(tasks, 7, torch.Generator().manual_seed(3))


def test_task_draw_is_a_knob_the_step_uses_and_refuses_a_curriculum(quick_base, tok, train_tasks):
    cfg = RLConfig(group_size=2, tasks_per_step=5, task_draw="families")
    _, sampled = rollout.sample_step(quick_base, GYM.make(cfg), make_tasks("train"), tok, cfg,
                                     torch.Generator().manual_seed(1))
    assert len({t.record.family for t in sampled}) == 5
    with pytest.raises(ConfigError, match="RLConfig.task_draw: families .* allowed: uniform"):
        RLConfig(task_draw="families", curriculum="pass_rate")
    with pytest.raises(ConfigError, match="RLConfig.task_draw: unknown value 'strata'; allowed: uniform, families"):
        RLConfig(task_draw="strata")


# ---------------------------------------------------------------- dynamic sampling

def test_resample_keeps_only_informative_groups_and_counts_every_rollout(quick_base, tok, train_tasks):
    cfg = RLConfig(group_size=3, tasks_per_step=2, keep="resample", resample_cap=3)
    kept, sampled = rollout.sample_step(quick_base, GYM.make(cfg), train_tasks, tok, cfg,
                                        torch.Generator().manual_seed(0))
    groups = [t.group for t in sampled]
    assert groups == sorted(groups) and len(sampled) % 3 == 0 and len(sampled) <= 3 * 2 * 3
    by = {}
    for t in sampled:
        by.setdefault(t.group, []).append(t)
    assert all(len(rows) == 3 and len({r.record.task for r in rows}) == 1 for rows in by.values())
    informative = [g for g, rows in by.items() if len({r.reward for r in rows}) > 1]
    assert sorted({t.group for t in kept}) == informative and len(informative) <= 2
    assert len(informative) == 2 or len(by) == 3 * 2   # draws stop at two informative groups, or at the cap


def test_dashboard_counts_rollouts(quick_base, tok, train_tasks):
    cfg = RLConfig(group_size=2, tasks_per_step=2, minibatches=1)
    history = train(copy.deepcopy(quick_base), train_tasks, tok, cfg, 1, env=GYM.make(cfg))
    assert history[0]["rollouts"] == 4 and history[0]["trained"] == 4


# ---------------------------------------------------------------- defaults bit for bit, resume

def _fingerprint(model, history) -> dict:
    h = hashlib.sha256()
    for p in model.parameters():
        h.update(p.detach().numpy().tobytes())
    keys = sorted(set().union(*map(set, history)) - {"rollouts", "trained"})   # the rows' new keys
    rows = [{k: r.get(k) for k in keys} for r in history]
    return {"params_sha256": h.hexdigest(),
            "history_sha256": hashlib.sha256(json.dumps(rows, sort_keys=True).encode()).hexdigest(),
            "batch_hashes": [r["batch_hash"] for r in history]}


@pytest.mark.skipif(torch.get_num_threads() != 2, reason="the fingerprint was taken at 2 threads")
def test_defaults_reproduce_the_run_from_before_the_research_knobs(quick_base, tok, train_tasks):
    before = json.loads((REPO / "tests" / "fixtures" / "default_run_before_research_knobs.json").read_text())
    model = copy.deepcopy(quick_base)
    history = train(model, train_tasks, tok, RLConfig(**before["config"]), before["steps"],
                    env=GYM.make(RLConfig(**before["config"])))
    assert _fingerprint(model, history) == {k: before[k] for k in ("params_sha256", "history_sha256", "batch_hashes")}


def test_per_step_state_survives_a_resume(quick_base, tok, train_tasks):
    """LR schedule, entropy target and curriculum derive from the history: 3 steps straight equal 1 + 2 resumed."""
    cfg = RLConfig(group_size=2, tasks_per_step=2, minibatches=1, lr_warmup=1, lr_schedule="cosine",
                   entropy_target=5.0, entropy_coef_lr=0.01, curriculum="pass_rate", seed=1)
    straight = copy.deepcopy(quick_base)
    h1 = train(straight, train_tasks, tok, cfg, 3, env=GYM.make(cfg))
    assert [r["lr"] for r in h1] == [cfg.lr * schedule.lr_factor(cfg, s, 3) for s in range(3)]
    assert h1[2]["entropy_coef"] > h1[1]["entropy_coef"] > 0 and "task_pass" in h1[0]
    part = copy.deepcopy(quick_base)
    opt, gen = make_optimizer(part, cfg), torch.Generator().manual_seed(cfg.seed)
    h2 = train(part, train_tasks, tok, cfg, 1, env=GYM.make(cfg), optimizer=opt, generator=gen)
    saved = copy.deepcopy({"model": part.state_dict(), "opt": opt.state_dict(), "gen": gen.get_state(), "h": h2})
    resumed = copy.deepcopy(quick_base)
    resumed.load_state_dict(saved["model"])
    opt2 = make_optimizer(resumed, cfg)
    opt2.load_state_dict(saved["opt"])
    gen2 = torch.Generator()
    gen2.set_state(saved["gen"])
    h2 = train(resumed, train_tasks, tok, cfg, 3, env=GYM.make(cfg), optimizer=opt2, generator=gen2,
               history=saved["h"], start_step=1)
    same = json.dumps(h1, sort_keys=True) == json.dumps(h2, sort_keys=True)   # rows hold NaN (length_pass)
    assert same and all(torch.equal(a, b) for a, b in zip(straight.parameters(), resumed.parameters()))


@pytest.mark.parametrize("keep", ["informative", "resample"])
def test_a_step_with_no_informative_group_trains_nothing_and_goes_on(random_model, tok, keep):
    """A random policy fails every episode, so no group has a reward spread: the step samples (up to the resample
    cap), keeps nothing, skips the update and the run continues."""
    model = copy.deepcopy(random_model)
    before = [p.detach().clone() for p in model.parameters()]
    cfg = RLConfig(group_size=2, tasks_per_step=2, keep=keep, resample_cap=2, max_turns=2)
    history = train(model, make_tasks("train")[:4], tok, cfg, 2, env=GYM.make(cfg))
    assert [row["trained"] for row in history] == [0, 0]
    assert all(row["rollouts"] == (4 if keep == "informative" else 8) for row in history)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
