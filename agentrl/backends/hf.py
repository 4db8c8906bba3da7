"""Hugging Face causal LMs behind the policy-backend interface (agentrl.backends.base): any architecture in
`ARCHITECTURES` (today Qwen3 and Llama, which SmolLM2 is), loaded with `AutoModelForCausalLM.from_pretrained(dir)`
exactly as a user with weights on disk would load them. The architectures are data: the backend talks to the model
through transformers' own accessors (`get_decoder()`, `get_output_embeddings()`), never through an
architecture's attribute names. Nothing is fetched at run time: offline mode is forced before transformers is
imported and every load is `local_files_only`.

- Sampling: `HFSampler`, one `DynamicCache` for all rows. The first chunk's longest common prefix (the shared
  system prompt with the tools) is computed once for the whole batch and its cache repeated for every row; then a
  chunk appends the same number of slots to every row, a row with nothing to add at a slot leaving it masked
  (attention mask 0) with positions counted per row, so episodes at different points of their turns advance
  together; finished rows leave with `keep`. The LM head runs only after each row's last valid slot.
- Training: one causal pass of the decoder over right-padded rows (queries never see later keys, so padding needs
  no mask), the rows' common prefix computed once with gradients through it, then the LM head only at the
  positions `at` marks: never [B, T, vocab] logits.
- `make_small_model`: a small random-init model of an architecture with a real vocabulary, initialised from an
  explicit generator and written with `save_pretrained` beside the tokenizer files.
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
from agentrl.core import files
from agentrl.core.artifacts import CheckpointError
from agentrl.core.config import ConfigError
from agentrl.model.logprobs import entropy_from_logits, selected_log_probs
from agentrl.model.packing import pad_rows

OFFLINE = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"}
ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}   # model_type -> transformers class
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
NO_GRAD_CHUNK = 1024    # positions per LM-head pass without gradient: 1024 x 151,936 float32 logits are 594 MiB
EMBEDDING_ROWS = {"qwen3": 151_936}   # Qwen3's embedding rows (its tokenizer's 151,669 tokens, padded)
MIN_SHARED_PREFIX = 16  # a common prompt prefix at least this long is computed once per batch


def transformers():
    """The transformers package, imported with the hub switched off."""
    os.environ.update(OFFLINE)
    import transformers as tf
    tf.utils.logging.set_verbosity_error()
    tf.utils.logging.disable_progress_bar()
    return tf


def check_model_dir(path, field: str) -> Path:
    """A model directory (config.json of a supported model_type, weights, tokenizer files), or a one-line
    ConfigError naming `field` and what is wrong, before anything is loaded."""
    path = Path(path)
    expected = f"a Hugging Face model directory (config.json, weights, {', '.join(TOKENIZER_FILES)})"
    if not path.is_dir():
        raise ConfigError(f"{field}: {path} is not a directory; expected {expected}")
    config = path / "config.json"
    try:
        model_type = json.loads(files.read_text(config, files.MAX_RECORD_BYTES, "a model config")).get("model_type")
    except (OSError, ValueError, AttributeError, UnicodeDecodeError):
        raise ConfigError(f"{field}: {config} is missing or not a JSON model config") from None
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"{field}: {config} has model_type {model_type!r}; allowed: "
                          f"{', '.join(map(repr, ARCHITECTURES))}")
    if not any((path / f).is_file() for f in WEIGHT_FILES):
        raise ConfigError(f"{field}: {path} has no weights (expected one of {', '.join(WEIGHT_FILES)})")
    missing = [f for f in TOKENIZER_FILES if not (path / f).is_file()]
    if missing:
        raise ConfigError(f"{field}: {path} is missing the tokenizer file(s) {', '.join(missing)}")
    return path


class HFPolicy(nn.Module):
    """A transformers causal LM as a policy backend."""

    kind = "hf"

    def __init__(self, lm):
        super().__init__()
        self.lm = lm

    @classmethod
    def from_config(cls, config: dict) -> HFPolicy:
        tf = transformers()
        config = dict(config)
        hf_config = tf.AutoConfig.for_model(config.pop("model_type"), **config)
        return cls(tf.AutoModelForCausalLM.from_config(hf_config).float())

    @property
    def decoder(self):
        return self.lm.get_decoder()

    @property
    def head(self):
        return self.lm.get_output_embeddings()

    @property
    def model_type(self) -> str:
        return self.lm.config.model_type

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def describe(self) -> dict:
        config = {k: v for k, v in self.lm.config.to_dict().items()
                  if k not in ("transformers_version", "dtype", "torch_dtype", "architectures")}
        return {"backend": self.kind, "parameters": self.num_params(), "config": config}

    def sampler(self, pad_id: int) -> HFSampler:
        return HFSampler(self, pad_id)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden state [B, T, D] of right-padded rows. The rows' common prefix (the shared
        system prompt), when at least MIN_SHARED_PREFIX tokens long, is computed once: one row's pass over it, its
        keys and values repeated for every row, then the rest of every row on top, gradients flowing through the
        shared pass (an exact shortcut: the same function of the same ids, the rows' gradients summed there)."""
        B, T = ids.shape
        n = common_prefix(ids)
        if B < 2 or n < MIN_SHARED_PREFIX:
            return self.decoder(input_ids=ids, use_cache=False).last_hidden_state
        cache = transformers().DynamicCache(config=self.lm.config)
        head = self.decoder(input_ids=ids[:1, :n], past_key_values=cache, use_cache=True).last_hidden_state
        cache.batch_repeat_interleave(B)
        positions = torch.arange(n, T, device=ids.device)[None].expand(B, -1)
        rest = self.decoder(input_ids=ids[:, n:], past_key_values=cache, position_ids=positions,
                            use_cache=True).last_hidden_state
        return torch.cat([head.expand(B, -1, -1), rest], 1)

    def logits(self, ids: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden(ids)
        return self.head(h if at is None else h[at])

    def log_probs(self, ids: torch.Tensor, at: torch.Tensor | None = None, temperature: float = 1.0,
                  entropy: bool = False):
        """log p(ids[1:]) [B, T-1] at the positions `at` marks (0 elsewhere), the LM head applied there only; without
        gradient, NO_GRAD_CHUNK positions at a time (an evaluation's 10^4 positions would be GiBs of logits)."""
        B, T = ids.shape
        at = torch.ones(B, T - 1, dtype=torch.bool, device=ids.device) if at is None else at > 0
        h, targets = self.hidden(ids)[:, :-1][at], ids[:, 1:][at]
        step = h.shape[0] if torch.is_grad_enabled() else NO_GRAD_CHUNK
        logps, entropies = [], []
        for i in range(0, max(h.shape[0], 1), max(step, 1)):
            logits = self.head(h[i:i + step])
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


def common_prefix(ids: torch.Tensor) -> int:
    """The number of leading columns on which every row of ids [B, T] agrees, leaving each row one of its own."""
    differs = (ids != ids[:1]).any(0)
    n = int(differs.int().argmax()) if bool(differs.any()) else ids.shape[1]
    return min(n, ids.shape[1] - 1)


def shared_prefix(chunks: list[list[int]]) -> int:
    """The length of the longest prefix every chunk shares, leaving each chunk at least one token of its own."""
    n = min(len(c) for c in chunks) - 1
    first = chunks[0]
    for i in range(max(n, 0)):
        if any(c[i] != first[i] for c in chunks[1:]):
            return i
    return max(n, 0)


class HFSampler:
    """Batched KV-cached sampling state of an HFPolicy (agentrl.backends.base.Sampler)."""

    def __init__(self, policy: HFPolicy, pad_id: int):
        self.policy, self.pad_id = policy, pad_id
        self.cache = transformers().DynamicCache(config=policy.lm.config)
        self.mask: torch.Tensor | None = None      # [rows, slots]: 1 where the slot holds a token of the row
        self.lengths: torch.Tensor | None = None   # tokens in each row
        self.prefix_tokens = 0                     # the shared prefix computed once (for the bench's accounting)

    def _forward(self, ids: torch.Tensor, valid: torch.Tensor, last: torch.Tensor) -> torch.Tensor:
        """ids, valid [rows, L] appended as L slots; returns the logits after slot last[r] of each row in `last`'s
        rows (last: [n, 2] of (row, slot))."""
        L = ids.shape[1]
        pos = self.lengths[:, None] + (valid.long().cumsum(1) - 1).clamp(min=0)
        mask = valid.long() if self.mask is None else torch.cat([self.mask, valid.long()], 1)
        out = self.policy.decoder(input_ids=ids, attention_mask=mask, position_ids=pos, past_key_values=self.cache,
                                  use_cache=True)
        self.mask = mask
        self.lengths = self.lengths + valid.sum(1)
        assert out.last_hidden_state.shape[1] == L
        return self.policy.head(out.last_hidden_state[last[:, 0], last[:, 1]])

    def _prefill_shared(self, chunks: list[list[int]]) -> list[list[int]]:
        """Compute the chunks' common prefix once and repeat its cache for every row; returns the rest of each."""
        n = shared_prefix(chunks)
        if len(chunks) < 2 or n < MIN_SHARED_PREFIX:
            return chunks
        rows = len(chunks)
        ids = torch.tensor([chunks[0][:n]])
        self.policy.decoder(input_ids=ids, attention_mask=torch.ones_like(ids),
                            position_ids=torch.arange(n)[None], past_key_values=self.cache, use_cache=True)
        self.cache.batch_repeat_interleave(rows)
        self.mask = torch.ones(rows, n, dtype=torch.long)
        self.lengths = torch.full((rows,), n, dtype=torch.long)
        self.prefix_tokens = n
        return [c[n:] for c in chunks]

    def append(self, chunks: list[list[int]]) -> torch.Tensor:
        if self.lengths is None:
            self.lengths = torch.zeros(len(chunks), dtype=torch.long)
            chunks = self._prefill_shared(chunks)
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

def load_model(path, field: str = "model") -> HFPolicy:
    """AutoModelForCausalLM.from_pretrained(path) in fp32, offline, after check_model_dir. Weights that cannot be
    read are a one-line CheckpointError naming the file."""
    path = check_model_dir(path, field)
    tf = transformers()
    config = files.read_text(path / "config.json", files.MAX_RECORD_BYTES, "a model config")
    model_type = json.loads(config)["model_type"]
    try:
        lm = tf.AutoModelForCausalLM.from_pretrained(path, local_files_only=True, dtype=torch.float32)
    except Exception as exc:   # safetensors, torch and transformers each raise their own kinds for a bad file
        weights = next((path / f for f in WEIGHT_FILES if (path / f).is_file()), path)
        raise CheckpointError(f"{field}: {weights} cannot be loaded ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else 'unreadable'})") from None
    if type(lm).__name__ != ARCHITECTURES[model_type]:
        raise ConfigError(f"{field}: {path} loads as {type(lm).__name__}, not {ARCHITECTURES[model_type]}")
    bad = [n for n, p in lm.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise CheckpointError(f"{field}: {path}: non-finite weights in {bad[0]} ({len(bad)} tensors)")
    return HFPolicy(lm.eval())


def load_tokenizer(path, field: str = "model"):
    """AutoTokenizer.from_pretrained(path), offline."""
    return transformers().AutoTokenizer.from_pretrained(check_model_dir(path, field), local_files_only=True)


def save_model(model: HFPolicy, path, tokenizer_hash: str, extra: dict | None = None, tokenizer_dir=None) -> None:
    """save_pretrained(path) (+ the tokenizer files from tokenizer_dir, so the directory loads on its own)."""
    path = Path(path)
    model.lm.save_pretrained(path)
    (path / "agentrl.json").write_text(json.dumps({"tokenizer_hash": tokenizer_hash}, sort_keys=True) + "\n")
    if extra:
        torch.save(extra, path / "training_state.pt")
    if tokenizer_dir is not None:
        for name in TOKENIZER_FILES:
            shutil.copyfile(Path(tokenizer_dir) / name, path / name)


def load(path, tok, expect=None) -> tuple[HFPolicy, dict]:
    """A checkpoint directory save_model wrote (its training state as extra)."""
    state = Path(path) / "training_state.pt"
    extra = torch.load(state, map_location="cpu", weights_only=True) if state.is_file() else {}
    return load_model(path, "checkpoint"), extra


def small_config(model_type: str, vocab: int, bos: int, eos: int, pad: int, hidden: int = 64, layers: int = 2,
                 heads: int = 4, kv_heads: int = 2, head_dim: int = 16, intermediate: int = 192,
                 max_positions: int = 4096) -> dict:
    """A small decoder of an architecture with a real vocabulary and tied embeddings, small enough for a CPU."""
    if model_type not in ARCHITECTURES:
        raise ConfigError(f"model_type: unknown value {model_type!r}; allowed: {', '.join(ARCHITECTURES)}")
    return {"model_type": model_type, "vocab_size": vocab, "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
            "head_dim": head_dim, "tie_word_embeddings": True, "max_position_embeddings": max_positions,
            "bos_token_id": bos, "eos_token_id": eos, "pad_token_id": pad}


@torch.no_grad()
def init_weights(model: HFPolicy, generator: torch.Generator) -> None:
    """Re-draw every weight from the generator (HF's scheme: normal(0, initializer_range) for matrices, 1 for the
    norms' gains), so the model depends on the seed only, never on the global RNG."""
    std = model.lm.config.initializer_range
    for _, p in sorted(model.named_parameters()):
        if p.dim() == 1:
            p.fill_(1.0)
        else:
            p.copy_(torch.empty(p.shape, device=generator.device).normal_(0.0, std, generator=generator))


def make_small_model(path, seed_generator: torch.Generator, tokenizer_dir, model_type: str = "qwen3",
                     field: str = "lab.model", **sizes) -> HFPolicy:
    """Write a small random-init model of `model_type` for the tokenizer in tokenizer_dir to `path` with
    save_pretrained, beside the tokenizer files, and return it loaded back with from_pretrained (the path a user's
    model directory takes). Its embedding rows are the architecture's released models' (else the vocabulary padded
    to a multiple of 64), its special tokens the tokenizer's."""
    for name in TOKENIZER_FILES:
        if not (Path(tokenizer_dir) / name).is_file():
            raise ConfigError(f"{field}: null needs the tokenizer file {Path(tokenizer_dir) / name}, which is "
                              "missing; `make install` fetches it")
    tokenizer = transformers().AutoTokenizer.from_pretrained(tokenizer_dir, local_files_only=True)
    vocab = EMBEDDING_ROWS.get(model_type, -(-len(tokenizer) // 64) * 64)
    eos = tokenizer.convert_tokens_to_ids("<|im_end|>")
    pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else eos
    bos = tokenizer.bos_token_id if tokenizer.bos_token_id is not None else pad
    model = HFPolicy.from_config(small_config(model_type, vocab, bos, eos, pad, **sizes))
    init_weights(model, seed_generator)
    path = Path(path)
    if path.exists():
        shutil.rmtree(path)
    save_model(model, path, "", tokenizer_dir=tokenizer_dir)
    return load_model(path, field)


# on Qwen3 (151,936-token vocabulary, ~500-token rows, 2 threads) the clean trainer's accumulation measured 1.1e-5 to
# 2.1e-4 and the accum_local fault 0.051 to 0.142 (docs/preflight.md, "Qwen3"): float32 rounding over a long row
ENTRY = BACKENDS.register("hf", BackendSpec(
    "hf", "a Hugging Face transformers causal LM (Qwen3, Llama) loaded with from_pretrained",
    from_config=HFPolicy.from_config, save=save_model, load=load, thresholds={"accumulation": ("<", 1e-3)}))


def honest_name(model_dir) -> str:
    """What a report calls the model: the converted package's own words (agentrl.backends.pretrained: "SmolLM2-135M-
    Instruct, Q4_1 weights dequantized to fp32"), else the directory's architecture and size."""
    from agentrl.backends.pretrained import honest_name as pinned_name
    path = Path(model_dir)
    name = pinned_name(path)
    if name is not None:
        return name
    try:
        config = json.loads(files.read_text(path / "config.json", files.MAX_RECORD_BYTES, "a model config"))
    except (OSError, ValueError, files.InputFileError):
        return str(path)
    return f"a {config.get('model_type', '?')} model ({config.get('num_hidden_layers', '?')} layers, hidden " \
           f"{config.get('hidden_size', '?')}) at {path}"
