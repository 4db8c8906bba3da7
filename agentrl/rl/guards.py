"""Training guards and replay bundles (outside-in debugging).

`BundleGuard` is a trainer hook: it keeps what is needed to replay the current step (weights, optimizer and
reference state, the prepared batch, the generator state before sampling) and writes it as a bundle when the
update is non-finite (the loop then stops with the bundle's path in the error), when the gradient norm spikes
above `spike_factor` x its running median (the row records the bundle; training goes on), or when a step leaves
the range every healthy run stays in (`LIMITS`, docs/guards.md): with mode "stop" the run ends with a one-line
`Diverged` error naming the signal and the bundle; with mode "record" (the fault catalogue) the row records it and
training goes on. `replay_bundle` re-runs a saved step's update exactly.
"""
from __future__ import annotations

import copy
import statistics
from pathlib import Path

import torch

from agentrl.backends.registry import from_description
from agentrl.core.config import Diverged, RLConfig, UserError
from agentrl.rl.trainer import SEAMS, Hook, NonFiniteError, Seams, TrainState, frozen_copy, make_optimizer, rl_update

BATCH_KEYS = ("ids", "attention_mask", "owner", "action_mask", "sample_logp", "rewards", "group", "advantages")

# Where a step is no longer healthy: each limit is an order of magnitude (or more) beyond the worst step of every
# healthy run measured (the main run, the 12 ablation runs, the catalogue's healthy, kl, public and length-twin
# runs; docs/guards.md has the table). name -> (what the row gives, the limit, the healthy worst).
LIMITS = {
    "approx_kl": ("approx_kl_max, the largest KL(old || new) over the step's minibatches", 0.1, 0.011),
    "clip_frac": ("clip_frac_max, the largest clipped share of the step's minibatches", 0.5, 0.17),
    "malformed_share": ("malformed calls per call (malformed / turns)", 0.6, 0.25),
    "entropy_collapse": ("mean token entropy below 0.05 nats while the batch reward is below 0.5", 0.05, 0.0177),
}


def divergence(row: dict) -> str | None:
    """The first healthy-range limit a dashboard row breaks, as one line, or None."""
    if row.get("approx_kl_max", 0.0) > LIMITS["approx_kl"][1]:
        return f"approx_kl_max {row['approx_kl_max']:.3g} > {LIMITS['approx_kl'][1]} (healthy runs stay below " \
               f"{LIMITS['approx_kl'][2]})"
    if row.get("clip_frac_max", 0.0) > LIMITS["clip_frac"][1]:
        return f"clip_frac_max {row['clip_frac_max']:.3g} > {LIMITS['clip_frac'][1]} (healthy runs stay below " \
               f"{LIMITS['clip_frac'][2]})"
    share = row.get("malformed", 0.0) / max(row.get("turns", 1.0), 1e-9)
    if share > LIMITS["malformed_share"][1]:
        return f"malformed calls {share:.0%} of all calls > {LIMITS['malformed_share'][1]:.0%} (healthy runs stay " \
               f"below {LIMITS['malformed_share'][2]:.0%})"
    if row.get("entropy", 1.0) < LIMITS["entropy_collapse"][1] and row.get("reward", 1.0) < 0.5:
        return f"entropy {row['entropy']:.3g} nats with batch reward {row['reward']:.3g}: collapsed before learning " \
               f"(healthy runs reach entropy < {LIMITS['entropy_collapse'][1]} only with reward >= 0.5)"
    return None


def save_bundle(path, *, step: int, cfg: RLConfig, fault, model_state, optim_state, ref_state, batch: dict,
                stats: dict, generator_state, reason: str, threads: int, model: dict) -> str:
    """model: the policy backend's describe() (its kind and config)."""
    from agentrl.core.writer import write_file
    path = Path(path)
    bundle = {"step": step, "cfg": cfg.to_dict(), "bug": fault, "reason": reason, "threads": threads,
              "backend": model["backend"], "model_config": model["config"], "model_state": model_state,
              "optim_state": optim_state, "ref_state": ref_state, "batch": {k: batch[k] for k in BATCH_KEYS},
              "stats": stats, "generator_state": generator_state}
    write_file(path, lambda tmp: torch.save(bundle, tmp))
    return str(path)


class BundleGuard(Hook):
    """Writes replay bundles under `bundle_dir` (step_NNNN.pt) on a non-finite update, a gradient spike or (mode
    "stop" or "record") a divergence; mode "off" leaves divergence alone."""

    def __init__(self, bundle_dir, cfg: RLConfig, fault: str | None = None, spike_factor: float = 3.0,
                 mode: str = "stop"):
        self.dir = None if bundle_dir is None else Path(bundle_dir)
        self.cfg, self.fault, self.spike_factor, self.mode = cfg, fault, spike_factor, mode
        self.snapshot = None

    def before_step(self, step: int, state: TrainState) -> None:
        if self.dir is None:
            return
        ref = state.ref
        self.snapshot = {"generator_state": state.generator.get_state(),
                         "model_state": copy.deepcopy(state.model.state_dict()),
                         "optim_state": copy.deepcopy(state.optimizer.state_dict()),
                         "ref_state": None if ref is None or ref is state.model else copy.deepcopy(ref.state_dict())}

    def _write(self, step: int, state: TrainState, reason: str, stats: dict) -> str | None:
        if self.dir is None:
            return None
        return save_bundle(self.dir / f"step_{step:04d}.pt", step=step, cfg=state.cfg or self.cfg,
                           fault=self.fault, batch=state.batch, stats=stats, reason=reason,
                           threads=torch.get_num_threads(), model=state.model.describe(), **self.snapshot)

    def on_failure(self, step: int, state: TrainState, exc: NonFiniteError) -> None:
        exc.bundle = self._write(step, state, str(exc), exc.stats)

    def on_row(self, step: int, state: TrainState, row: dict) -> None:
        norms = [h["grad_norm"] for h in state.history if "grad_norm" in h]
        update = state.update
        if self.dir is not None and len(norms) >= 5 and update and \
                update["grad_norm"] > self.spike_factor * statistics.median(norms):
            row["spike_bundle"] = self._write(
                step, state, f"grad_norm {update['grad_norm']:.3g} > {self.spike_factor}x running median", update)
        reason = divergence(row) if self.mode != "off" else None
        if reason is None:
            return
        bundle = row.get("spike_bundle") or self._write(step, state, reason, update or {})
        if self.mode == "record":
            row["diverged"] = reason
            return
        raise Diverged(f"step {step}: training diverged: {reason}; stopped (replay bundle: {bundle})")


BUNDLE_KEYS = ("threads", "cfg", "bug", "model_config", "model_state", "optim_state", "ref_state", "batch", "stats")


def read_bundle(path) -> dict:
    """A replay bundle, or one UserError line saying the file is not one."""
    try:
        b = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:
        raise UserError(f"replay {path}: not a replay bundle ({type(exc).__name__}); pass a file a guard wrote "
                        "(data/train/bundles/step_NNNN.pt, data/bundles/<stage>/)") from None
    missing = [k for k in BUNDLE_KEYS if not isinstance(b, dict) or k not in b]
    if missing:
        raise UserError(f"replay {path}: not a replay bundle (no {missing[0]!r}); pass a file a guard wrote")
    return b


def replay_bundle(path, seams_for=lambda fault: SEAMS) -> tuple[dict, dict]:
    """Re-run a saved step's update from its saved state and batch, with the seams of the fault it ran under
    (`seams_for(name)`). Returns (recorded stats, replayed stats)."""
    b = read_bundle(path)
    torch.set_num_threads(int(b["threads"]))
    cfg = RLConfig(**b["cfg"])
    seams: Seams = seams_for(b["bug"])
    model = from_description({"backend": b.get("backend", "tinyagent"), "config": b["model_config"]})
    model.load_state_dict(b["model_state"])
    optimizer = make_optimizer(model, cfg)
    optimizer.load_state_dict(b["optim_state"])
    ref = None
    if b["ref_state"] is not None:
        ref = frozen_copy(model)
        ref.load_state_dict(b["ref_state"])
    elif cfg.kl_coef > 0:
        ref = seams.reference(model)
    try:
        replayed = rl_update(model, optimizer, dict(b["batch"]), cfg, ref, seams)
    except NonFiniteError as exc:
        replayed = exc.stats
    return b["stats"], replayed


def same_stats(a: dict, b: dict) -> bool:
    """Equal statistics, treating NaN as equal to NaN."""
    if set(a) != set(b):
        return False
    return all(x == y or (x != x and y != y) for x, y in ((a[k], b[k]) for k in a))
