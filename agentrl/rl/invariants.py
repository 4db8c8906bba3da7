"""The nine trainer invariants (SPEC §6), checked on one step-0 batch before any real training step.

`sanity_checks(model, trajs, tok, cfg, seams)` -> {check: (value, passed)}. The model is not modified: updates
run on copies, with at least 2 minibatches (so invariant 7 can see a second pass) and a KL reference with
kl_coef >= 0.1 (so invariant 9 has teeth). `seams` is the trainer under test: the correct one by default, or a
fault's (agentrl.faults.registry) to show that the checks catch it.
"""
from __future__ import annotations

import copy
from dataclasses import replace

import torch

from agentrl.config import RLConfig
from agentrl.rl.objectives import compute_advantages
from agentrl.rl.rollout import OWNER
from agentrl.rl.trainer import (SEAMS, Seams, accumulate_backward, forward_logp, kl_to_ref, make_optimizer, mb_view,
                                minibatch_loss, minibatch_slices, pre_update_pass, prepare_batch, rl_update)

CHECKS = ("mask_is_policy", "sampler_trainer_gap", "ratio_is_one", "group_adv_mean", "padding_invariance",
          "accumulation", "old_logp_frozen", "update_direction", "kl_to_reference")
# (relation, threshold) each check's value must satisfy to pass
THRESHOLDS = {"mask_is_policy": ("==", 0), "sampler_trainer_gap": ("<", 1e-4), "ratio_is_one": ("<", 1e-4),
              "group_adv_mean": ("<", 1e-5), "padding_invariance": ("<", 1e-5), "accumulation": ("<", 1e-4),
              "old_logp_frozen": (">", 0.0), "update_direction": (">", 0.0), "kl_to_reference": (">", 0.0)}


def passes(check: str, value) -> bool:
    relation, threshold = THRESHOLDS[check]
    value = float(value)
    return {"==": value == threshold, "<": value < threshold, ">": value > threshold}[relation]


def failed_checks(results: dict) -> set[int]:
    """1-based numbers of the failed invariants."""
    return {i + 1 for i, name in enumerate(CHECKS) if not results[name][1]}


@torch.no_grad()
def _logp(model, batch, temperature: float = 1.0):
    logits = model(batch["ids"])[:, :-1] / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in model.parameters()])


def sanity_checks(model, trajs: list, tok, cfg: RLConfig, seams: Seams = SEAMS) -> dict:
    """The nine invariants on one step-0 batch -> {check: (value, passed)}."""
    cfg = replace(cfg, minibatches=max(2, cfg.minibatches), kl_coef=max(cfg.kl_coef, 0.1))
    sampler_temp = seams.sampler_temperature(cfg)
    results = {}

    def prepared(width=None):
        b = prepare_batch(trajs, tok, cfg, seams, width)
        if sampler_temp != cfg.temperature:  # what a sampler at that temperature would have recorded
            b["sample_logp"] = _logp(model, b, sampler_temp) * b["action_mask"]
        return b

    batch = prepared()
    mask = batch["action_mask"]

    # 1. the mask marks exactly the policy's tokens (compared with owner, not with the mask itself)
    truth = torch.zeros_like(mask)
    for i, t in enumerate(trajs):
        truth[i, :len(t.owner) - 1] = torch.tensor([float(o == OWNER["policy"]) for o in t.owner[1:]])
    results["mask_is_policy"] = int((truth != mask).sum())

    # 2. sampler and trainer agree on the log-prob of every trained token
    trainer = _logp(model, batch)
    results["sampler_trainer_gap"] = float(((trainer - batch["sample_logp"]).abs() * mask).max())

    # 3. the ratio is exactly 1 before any step (old log-probs as the update gets them)
    mbs = [mb_view(batch, sl) for sl in minibatch_slices(batch["ids"].shape[0], cfg.minibatches)]
    old = seams.old_log_probs(mbs, pre_update_pass(model, mbs)[0])
    with torch.no_grad():
        new0, _ = forward_logp(model, mbs[0]["ids"])
        on = mbs[0]["action_mask"] > 0
        results["ratio_is_one"] = float((torch.exp(new0 - old[0])[on] - 1).abs().max())

    # 4. group advantages have mean 0
    adv = batch["advantages"]
    results["group_adv_mean"] = max(float(adv[batch["group"] == g].mean().abs()) for g in torch.unique(batch["group"]))

    # 5. the loss does not change when the batch is padded further to the right
    def loss_of(b):
        with torch.no_grad():
            o = seams.old_log_probs([b], [forward_logp(model, b["ids"])[0]])[0]
            return float(minibatch_loss(model, b, o, None, replace(cfg, kl_coef=0.0))[0])
    wide = prepared(width=batch["ids"].shape[1] + 7)
    results["padding_invariance"] = abs(loss_of(batch) - loss_of(wide))

    # 6. gradient accumulated over microbatches equals the one-pass gradient
    m1 = copy.deepcopy(model)
    loss, _ = minibatch_loss(m1, mbs[0], old[0], None, replace(cfg, kl_coef=0.0))
    loss.backward()
    g_one = _grads(m1)
    m2 = copy.deepcopy(model)
    (seams.backward or accumulate_backward)(m2, mbs[0], old[0], None, replace(cfg, kl_coef=0.0, microbatches=4))
    g_acc = _grads(m2)
    results["accumulation"] = float((g_one - g_acc).norm() / g_one.norm().clamp(min=1e-12))

    # 7-9. one real update on a copy
    live = copy.deepcopy(model)
    ref = seams.reference(live)
    before = _logp(live, batch)
    stats = rl_update(live, make_optimizer(live, cfg), batch, cfg, ref, seams)
    results["old_logp_frozen"] = stats["approx_kl_max"]
    after = _logp(live, batch)
    true_adv = compute_advantages(batch["rewards"], batch["group"], cfg.adv_std_scale)
    delta = ((after - before) * truth).sum(1) / truth.sum(1).clamp(min=1)
    results["update_direction"] = float(torch.corrcoef(torch.stack([delta, true_adv]))[0, 1]) \
        if true_adv.abs().sum() > 0 else float("nan")
    results["kl_to_reference"] = kl_to_ref(live, ref, batch, cfg)
    return {name: (value, passes(name, value)) for name, value in results.items()}
