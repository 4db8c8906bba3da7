"""The registry of policy backends (agentrl.core.registry): name -> BackendSpec (agentrl.backends.base), and the
checkpoint functions every stage, lab, guard and replay uses, which find a model's backend by its `kind`.

The backends that ship with the project are declared here by module and imported on first lookup by name (a
checkpoint's `kind`); a stage imports the entry it uses (`TINYAGENT`), so its code closure holds that module.
"""
from __future__ import annotations

from agentrl.core.registry import Registry

BACKENDS = Registry("policy backend", "backend", builtin={
    "tinyagent": "agentrl.backends.tinyagent",   # TinyAgent, the project's own small transformer (agentrl.model)
    "hf": "agentrl.backends.hf",                 # a Hugging Face causal LM (Qwen3, Llama) loaded with from_pretrained
})


def backend(name: str):
    """The BackendSpec registered as `name` (a one-line ConfigError naming the allowed ones otherwise)."""
    return BACKENDS.get(name)


def save_checkpoint(model, path, tokenizer_hash: str, extra: dict | None = None) -> None:
    """Write a policy checkpoint the way its backend does (atomically)."""
    backend(model.kind).save(model, path, tokenizer_hash, extra)


def load_checkpoint(kind: str, path, tok, expect=None):
    """(model, extra) of the checkpoint at `path`, written by backend `kind` for the tokenizer `tok`; `expect`: the
    model config it must have (TinyAgent: the params' model section). Refused in one line (CheckpointError) when
    missing, corrupted, or made for another tokenizer or config."""
    return backend(kind).load(path, tok, expect)


def read_checkpoint(kind: str, path) -> dict:
    """{"state_dict", "extra"} of a checkpoint, without building its model."""
    return backend(kind).read(path)


def from_description(description: dict):
    """A fresh model of the kind and config a backend's describe() gave (replay bundles)."""
    return backend(description["backend"]).from_config(description["config"])


def thresholds(kind: str | None) -> dict:
    """The invariants' thresholds a backend declares (none for an unknown or missing kind)."""
    return dict(backend(kind).thresholds) if kind in BACKENDS else {}
