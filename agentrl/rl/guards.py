"""Training guards and replay bundles (outside-in debugging).

`BundleGuard` is a trainer hook: it keeps what is needed to replay the current step (weights, optimizer and
reference state, the prepared batch, the generator state before sampling) and writes it as a bundle when the
update is non-finite (the loop then stops with the bundle's path in the error) or when the gradient norm spikes
above `spike_factor` x its running median (the row records the bundle; training goes on). `replay_bundle`
re-runs a saved step's update exactly.
"""
from __future__ import annotations

import copy
import statistics
from pathlib import Path

import torch

from agentrl.config import RLConfig
from agentrl.model.policy import ModelConfig, TinyAgent
from agentrl.rl.trainer import SEAMS, Hook, NonFiniteError, Seams, TrainState, frozen_copy, make_optimizer, rl_update

BATCH_KEYS = ("ids", "attention_mask", "owner", "action_mask", "sample_logp", "rewards", "group", "advantages")


def save_bundle(path, *, step: int, cfg: RLConfig, fault, model_state, optim_state, ref_state, batch: dict,
                stats: dict, generator_state, reason: str, threads: int, model_cfg: ModelConfig) -> str:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    torch.save({"step": step, "cfg": cfg.to_dict(), "bug": fault, "reason": reason, "threads": threads,
                "model_config": model_cfg.to_dict(), "model_state": model_state, "optim_state": optim_state,
                "ref_state": ref_state, "batch": {k: batch[k] for k in BATCH_KEYS},
                "stats": stats, "generator_state": generator_state}, path)
    return str(path)


class BundleGuard(Hook):
    """Writes replay bundles under `bundle_dir` (step_NNNN.pt) on a non-finite update or a gradient spike."""

    def __init__(self, bundle_dir, cfg: RLConfig, fault: str | None = None, spike_factor: float = 3.0):
        self.dir, self.cfg, self.fault, self.spike_factor = Path(bundle_dir), cfg, fault, spike_factor
        self.snapshot = None

    def before_step(self, step: int, state: TrainState) -> None:
        ref = state.ref
        self.snapshot = {"generator_state": state.generator.get_state(),
                         "model_state": copy.deepcopy(state.model.state_dict()),
                         "optim_state": copy.deepcopy(state.optimizer.state_dict()),
                         "ref_state": None if ref is None or ref is state.model else copy.deepcopy(ref.state_dict())}

    def _write(self, step: int, state: TrainState, reason: str, stats: dict) -> str:
        return save_bundle(self.dir / f"step_{step:04d}.pt", step=step, cfg=self.cfg, fault=self.fault,
                           batch=state.batch, stats=stats, reason=reason, threads=torch.get_num_threads(),
                           model_cfg=state.model.cfg, **self.snapshot)

    def on_failure(self, step: int, state: TrainState, exc: NonFiniteError) -> None:
        exc.bundle = self._write(step, state, str(exc), exc.stats)

    def on_row(self, step: int, state: TrainState, row: dict) -> None:
        norms = [h["grad_norm"] for h in state.history if "grad_norm" in h]
        update = state.update
        if len(norms) >= 5 and update and update["grad_norm"] > self.spike_factor * statistics.median(norms):
            row["spike_bundle"] = self._write(
                step, state, f"grad_norm {update['grad_norm']:.3g} > {self.spike_factor}x running median", update)


def replay_bundle(path, seams_for=lambda fault: SEAMS) -> tuple[dict, dict]:
    """Re-run a saved step's update from its saved state and batch, with the seams of the fault it ran under
    (`seams_for(name)`). Returns (recorded stats, replayed stats)."""
    b = torch.load(path, map_location="cpu", weights_only=True)
    torch.set_num_threads(int(b["threads"]))
    cfg = RLConfig(**b["cfg"])
    seams: Seams = seams_for(b["bug"])
    model = TinyAgent(ModelConfig(**b["model_config"]))
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
