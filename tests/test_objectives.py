"""The objective: every formula against exact, hand-computed vectors."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from agentrl.core.config import RLConfig
from agentrl.core.variants import KL_KINDS, LOSS_MODES
from agentrl.model.logprobs import entropy_from_logits, selected_log_probs
from agentrl.rl.objectives import (
    aggregate_loss,
    approx_kl,
    clip_objective,
    compute_advantages,
    entropy_bonus,
    kl_penalty,
    masked_mean,
    policy_loss,
    token_ratio,
)

TOL = 1e-6


def close(x, expected, tol=TOL):
    x = torch.as_tensor(x, dtype=torch.float64)
    expected = torch.as_tensor(expected, dtype=torch.float64)
    assert x.shape == expected.shape, (x.shape, expected.shape)
    assert torch.allclose(x, expected, atol=tol, rtol=0), f"{x.tolist()} != {expected.tolist()}"


# ---------------------------------------------------------------- group advantages

def test_advantages_std_scaled():
    adv = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), std_scale=True, eps=1e-6)
    close(adv, [0.8660239, -0.8660239, -0.8660239, 0.8660239])


def test_advantages_without_std_scaling():
    adv = compute_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]), torch.tensor([0, 0, 0, 0]), std_scale=False)
    close(adv, [0.5, -0.5, -0.5, 0.5])


@pytest.mark.parametrize("std_scale", [True, False])
@pytest.mark.parametrize("value", [0.0, 1.0])
def test_advantages_of_an_all_equal_group_are_zero(std_scale, value):
    adv = compute_advantages(torch.full((8,), value), torch.zeros(8, dtype=torch.long), std_scale=std_scale, eps=1e-6)
    assert not torch.isnan(adv).any()
    close(adv, [0.0] * 8)


def test_two_groups_are_normalised_separately():
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0, 1.0, 1.0, 1.0, 0.0])
    group = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    close(compute_advantages(rewards, group, std_scale=False), [0.5, -0.5, -0.5, 0.5, 0.25, 0.25, 0.25, -0.75])
    # second group: mean 0.75, unbiased std 0.5
    s = 0.5 + 1e-6
    close(compute_advantages(rewards, group, std_scale=True, eps=1e-6),
          [0.8660239, -0.8660239, -0.8660239, 0.8660239, 0.25 / s, 0.25 / s, 0.25 / s, -0.75 / s])
    # an all-equal group next to an informative one
    adv = compute_advantages(torch.tensor([1.0, 1.0, 0.0, 1.0]), torch.tensor([0, 0, 1, 1]), std_scale=True)
    assert not torch.isnan(adv).any()
    close(adv[:2], [0.0, 0.0])
    assert adv[2] < 0 < adv[3]


# ---------------------------------------------------------------- loss aggregation

L = torch.tensor([[1.0, 2.0, 3.0], [4.0, 0.0, 0.0]])
M = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])


@pytest.mark.parametrize("mode,expected", [("token_mean", 2.5), ("seq_mean_token_sum", 5.0),
                                           ("seq_mean_token_mean", 3.0), ("seq_mean_token_sum_norm", 10 / 6)])
def test_aggregate_loss_modes(mode, expected):
    assert float(aggregate_loss(L, M, mode)) == pytest.approx(expected, abs=TOL)


def test_aggregate_loss_ignores_masked_values():
    junk = L.clone()
    junk[1, 1:] = 1e6
    for mode in LOSS_MODES:
        assert float(aggregate_loss(junk, M, mode)) == pytest.approx(float(aggregate_loss(L, M, mode)), abs=TOL)


def test_aggregate_loss_unknown_mode_names_field_and_allowed_values():
    with pytest.raises(ValueError) as exc:
        aggregate_loss(L, M, "seq_sum")
    msg = str(exc.value)
    assert "loss_mode" in msg and "seq_sum" in msg
    for mode in LOSS_MODES:
        assert mode in msg


# ---------------------------------------------------------------- clipped surrogate, approx KL, policy_loss

RATIOS = torch.tensor([1.5, 0.5, 4.0, 1.0])
ADV = torch.tensor([1.0, -1.0, -1.0, 1.0])


def test_clipped_surrogate_exact():
    logp = torch.log(RATIOS)
    old = torch.zeros(4)
    ratio = token_ratio(logp, old, torch.ones(4))
    per_token = clip_objective(ratio, ADV, 0.2, 0.2)
    close(per_token, [-1.2, 0.8, 4.0, -1.0])
    close(ratio, RATIOS)


def test_approx_kl_k3_exact():
    logp = torch.log(RATIOS)
    assert float(approx_kl(logp, torch.zeros(4), torch.ones(4))) == pytest.approx(0.4753469, abs=TOL)
    # masked tokens do not count
    mask = torch.tensor([1.0, 1.0, 0.0, 1.0])
    expected = ((1.5 - 1 - math.log(1.5)) + (0.5 - 1 - math.log(0.5))) / 3
    assert float(approx_kl(logp, torch.zeros(4), mask)) == pytest.approx(expected, abs=TOL)


def test_policy_loss_stats_exact():
    logp = torch.log(RATIOS)[None]
    old = torch.zeros(1, 4)
    mask = torch.ones(1, 4)
    loss, stats = policy_loss(logp, old, ADV[None], mask, RLConfig(clip_eps=0.2, loss_mode="token_mean"))
    assert float(loss) == pytest.approx((-1.2 + 0.8 + 4.0 - 1.0) / 4, abs=TOL)
    assert stats["ratio_max"] == pytest.approx(4.0, abs=TOL)
    assert stats["ratio_min"] == pytest.approx(0.5, abs=TOL)
    assert stats["clip_frac"] == pytest.approx(0.75, abs=TOL)
    assert stats["approx_kl"] == pytest.approx(0.4753469, abs=TOL)


def test_policy_loss_stats_only_count_policy_tokens():
    logp = torch.log(torch.tensor([[1.5, 0.5, 4.0, 1.0, 9.0, 0.01]]))
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0, 0.0]])
    adv = torch.tensor([[1.0, -1.0, -1.0, 1.0, 5.0, 5.0]])
    loss, stats = policy_loss(logp, torch.zeros_like(logp), adv, mask, RLConfig())
    assert float(loss) == pytest.approx(0.65, abs=TOL)
    assert stats["ratio_max"] == pytest.approx(4.0, abs=TOL)
    assert stats["ratio_min"] == pytest.approx(0.5, abs=TOL)
    assert stats["clip_frac"] == pytest.approx(0.75, abs=TOL)
    assert stats["approx_kl"] == pytest.approx(0.4753469, abs=TOL)


def test_policy_loss_broadcasts_row_advantages_and_has_the_right_gradient():
    logp = torch.zeros(2, 3, requires_grad=True)
    mask = torch.tensor([[1.0, 1.0, 0.0], [1.0, 0.0, 0.0]])
    loss, _ = policy_loss(logp, torch.zeros(2, 3), torch.tensor([1.0, -2.0]), mask, RLConfig())
    loss.backward()
    # at ratio 1 the surrogate's gradient is -A / n_tokens on policy tokens, 0 elsewhere
    close(logp.grad, [[-1 / 3, -1 / 3, 0.0], [2 / 3, 0.0, 0.0]])


# ---------------------------------------------------------------- KL, entropy, log-probs, masked mean

@pytest.mark.parametrize("kind,expected", [("k1", 0.6931472), ("k2", 0.2402265), ("k3", 0.1931472)])
def test_kl_estimators_exact(kind, expected):
    kl = kl_penalty(torch.zeros(1), torch.tensor([math.log(0.5)]), kind)
    assert float(kl) == pytest.approx(expected, abs=TOL)


def test_kl_estimators_vanish_when_policies_agree_and_k2_k3_are_nonnegative():
    logp = torch.linspace(-3, 0, 7)
    for kind in KL_KINDS:
        close(kl_penalty(logp, logp.clone(), kind), [0.0] * 7)
    ref = torch.linspace(-0.5, -2.5, 7)
    for kind in ("k2", "k3"):
        assert (kl_penalty(logp, ref, kind) >= 0).all()


def test_kl_unknown_kind():
    with pytest.raises(ValueError) as exc:
        kl_penalty(torch.zeros(1), torch.zeros(1), "k4")
    assert "kl_kind" in str(exc.value)
    for kind in KL_KINDS:
        assert kind in str(exc.value)


def test_entropy_exact():
    ent = entropy_from_logits(torch.tensor([0.0, math.log(3.0)]))
    assert float(ent) == pytest.approx(0.5623351, abs=TOL)
    uniform = entropy_from_logits(torch.zeros(2, 5, 10))
    close(uniform, torch.full((2, 5), math.log(10)))
    assert float(entropy_from_logits(torch.tensor([0.0, -1e4]))) == pytest.approx(0.0, abs=TOL)


def test_selected_log_probs_by_hand():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 3, 5, generator=gen)
    targets = torch.tensor([[0, 4, 2], [1, 1, 3]])
    got = selected_log_probs(logits, targets)
    assert got.shape == (2, 3)
    for b in range(2):
        for i in range(3):
            row = logits[b, i]
            by_hand = row[targets[b, i]] - torch.log(torch.exp(row).sum())
            assert float(got[b, i]) == pytest.approx(float(by_hand), abs=TOL)
            assert float(got[b, i]) == pytest.approx(float(F.log_softmax(row, -1)[targets[b, i]]), abs=TOL)


def test_masked_mean():
    x = torch.tensor([[1.0, 2.0], [3.0, 100.0]])
    assert float(masked_mean(x, torch.tensor([[1.0, 1.0], [1.0, 0.0]]))) == pytest.approx(2.0, abs=TOL)
    empty = masked_mean(x, torch.zeros(2, 2))
    assert not torch.isnan(empty)
    assert float(empty) == 0.0


# ---------------------------------------------------------------- entropy bonus sign

def test_entropy_bonus_sign():
    mask = torch.ones(1, 3)
    low = torch.tensor([[0.1, 0.2, 0.3]])
    high = torch.tensor([[1.1, 1.2, 1.3]])
    assert float(entropy_bonus(high, mask, 0.01)) < float(entropy_bonus(low, mask, 0.01))
    assert float(entropy_bonus(high, mask, 0.01)) == pytest.approx(-0.01 * 1.2, abs=TOL)
    # gradient descent on the loss must raise the entropy of an actual distribution
    logits = torch.tensor([[[2.0, 0.0, -1.0]]], requires_grad=True)
    before = float(entropy_from_logits(logits.detach()).sum())
    loss = entropy_bonus(entropy_from_logits(logits), torch.ones(1, 1), 0.5)
    loss.backward()
    with torch.no_grad():
        after = float(entropy_from_logits(logits - 0.1 * logits.grad).sum())
    assert after > before
    assert float(entropy_bonus(high, mask, 0.0)) == 0.0
