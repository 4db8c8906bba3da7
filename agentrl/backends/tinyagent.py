"""TinyAgent as a registered backend: the model itself implements the interface (agentrl.model.policy); this
module is how the registry builds, saves and loads it (agentrl.model.checkpoints)."""
from __future__ import annotations

from agentrl.model.checkpoints import load_policy, save_policy
from agentrl.model.policy import ModelConfig, TinyAgent


def from_config(config: dict) -> TinyAgent:
    return TinyAgent(ModelConfig(**config))


def save(model: TinyAgent, path, tokenizer_hash: str, extra: dict | None = None) -> None:
    save_policy(path, model, tokenizer_hash, extra)


def load(path, tokenizer_hash: str) -> TinyAgent:
    return load_policy(path, tokenizer_hash)[0]
