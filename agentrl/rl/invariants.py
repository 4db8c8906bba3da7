"""The nine trainer invariants (docs/preflight.md), checked on one step-0 batch before any real training step.

`sanity_checks(model, trajs, tok, cfg, seams)` -> {check: (value, passed)}. The model is not modified: updates
run on copies, with at least 2 minibatches and 2 epochs (so invariant 7 sees a pass after the weights moved, even
when the first minibatch has no signal) and a KL reference with kl_coef >= 0.1 (so invariant 9 has teeth).
`seams` is the trainer under test: the correct one by default, or a fault's (agentrl.faults.registry) to show
that the checks catch it.

The expected side of every check comes from agentrl.rl.references (the owners, the advantage formula, a fresh
forward, the loss token by token), never from the trainer function being checked, so a bug inside that function
cannot move both sides. Checks 5 and 6 probe the loss with every term switched on: old and reference log-probs
offset from the current ones (ratios inside and outside the clip range, a non-zero KL gradient) and an entropy
coefficient. A check that raises fails with the value NaN; the error is in `results.errors`. The thresholds come
from the margins measured over 20 batches (docs/preflight.md).
"""
from __future__ import annotations

import copy
import math
from dataclasses import replace

import torch

from agentrl.backends.registry import thresholds as backend_thresholds
from agentrl.core.config import RLConfig
from agentrl.rl import references as refs
from agentrl.rl.trainer import (
    SEAMS,
    Seams,
    accumulate_backward,
    forward_logp,
    make_optimizer,
    mb_view,
    minibatch_loss,
    minibatch_slices,
    pre_update_pass,
    prepare_batch,
    rl_update,
)

CHECKS = ("mask_is_policy", "sampler_trainer_gap", "ratio_is_one", "group_adv_mean", "padding_invariance",
          "accumulation", "old_logp_frozen", "update_direction", "kl_to_reference")
# (relation, threshold) each check's value must satisfy to pass; docs/preflight.md has the measurements behind them
THRESHOLDS = {"mask_is_policy": ("==", 0), "sampler_trainer_gap": ("<", 1e-3), "ratio_is_one": ("<", 1e-3),
              "group_adv_mean": ("<", 1e-5), "padding_invariance": ("<", 1e-4), "accumulation": ("<", 1e-4),
              "old_logp_frozen": ("<", 1e-6), "update_direction": (">", 0.0), "kl_to_reference": (">", 1e-6)}
PROBE_SHIFT = 0.5            # probe old/reference log-probs: the current ones + uniform(-0.5, 0.5)
PROBE_ENTROPY_COEF = 0.1     # the entropy term's coefficient in checks 5 and 6 when the run's is 0
PAD_EXTRA = 7                # check 5 pads the batch this many columns further


class Results(dict):
    """{check: (value, passed)}, plus `errors`: {check: message} for checks that raised, and the `thresholds` the
    values were judged by."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.errors: dict[str, str] = {}
        self.thresholds: dict = THRESHOLDS
        self.backend: str | None = None


def thresholds_for(backend: str | None = None) -> dict:
    """{check: (relation, threshold)} for a backend kind: these, with the ones its BackendSpec declares where its
    float32 rounding is measured to need them (docs/preflight.md)."""
    return THRESHOLDS | backend_thresholds(backend)


def passes(check: str, value, backend: str | None = None) -> bool:
    relation, threshold = thresholds_for(backend)[check]
    value = float(value)
    return {"==": value == threshold, "<": value < threshold, ">": value > threshold}[relation]


def margin(check: str, value, backend: str | None = None) -> float | None:
    """How many times the value clears its threshold, on whichever side it is (pass or fail): threshold / value
    or value / threshold, >= 1. None where a factor means nothing: an exact count, a zero, the sign check."""
    relation, threshold = thresholds_for(backend)[check]
    value = float(value)
    if relation == "==" or threshold == 0 or value <= 0 or not math.isfinite(value):
        return None
    return max(value / threshold, threshold / value)


def failed_checks(results: dict) -> set[int]:
    """1-based numbers of the failed invariants."""
    return {i + 1 for i, name in enumerate(CHECKS) if not results[name][1]}


def probe_offsets(shape, salt: int) -> torch.Tensor:
    """A fixed pattern of log-prob offsets in (-PROBE_SHIFT, PROBE_SHIFT), the same for the same shape and salt."""
    g = torch.Generator().manual_seed(salt)
    return ((torch.rand(shape, generator=g, device=g.device) * 2 - 1) * PROBE_SHIFT).to(torch.get_default_device())


def probe_config(cfg: RLConfig) -> RLConfig:
    return replace(cfg, entropy_coef=cfg.entropy_coef or PROBE_ENTROPY_COEF)


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in model.parameters()])


def _masked_max(x: torch.Tensor, mask: torch.Tensor) -> float:
    on = mask > 0
    return float(x[on].max()) if on.any() else 0.0


# ---------------------------------------------------------------- the checks (each returns {check: value})

def check_mask(batch: dict, truth: torch.Tensor) -> dict:
    """1. the mask marks exactly the policy's tokens, as the owners say."""
    return {"mask_is_policy": int((truth != batch["action_mask"]).sum())}


def check_log_probs(model, batch: dict, mbs: list, cfg: RLConfig, seams: Seams) -> dict:
    """2. the trainer's log-probs equal the sampler's on every trained token; 3. the old log-probs the update
    gets equal a fresh forward's, so the ratio is 1 before the first step."""
    recomputed = pre_update_pass(model, mbs, cfg.temperature)[0]
    old = seams.old_log_probs(mbs, recomputed)
    mask = batch["action_mask"]
    gap = (torch.cat([r.detach() for r in recomputed]) - batch["sample_logp"]).abs()
    with torch.no_grad():
        fresh = refs.log_probs(model, batch["ids"], cfg.temperature, mask)
    ratio = refs.exp(fresh - torch.cat([o.detach() for o in old]).double())
    return {"sampler_trainer_gap": _masked_max(gap, mask), "ratio_is_one": _masked_max((ratio - 1).abs(), mask)}


def check_advantages(batch: dict, cfg: RLConfig) -> dict:
    """4. each group's advantages have mean 0 and the formula's magnitudes (their sign is invariant 8's)."""
    adv, group = batch["advantages"], batch["group"]
    expected = refs.group_advantages(batch["rewards"], group, cfg.adv_estimator, cfg.reward_scale)
    mean = max(abs(float(adv[group == g].double().mean())) for g in torch.unique(group))
    return {"group_adv_mean": max(mean, float((adv.double().abs() - expected.abs()).abs().max()))}


def check_padding(model, trajs: list, tok, cfg: RLConfig, seams: Seams, batch: dict, prepared) -> dict:
    """5. the loss of the batch, and of every row alone at its own length, does not change when padded further."""
    pcfg = probe_config(cfg)
    wide = prepared(batch["ids"].shape[1] + PAD_EXTRA)
    with torch.no_grad():
        base = forward_logp(model, wide["ids"], wide["action_mask"] > 0, cfg.temperature)[0]
    old, ref = base + probe_offsets(base.shape, 1), base + probe_offsets(base.shape, 2)

    def loss(b, rows):
        n = b["ids"].shape[1] - 1
        with torch.no_grad():
            return float(minibatch_loss(model, b, old[rows, :n], ref[rows, :n], pcfg)[0])
    everyone = slice(None)
    worst = abs(loss(batch, everyone) - loss(wide, everyone))
    for i, t in enumerate(trajs):
        alone = prepare_batch([t], tok, cfg, seams)
        alone["advantages"] = batch["advantages"][i:i + 1]  # a batch of one has no group to compare with
        worst = max(worst, abs(loss(alone, slice(i, i + 1)) - loss(mb_view(wide, slice(i, i + 1)), slice(i, i + 1))))
    return {"padding_invariance": worst}


def check_gradient(model, mb: dict, cfg: RLConfig, seams: Seams) -> dict:
    """6. the gradient the trainer accumulates over 4 microbatches equals the gradient of the loss computed
    token by token (probe old/reference log-probs and entropy coefficient: every term of the loss active)."""
    pcfg = replace(probe_config(cfg), microbatches=4)
    trainer = copy.deepcopy(model)
    # the old log-probs as the update gets them, from the weights being trained (so a graph they should not carry
    # reaches the gradient as it would in training)
    old = seams.old_log_probs([mb], pre_update_pass(trainer, [mb], cfg.temperature)[0])[0] + \
        probe_offsets(mb["action_mask"].shape, 3)
    with torch.no_grad():
        ref = refs.log_probs(model, mb["ids"], cfg.temperature, mb["action_mask"]).float() + \
            probe_offsets(mb["action_mask"].shape, 4)
    (seams.backward or accumulate_backward)(trainer, mb, old, ref, pcfg)
    expected = copy.deepcopy(model)
    refs.minibatch_loss(expected, mb, old.detach(), ref, pcfg).backward()
    g_trainer, g_ref = _grads(trainer), _grads(expected).float()
    return {"accumulation": float((g_trainer - g_ref).norm() / g_ref.norm().clamp(min=1e-12))}


def check_update(model, batch: dict, truth: torch.Tensor, cfg: RLConfig, seams: Seams) -> dict:
    """7-9. one real update on a copy: 7. every minibatch uses the old log-probs as they were before the first
    optimizer step; 8. rows with higher advantage (by the formula) gain log-prob; 9. the policy moved away from the
    KL reference (exact KL)."""
    initial, used = [], []

    def watched_old(mbs, recomputed):
        out = seams.old_log_probs(mbs, recomputed)
        initial.extend(o.detach().clone() for o in out)
        return out

    def watched_minibatch_old(m, mb, old):
        out = seams.minibatch_old_log_probs(m, mb, old)
        used.append((mb["action_mask"], out.detach().clone()))
        return out
    live = copy.deepcopy(model)
    ref = seams.reference(live)
    with torch.no_grad():
        before = refs.log_probs(live, batch["ids"], cfg.temperature, truth)
    rl_update(live, make_optimizer(live, cfg), batch, cfg, ref,
              replace(seams, old_log_probs=watched_old, minibatch_old_log_probs=watched_minibatch_old))
    frozen = max(_masked_max((u - initial[k % len(initial)]).abs(), m) for k, (m, u) in enumerate(used))
    with torch.no_grad():
        after = refs.log_probs(live, batch["ids"], cfg.temperature, truth)
    adv = refs.group_advantages(batch["rewards"], batch["group"], cfg.adv_estimator, cfg.reward_scale)
    delta = ((after - before) * truth).sum(1) / truth.sum(1).clamp(min=1)
    direction = pearson(delta, adv.double()) if adv.abs().sum() > 0 else float("nan")
    return {"old_logp_frozen": frozen, "update_direction": direction,
            "kl_to_reference": refs.kl_divergence(live, ref, batch["ids"], truth, cfg.temperature)}


def pearson(x: torch.Tensor, y: torch.Tensor) -> float:
    """The correlation coefficient by its definition, in PyTorch's own reductions (torch.corrcoef's product is
    MKL's, whose last bits depend on the CPU)."""
    dx, dy = x - x.mean(), y - y.mean()
    spread = math.sqrt(float((dx * dx).sum() * (dy * dy).sum()))
    return float((dx * dy).sum()) / spread if spread > 0 else float("nan")   # as corrcoef: no spread, no correlation


# ---------------------------------------------------------------- all nine

def sanity_checks(model, trajs: list, tok, cfg: RLConfig, seams: Seams = SEAMS, own_kl_direction: bool = False
                  ) -> Results:
    """The nine invariants on one step-0 batch -> {check: (value, passed)} (Results, with .errors). A variant of
    the objective without an independent re-derivation (agentrl.rl.references) is refused before any check.
    With `own_kl_direction`, invariants 7 and 8 come from an update with the config's own kl_coef and only 9 from
    the one with the KL raised to 0.1: on a policy as certain as a cloned pretrained model, the raised KL term
    stepped by Adam can turn the direction of an update the run never makes (docs/labs.md)."""
    refs.check_derivable(cfg)
    own = replace(cfg, minibatches=max(2, cfg.minibatches), epochs=max(2, cfg.epochs))
    cfg = replace(own, kl_coef=max(cfg.kl_coef, 0.1))
    sampler_temp = seams.sampler_temperature(cfg)

    def prepared(width=None):
        b = prepare_batch(trajs, tok, cfg, seams, width)
        if sampler_temp != cfg.temperature:  # what a sampler at that temperature would have recorded
            with torch.no_grad():
                b["sample_logp"] = refs.log_probs(model, b["ids"], sampler_temp, b["action_mask"]).float() * \
                    b["action_mask"]
        return b

    batch = prepared()
    truth = refs.policy_token_mask(trajs, batch["ids"].shape[1])
    mbs = [mb_view(batch, sl) for sl in minibatch_slices(batch["ids"].shape[0], cfg.minibatches)]
    steps = [(("mask_is_policy",), lambda: check_mask(batch, truth)),
             (("sampler_trainer_gap", "ratio_is_one"), lambda: check_log_probs(model, batch, mbs, cfg, seams)),
             (("group_adv_mean",), lambda: check_advantages(batch, cfg)),
             (("padding_invariance",), lambda: check_padding(model, trajs, tok, cfg, seams, batch, prepared)),
             (("accumulation",), lambda: check_gradient(model, mbs[0], cfg, seams)),
             (("old_logp_frozen", "update_direction", "kl_to_reference"),
              lambda: check_update(model, batch, truth, cfg, seams))]
    if own_kl_direction and own.kl_coef != cfg.kl_coef:
        steps[-1] = (("kl_to_reference",), lambda: {"kl_to_reference": check_update(model, batch, truth, cfg,
                                                                                    seams)["kl_to_reference"]})
        steps.append((("old_logp_frozen", "update_direction"), lambda: {
            k: v for k, v in check_update(model, batch, truth, own, seams).items() if k != "kl_to_reference"}))
    values, errors = {}, {}
    for names, run in steps:
        try:
            values.update(run())
        except Exception as exc:  # a check that cannot run has failed; say why
            values.update({n: float("nan") for n in names})
            errors.update({n: f"{type(exc).__name__}: {exc}".splitlines()[0] for n in names})
    backend = getattr(model, "kind", None)
    results = Results({name: (values[name], passes(name, values[name], backend)) for name in CHECKS})
    results.errors, results.thresholds, results.backend = errors, thresholds_for(backend), backend
    return results
