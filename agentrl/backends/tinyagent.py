"""TinyAgent as a registered backend: the model itself implements the interface (agentrl.model.policy); its
checkpoints are agentrl.model.checkpoints' single files."""
from __future__ import annotations

from dataclasses import asdict

from agentrl.backends.base import BackendSpec
from agentrl.backends.registry import BACKENDS
from agentrl.model.checkpoints import load_policy, read_checkpoint, save_policy
from agentrl.model.policy import ModelConfig, TinyAgent


def from_config(config: dict) -> TinyAgent:
    return TinyAgent(ModelConfig(**config))


def save(model: TinyAgent, path, tokenizer_hash: str, extra: dict | None = None) -> None:
    save_policy(path, model, tokenizer_hash, extra)


def load(path, tok, expect=None) -> tuple[TinyAgent, dict]:
    """expect: the params' model section (agentrl.core.config.ModelParams), checked with the tokenizer's size."""
    config = None if expect is None else ModelConfig(vocab_size=len(tok), **asdict(expect))
    return load_policy(path, tok.hash, config)


TINYAGENT = BACKENDS.register("tinyagent", BackendSpec(
    "tinyagent", "TinyAgent, the project's own small transformer (agentrl.model.policy)",
    from_config=from_config, save=save, load=load, read=read_checkpoint))
