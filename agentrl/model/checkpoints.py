"""Policy checkpoints: written atomically, read with weights_only=True, refused when they come from a different
model config or tokenizer (one-line CheckpointError)."""
from __future__ import annotations

from pathlib import Path

import torch

from agentrl.core.artifacts import CheckpointError
from agentrl.core.writer import write_file
from agentrl.model.policy import ModelConfig, TinyAgent


def save_policy(path, model: TinyAgent, tokenizer_hash: str, extra: dict | None = None) -> None:
    """Write {config, tokenizer_hash, state_dict, extra} atomically (tmp file + rename)."""
    payload = {"config": model.cfg.to_dict(), "tokenizer_hash": tokenizer_hash,
               "state_dict": model.state_dict(), "extra": extra or {}}
    write_file(path, lambda tmp: torch.save(payload, tmp))   # a short write: the disk-full line naming `path`


def read_checkpoint(path) -> dict:
    """torch.load(weights_only=True) with a clear error for a missing or unreadable file."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint {path}: file not found")
    try:
        payload = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as exc:  # truncated zip, wrong format, pickled code...
        raise CheckpointError(f"checkpoint {path}: unreadable or corrupted ({type(exc).__name__}); "
                              "re-run the stage that writes it") from None
    if not isinstance(payload, dict) or not {"config", "tokenizer_hash", "state_dict"} <= set(payload):
        raise CheckpointError(f"checkpoint {path}: not an agentrl checkpoint (missing config, tokenizer_hash or "
                              "state_dict)")
    return payload


def load_policy(path, tokenizer_hash: str, expect_config: ModelConfig | None = None) -> tuple[TinyAgent, dict]:
    """Load a policy checkpoint, refusing one from a different tokenizer or model config."""
    payload = read_checkpoint(path)
    if payload["tokenizer_hash"] != tokenizer_hash:
        raise CheckpointError(f"checkpoint {path}: tokenizer_hash {payload['tokenizer_hash']} does not match the "
                              f"current tokenizer {tokenizer_hash}; rebuild it from the current tasks stage")
    try:
        cfg = ModelConfig(**payload["config"])
    except TypeError as exc:
        raise CheckpointError(f"checkpoint {path}: bad model config ({exc})") from None
    if expect_config is not None and cfg != expect_config:
        raise CheckpointError(f"checkpoint {path}: model config {cfg.to_dict()} does not match params "
                              f"{expect_config.to_dict()}")
    bad = [k for k, v in payload["state_dict"].items() if torch.is_tensor(v) and not torch.isfinite(v).all()]
    if bad:
        raise CheckpointError(f"checkpoint {path}: non-finite weights in {bad[0]} ({len(bad)} tensors); the stage "
                              "that wrote it diverged: re-run it (check its params)")
    model = TinyAgent(cfg)
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise CheckpointError(f"checkpoint {path}: weights do not fit the model config "
                              f"({str(exc).splitlines()[0]})") from None
    return model, payload.get("extra", {})
