"""The registry of policy backends: name -> the module that builds one from its described config (replay bundles),
saves it and loads what it saved (`from_config(config)`, `save(model, path, tokenizer_hash, extra)`,
`load(path, tokenizer_hash)`). A new backend is one module and one entry here.

Modules are imported by name when a backend is used, so a stage's code (its import closure, agentrl.tracking.closure)
holds only the backends it imports itself: TinyAgent's stages do not depend on the Qwen3 backend's source.
"""
from __future__ import annotations

import importlib

from agentrl.core.config import ConfigError

BACKENDS = {
    "tinyagent": ("agentrl.backends.tinyagent",
                  "TinyAgent, the project's own small transformer (agentrl.model.policy)"),
    "qwen3": ("agentrl.backends.qwen3", "a Hugging Face transformers Qwen3 causal LM loaded with from_pretrained"),
}


def backend(name: str):
    """The module of backend `name` (from_config, save, load)."""
    if name not in BACKENDS:
        raise ConfigError(f"backend: unknown value {name!r}; allowed: {', '.join(BACKENDS)}")
    return importlib.import_module(BACKENDS[name][0])


def save(model, path, tokenizer_hash: str, extra: dict | None = None) -> None:
    """Write a policy checkpoint the way its backend does (agentrl.model.checkpoints for TinyAgent)."""
    backend(model.kind).save(model, path, tokenizer_hash, extra)


def from_description(description: dict):
    """A fresh model of the kind and config a backend's describe() gave."""
    return backend(description["backend"]).from_config(description["config"])
