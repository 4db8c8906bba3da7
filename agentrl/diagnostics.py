"""The debugging chapter: the dashboard row, fault injection, the nine invariants, training guards, replay.

`train_logged` is the instrumented trainer. With bug=None it performs exactly the floating-point work of
`trainer.train_rl` (a test asserts bit-identical parameters and statistics) and adds: the full dashboard
row per step, optional held-out evaluation with its own generator, the bug switches below, and guards
that stop on a non-finite loss or gradient (and flag gradient spikes) after saving a replay bundle.
"""
from __future__ import annotations

import copy
import statistics
from dataclasses import replace
from pathlib import Path

import torch

from agentrl.evaluation import behavior_stats, evaluate
from agentrl.objectives import compute_advantages
from agentrl.policy import ModelConfig, TinyAgent
from agentrl.rollout import OWNER, collate, sample_step
from agentrl.trainer import make_ref as trainer_make_ref
from agentrl.trainer import (RLConfig, accumulate_backward, env_factory_for, forward_logp, kl_to_ref, make_optimizer,
                             mb_view, minibatch_loss, minibatch_slices, pre_update_pass, ref_log_probs,
                             summarize_minibatches,
                             zero_adv_share)

BUGS = {
    "mask_shift": "action mask aligned to ids instead of ids[1:]",
    "stale_old_logp": "old log-probs recomputed from the current weights before every minibatch",
    "entropy_sign": "entropy bonus with the wrong sign (coef 0.3): entropy is minimised",
    "sign_flip": "advantages negated",
    "accum_local": "minibatch split into 4 length-sorted microbatches, each token-meaned and divided by 4",
    "sampler_temp": "sampler at T=0.7, its log-probs used as old log-probs, trainer at T=1",
    "ref_is_policy": "the KL reference is the live policy object",
}
SAMPLER_TEMP = 0.7
WRONG_ENTROPY_COEF = -0.3

METRIC_GROUPS = {
    "outcome": ["reward", "pass_rate", "eval_pass"],
    "behaviour": ["reads", "tests", "edits", "turns", "malformed", "submitted", "hardcode", "length_pass", "length_fail",
                  "fail_turn_limit"],
    "optimizer": ["entropy", "approx_kl", "approx_kl_max", "clip_frac", "clip_frac_max", "ratio_max", "ratio_min",
                  "grad_norm", "grad_norm_max", "kl_ref", "zero_adv_frac", "all_pass_frac", "all_fail_frac"],
    "consistency": ["logp_gap", "logp_gap_max"],
}
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


EXPECTED_FAILURES = {None: set(), "mask_shift": {1, 2, 5}, "stale_old_logp": {7}, "entropy_sign": set(),
                     "sign_flip": {8}, "accum_local": {6}, "sampler_temp": {2, 3}, "ref_is_policy": {9}}


def check_bug(bug: str | None) -> None:
    if bug is not None and bug not in BUGS:
        raise ValueError(f"bug: unknown value {bug!r}; allowed: {', '.join(BUGS)}")


class NonFiniteError(RuntimeError):
    """A non-finite loss or gradient; carries the statistics up to the failure and the bundle path."""

    def __init__(self, message: str, stats: dict, bundle: str | None = None):
        super().__init__(message)
        self.stats, self.bundle = stats, bundle


# ---------------------------------------------------------------- the dashboard row

def log_metrics(sampled: list, cfg: RLConfig, update: dict) -> dict:
    """One flat dashboard row: outcome, behaviour, optimizer and consistency groups (see METRIC_GROUPS)."""
    beh = behavior_stats(sampled)
    groups: dict[int, list[float]] = {}
    for t in sampled:
        groups.setdefault(t.group, []).append(t.reward)
    n_groups = max(len(groups), 1)
    row = {"reward": sum(t.reward for t in sampled) / len(sampled), "pass_rate": beh["hidden_pass"]}
    row.update({k: beh[k] for k in METRIC_GROUPS["behaviour"]})
    row["zero_adv_frac"] = zero_adv_share(sampled)
    row["all_pass_frac"] = sum(all(r > 0 for r in rs) for rs in groups.values()) / n_groups
    row["all_fail_frac"] = sum(all(r <= 0 for r in rs) for rs in groups.values()) / n_groups
    row.update(update)
    return row


def batch_hash(trajs: list) -> str:
    """Identity of a sampled batch (token ids of every episode), to find where two runs first diverge."""
    import hashlib
    h = hashlib.sha256()
    for t in trajs:
        h.update(repr(t.ids).encode())
    return h.hexdigest()[:16]


# ---------------------------------------------------------------- fault injection points

def prepare_batch(trajs: list, tok, cfg: RLConfig, bug: str | None = None, width: int | None = None) -> dict:
    """Collate + group advantages, with the batch-level faults (mask_shift, sign_flip)."""
    batch = collate(trajs, tok.pad_id, width)
    if bug == "mask_shift":
        batch["action_mask"] = (batch["owner"][:, :-1] == OWNER["policy"]).float()
    batch["advantages"] = compute_advantages(batch["rewards"], batch["group"], cfg.adv_std_scale)
    if bug == "sign_flip":
        batch["advantages"] = -batch["advantages"]
    return batch


def make_ref(model, bug: str | None = None):
    """The KL reference: a frozen copy of the policy (ref_is_policy: the live policy object itself)."""
    return model if bug == "ref_is_policy" else trainer_make_ref(model)


def minibatch_backward(model, mb: dict, old_logp, ref_logp, cfg: RLConfig, bug: str | None = None):
    """Backward of one minibatch; accum_local splits it into 4 length-sorted microbatches each reduced by
    its own token mean and divided by 4 (wrong unless every microbatch has the same number of tokens)."""
    if bug != "accum_local":
        return accumulate_backward(model, mb, old_logp, ref_logp, cfg)
    order = torch.argsort(mb["attention_mask"].sum(1), stable=True)
    pieces = [order[k * len(order) // 4:(k + 1) * len(order) // 4] for k in range(4)]
    total, stats = 0.0, []
    for idx in pieces:
        if idx.numel() == 0:
            continue
        micro = {k: (v[idx] if torch.is_tensor(v) and v.dim() >= 1 else v) for k, v in mb.items()}
        loss, st = minibatch_loss(model, micro, old_logp[idx], None if ref_logp is None else ref_logp[idx], cfg)
        (loss / 4).backward()
        total += float(loss.detach()) / 4
        stats.append(st)
    return total, {"clip_frac": sum(s["clip_frac"] for s in stats) / len(stats),
                   "approx_kl": sum(s["approx_kl"] for s in stats) / len(stats),
                   "ratio_max": max(s["ratio_max"] for s in stats), "ratio_min": min(s["ratio_min"] for s in stats)}


def debug_update(model, optimizer, batch: dict, cfg: RLConfig, ref=None, bug: str | None = None) -> dict:
    """rl_update with the update-level faults switchable (stale_old_logp, entropy_sign, accum_local,
    sampler_temp) and a guard: raises NonFiniteError on a non-finite loss or gradient norm, before stepping."""
    check_bug(bug)
    mbs = [mb_view(batch, sl) for sl in minibatch_slices(batch["ids"].shape[0], cfg.minibatches)]
    old, stats = pre_update_pass(model, mbs)
    if bug == "sampler_temp":
        old = [mb["sample_logp"] for mb in mbs]
    if bug == "entropy_sign":
        cfg = replace(cfg, entropy_coef=WRONG_ENTROPY_COEF)
    per_mb: list[dict] = []
    for _ in range(cfg.epochs):
        for mb, old_logp in zip(mbs, old):
            ref_logp = ref_log_probs(ref, mb, cfg)
            if bug == "stale_old_logp":
                with torch.no_grad():
                    old_logp = forward_logp(model, mb["ids"])[0]
            optimizer.zero_grad(set_to_none=True)
            loss, st = minibatch_backward(model, mb, old_logp, ref_logp, cfg, bug)
            st["grad_norm"] = float(torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.max_grad_norm))
            st["loss"] = loss
            per_mb.append(st)
            if not (torch.isfinite(torch.tensor(loss)) and torch.isfinite(torch.tensor(st["grad_norm"]))):
                stats.update(summarize_minibatches(per_mb))
                raise NonFiniteError(f"non-finite {'loss' if not torch.isfinite(torch.tensor(loss)) else 'gradient'} "
                                     f"in minibatch {len(per_mb) - 1} (loss={loss}, grad_norm={st['grad_norm']})", stats)
            optimizer.step()
    stats.update(summarize_minibatches(per_mb))
    if ref is not None and cfg.kl_coef > 0:
        stats["kl_ref"] = kl_to_ref(model, ref, batch, cfg)
    return stats


# ---------------------------------------------------------------- replay bundles

BATCH_KEYS = ("ids", "attention_mask", "owner", "action_mask", "sample_logp", "rewards", "group", "advantages")


def save_bundle(path, *, step: int, cfg: RLConfig, bug, model_state, optim_state, ref_state, batch: dict,
                stats: dict, generator_state, reason: str, threads: int, model_cfg: ModelConfig) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "cfg": cfg.to_dict(), "bug": bug, "reason": reason, "threads": threads,
                "model_config": model_cfg.to_dict(), "model_state": model_state, "optim_state": optim_state,
                "ref_state": ref_state, "batch": {k: batch[k] for k in BATCH_KEYS},
                "stats": stats, "generator_state": generator_state}, path)
    return str(path)


def replay_bundle(path) -> tuple[dict, dict]:
    """Re-run a saved step's update from its saved state and batch. Returns (recorded stats, replayed stats)."""
    b = torch.load(path, map_location="cpu", weights_only=True)
    torch.set_num_threads(int(b["threads"]))
    cfg = RLConfig(**b["cfg"])
    model = TinyAgent(ModelConfig(**b["model_config"]))
    model.load_state_dict(b["model_state"])
    optimizer = make_optimizer(model, cfg)
    optimizer.load_state_dict(b["optim_state"])
    ref = None
    if b["bug"] == "ref_is_policy":
        ref = model
    elif b["ref_state"] is not None:
        ref = make_ref(model)
        ref.load_state_dict(b["ref_state"])
    try:
        replayed = debug_update(model, optimizer, dict(b["batch"]), cfg, ref, b["bug"])
    except NonFiniteError as exc:
        replayed = exc.stats
    return b["stats"], replayed


def same_stats(a: dict, b: dict) -> bool:
    """Equal statistics, treating NaN as equal to NaN."""
    if set(a) != set(b):
        return False
    return all(x == y or (x != x and y != y) for x, y in ((a[k], b[k]) for k in a))


# ---------------------------------------------------------------- the instrumented trainer

def train_logged(model, tasks: list, tok, cfg: RLConfig, steps: int, bug: str | None = None,
                 eval_tasks: list | None = None, eval_every: int = 10, eval_per_task: int = 16,
                 eval_seed: int | None = None, generator: torch.Generator | None = None, optimizer=None,
                 ref=None, history: list | None = None, start_step: int = 0, hook=None, progress=None,
                 bundle_dir=None, spike_factor: float = 3.0, inject_nan_step: int | None = None) -> list[dict]:
    """Instrumented GRPO loop (see module doc). Returns the dashboard history, one row per step.
    hook(step, model, optimizer, generator, history) runs at step 0 and after every step, as in train_rl.
    Held-out evaluation (eval_tasks) runs at step 0, every eval_every steps and at the end, each with a fresh
    generator seeded from (eval_seed, step); its pass rate goes into that step's row as eval_pass."""
    check_bug(bug)
    if not isinstance(steps, int) or steps <= 0:
        raise ValueError(f"steps: expected an integer > 0, got {steps!r}")
    generator = generator if generator is not None else torch.Generator().manual_seed(cfg.seed)
    optimizer = optimizer if optimizer is not None else make_optimizer(model, cfg)
    if ref is None and (cfg.kl_coef > 0 or bug == "ref_is_policy"):
        ref = make_ref(model, bug)
    history = history if history is not None else []
    env_factory = env_factory_for(cfg)
    eval_seed = 10_000 + cfg.seed if eval_seed is None else eval_seed
    temperature = SAMPLER_TEMP if bug == "sampler_temp" else cfg.temperature

    def held_out(step: int) -> float | None:
        if not eval_tasks or not (step % eval_every == 0 or step == steps):
            return None
        g = torch.Generator().manual_seed(eval_seed * 1_000 + step)
        return evaluate(model, eval_tasks, tok, eval_per_task, cfg.temperature, g, cfg)["pass_rate"]

    if start_step == 0:
        if hook is not None:
            hook(0, model, optimizer, generator, history)
        first_eval = held_out(0)
    else:
        first_eval = None
    for step in range(start_step, steps):
        gen_state = generator.get_state()
        kept, sampled = sample_step(model, env_factory, tasks, tok, cfg, generator, temperature)
        batch = prepare_batch(kept, tok, cfg, bug)
        if inject_nan_step == step:
            batch["advantages"] = batch["advantages"].clone()
            batch["advantages"][0] = float("nan")
        snapshot = (copy.deepcopy(model.state_dict()), copy.deepcopy(optimizer.state_dict()),
                    None if ref is None or ref is model else copy.deepcopy(ref.state_dict()))

        def bundle(reason: str, stats: dict) -> str | None:
            if bundle_dir is None:
                return None
            return save_bundle(Path(bundle_dir) / f"step_{step:04d}.pt", step=step, cfg=cfg, bug=bug,
                               model_state=snapshot[0], optim_state=snapshot[1], ref_state=snapshot[2],
                               batch=batch, stats=stats, generator_state=gen_state, reason=reason,
                               threads=torch.get_num_threads(), model_cfg=model.cfg)
        try:
            update = debug_update(model, optimizer, batch, cfg, ref, bug) if kept else {}
        except NonFiniteError as exc:
            exc.bundle = bundle(str(exc), exc.stats)
            raise NonFiniteError(f"step {step}: {exc} — stopped; replay bundle: {exc.bundle}", exc.stats, exc.bundle) from None
        row = {"step": step, **log_metrics(sampled, cfg, update), "batch_hash": batch_hash(sampled)}
        norms = [h["grad_norm"] for h in history if "grad_norm" in h]
        if len(norms) >= 5 and update and update["grad_norm"] > spike_factor * statistics.median(norms):
            row["spike_bundle"] = bundle(f"grad_norm {update['grad_norm']:.3g} > {spike_factor}x running median", update)
        if step == start_step and first_eval is not None:
            row["eval_pass_start"] = first_eval
        ev = held_out(step + 1)
        if ev is not None:
            row["eval_pass"] = ev
        history.append(row)
        if progress is not None:
            progress(row)
        if hook is not None:
            hook(step + 1, model, optimizer, generator, history)
    return history


# ---------------------------------------------------------------- the nine invariants

@torch.no_grad()
def _logp(model, batch, temperature: float = 1.0):
    logits = model(batch["ids"])[:, :-1] / temperature
    return torch.log_softmax(logits, dim=-1).gather(-1, batch["ids"][:, 1:, None]).squeeze(-1)


def _grads(model) -> torch.Tensor:
    return torch.cat([p.grad.flatten() if p.grad is not None else torch.zeros(p.numel()) for p in model.parameters()])


def sanity_checks(model, trajs: list, tok, cfg: RLConfig, bug: str | None = None) -> dict:
    """The nine invariants on one step-0 batch -> {check: (value, passed)}. The model is not modified.
    Updates run on copies, with at least 2 minibatches (so invariant 7 can see a second pass) and a KL
    reference with kl_coef >= 0.1 (so invariant 9 has teeth)."""
    check_bug(bug)
    cfg = replace(cfg, minibatches=max(2, cfg.minibatches), kl_coef=max(cfg.kl_coef, 0.1))
    results = {}
    batch = prepare_batch(trajs, tok, cfg, bug)
    if bug == "sampler_temp":  # what a T=0.7 sampler would have recorded for these tokens
        batch["sample_logp"] = _logp(model, batch, SAMPLER_TEMP) * batch["action_mask"]
    mask = batch["action_mask"]

    # 1. the mask marks exactly the policy's tokens (compared with owner, not with the mask itself)
    truth = torch.zeros_like(mask)
    for i, t in enumerate(trajs):
        truth[i, :len(t.owner) - 1] = torch.tensor([float(o == OWNER["policy"]) for o in t.owner[1:]])
    results["mask_is_policy"] = (int((truth != mask).sum()), None)

    # 2. sampler and trainer agree on the log-prob of every trained token
    trainer = _logp(model, batch)
    gap = float(((trainer - batch["sample_logp"]).abs() * mask).max())
    results["sampler_trainer_gap"] = (gap, None)

    # 3. the ratio is exactly 1 before any step (old log-probs as the update gets them)
    mbs = [mb_view(batch, sl) for sl in minibatch_slices(batch["ids"].shape[0], cfg.minibatches)]
    old, _ = pre_update_pass(model, mbs)
    if bug == "sampler_temp":
        old = [mb["sample_logp"] for mb in mbs]
    with torch.no_grad():
        new0, _ = forward_logp(model, mbs[0]["ids"])
        on = mbs[0]["action_mask"] > 0
        ratio_err = float((torch.exp(new0 - old[0])[on] - 1).abs().max())
    results["ratio_is_one"] = (ratio_err, None)

    # 4. group advantages have mean 0
    adv = batch["advantages"]
    gmean = max(float(adv[batch["group"] == g].mean().abs()) for g in torch.unique(batch["group"]))
    results["group_adv_mean"] = (gmean, None)

    # 5. the loss does not change when the batch is padded further to the right
    def loss_of(b):
        with torch.no_grad():
            o = b["sample_logp"] if bug == "sampler_temp" else forward_logp(model, b["ids"])[0]
            return float(minibatch_loss(model, b, o, None, replace(cfg, kl_coef=0.0))[0])
    wide = prepare_batch(trajs, tok, cfg, bug, width=batch["ids"].shape[1] + 7)
    if bug == "sampler_temp":
        wide["sample_logp"] = _logp(model, wide, SAMPLER_TEMP) * wide["action_mask"]
    pad_change = abs(loss_of(batch) - loss_of(wide))
    results["padding_invariance"] = (pad_change, None)

    # 6. gradient accumulated over microbatches equals the one-pass gradient
    m1 = copy.deepcopy(model)
    mb = mbs[0]
    loss, _ = minibatch_loss(m1, mb, old[0], None, replace(cfg, kl_coef=0.0))
    loss.backward()
    g_one = _grads(m1)
    m2 = copy.deepcopy(model)
    minibatch_backward(m2, mb, old[0], None, replace(cfg, kl_coef=0.0, microbatches=4), bug)
    g_acc = _grads(m2)
    rel = float((g_one - g_acc).norm() / g_one.norm().clamp(min=1e-12))
    results["accumulation"] = (rel, None)

    # 7-9. one real update on a copy
    live = copy.deepcopy(model)
    ref = make_ref(live, bug)
    before = _logp(live, batch)
    opt = make_optimizer(live, cfg)
    stats = debug_update(live, opt, batch, cfg, ref, bug)
    results["old_logp_frozen"] = (stats["approx_kl_max"], None)
    after = _logp(live, batch)
    true_adv = compute_advantages(batch["rewards"], batch["group"], cfg.adv_std_scale)
    truth_mask = truth
    delta = ((after - before) * truth_mask).sum(1) / truth_mask.sum(1).clamp(min=1)
    corr = float(torch.corrcoef(torch.stack([delta, true_adv]))[0, 1]) if true_adv.abs().sum() > 0 else float("nan")
    results["update_direction"] = (corr, None)
    kl = kl_to_ref(live, ref, batch, cfg)
    results["kl_to_reference"] = (kl, None)
    return {name: (value, passes(name, value)) for name, (value, _) in results.items()}


def failed_checks(results: dict) -> set[int]:
    """1-based numbers of the failed invariants."""
    return {i + 1 for i, name in enumerate(CHECKS) if not results[name][1]}
