"""Hugging Face causal LMs behind the policy-backend interface (agentrl.backends.base): any architecture in
`ARCHITECTURES` (today Qwen3 and Llama, which SmolLM2 is), loaded with `AutoModelForCausalLM.from_pretrained(dir)`
exactly as a user with weights on disk would load them. The architectures are data: the backend talks to the model
through transformers' own accessors (`get_decoder()`, `get_output_embeddings()`), never through an
architecture's attribute names. Nothing is fetched at run time: offline mode is forced before transformers is
imported and every load is `local_files_only`.

- Sampling: `HFSampler` (agentrl.backends.hf_sampler): the shared prompt computed once, a KV slab for all rows,
  the sampler's own copy of the weights in the compute dtype.
- Training: one causal pass of the decoder over right-padded rows (queries never see later keys, so padding needs
  no mask), the rows' common prefix computed once with gradients through it, then the LM head only at the
  positions `at` marks: never [B, T, vocab] logits.
- Precision (`set_precision`): fp32, or bf16 mixed precision (fp32 master weights and Adam, products in bf16 on
  both the sampler's and the trainer's side).
- `make_small_model`: a small random-init model of an architecture with a real vocabulary, initialised from an
  explicit generator and written with `save_pretrained` beside the tokenizer files.
"""
from __future__ import annotations

import contextlib
import json
import shutil
from pathlib import Path

import torch
import torch.nn as nn

from agentrl.backends.base import BackendSpec
from agentrl.backends.hf_sampler import MIN_SHARED_PREFIX, HFSampler, SamplerWeights
from agentrl.backends.offline import transformers
from agentrl.backends.registry import BACKENDS
from agentrl.core import files
from agentrl.core.artifacts import CheckpointError
from agentrl.core.config import ConfigError
from agentrl.model import floors
from agentrl.model.logprobs import entropy_from_logits, selected_log_probs

ARCHITECTURES = {"qwen3": "Qwen3ForCausalLM", "llama": "LlamaForCausalLM"}   # model_type -> transformers class
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
CHAT_TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")   # where transformers 5 keeps a template
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
NO_GRAD_CHUNK = 1024    # positions per LM-head pass without gradient: 1024 x 151,936 float32 logits are 594 MiB
NO_GRAD_ROWS = 64       # rows per decoder pass without gradient: the pass keeps every row's keys and values, which for
                        # a 400-episode evaluation of SmolLM2 (30 layers, 1,000 slots) would be 18 GiB at once
PRECISIONS = {"fp32": torch.float32, "bf16": torch.bfloat16}   # a lab's dtype -> the compute dtype
EMBEDDING_ROWS = {"qwen3": 151_936}   # Qwen3's embedding rows (its tokenizer's 151,669 tokens, padded)


def check_model_dir(path, field: str) -> Path:
    """A model directory this backend can load and drive (agentrl.backends.model_dir: config, weights, tokenizer
    files, a chat template), or a one-line ConfigError naming `field` and what is wrong, before anything is loaded."""
    from agentrl.backends.model_dir import check_model_dir as check
    return check(path, field)


class HFPolicy(nn.Module):
    """A transformers causal LM as a policy backend."""

    kind = "hf"

    def __init__(self, lm, precision: str = "fp32"):
        super().__init__()
        self.lm = lm
        self.prefix_kv = "repeat"   # how the sampler keeps a batch's shared prefix (hf_sampler.PREFIX_KV)
        self.set_precision(precision)

    def set_precision(self, precision: str) -> None:
        """fp32, or bf16 mixed precision: fp32 master weights (and Adam's state), the trainer's pass under autocast
        and the sampler decoding from a bf16 copy of the weights; both sides compute their products in bf16."""
        if precision not in PRECISIONS:
            raise ConfigError(f"dtype: unknown value {precision!r}; allowed: {', '.join(PRECISIONS)}")
        self.precision = precision
        self.sampler_weights = SamplerWeights(self.lm, PRECISIONS[precision])

    def compute(self):
        """The context every forward runs in: autocast to bf16 under bf16, nothing under fp32."""
        if self.precision == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(next(self.lm.parameters()).device.type, dtype=PRECISIONS[self.precision])

    @contextlib.contextmanager
    def sampling(self):
        """The sampler's forwards: the compute dtype, and every linear layer reading the sampler's weight copy."""
        with self.compute(), self.sampler_weights.active():
            yield

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
        return HFSampler(self, pad_id, self.prefix_kv)

    def hidden(self, ids: torch.Tensor) -> torch.Tensor:
        """The decoder's last hidden state [B, T, D] of right-padded rows. The rows' common prefix (the shared
        system prompt), when at least MIN_SHARED_PREFIX tokens long, is computed once: one row's pass over it, its
        keys and values repeated for every row, then the rest of every row on top, gradients flowing through the
        shared pass (an exact shortcut: the same function of the same ids, the rows' gradients summed there)."""
        with self.compute():
            return self._hidden(ids)

    def _hidden(self, ids: torch.Tensor) -> torch.Tensor:
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

    def head_logits(self, h: torch.Tensor) -> torch.Tensor:
        """The LM head on hidden states, as fp32 logits (computed in the compute dtype)."""
        with self.compute():
            return self.head(h).float()

    def logits(self, ids: torch.Tensor, at: torch.Tensor | None = None) -> torch.Tensor:
        h = self.hidden(ids)
        return self.head_logits(h if at is None else h[at])

    def log_probs(self, ids: torch.Tensor, at: torch.Tensor | None = None, temperature: float = 1.0,
                  entropy: bool = False):
        """log p(ids[1:]) [B, T-1] at the positions `at` marks (0 elsewhere), the LM head applied there only; without
        gradient, NO_GRAD_ROWS rows per decoder pass and NO_GRAD_CHUNK positions per LM-head pass (an evaluation's
        10^5 positions would be GiBs of keys, values and logits)."""
        B, T = ids.shape
        at = torch.ones(B, T - 1, dtype=torch.bool, device=ids.device) if at is None else at > 0
        if B > NO_GRAD_ROWS and not torch.is_grad_enabled():
            parts = [self.log_probs(ids[i:i + NO_GRAD_ROWS], at[i:i + NO_GRAD_ROWS], temperature, entropy)
                     for i in range(0, B, NO_GRAD_ROWS)]
            return torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts]) if entropy else None
        h, targets = self.hidden(ids)[:, :-1][at], ids[:, 1:][at]
        if floors.METER is not None:   # a lab's work meter (agentrl.model.floors)
            n = common_prefix(ids)
            floors.METER.scoring_pass(B, T, int(at.sum()), n if B >= 2 and n >= MIN_SHARED_PREFIX else 0,
                                      torch.is_grad_enabled())
        step = h.shape[0] if torch.is_grad_enabled() else NO_GRAD_CHUNK
        logps, entropies = [], []
        for i in range(0, max(h.shape[0], 1), max(step, 1)):
            logits = self.head_logits(h[i:i + step])
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
    """save_pretrained(path) (+ the tokenizer files from tokenizer_dir, so the directory loads on its own), written
    whole or not at all (agentrl.core.writer: a full disk is the boundary's line naming `path`)."""
    from agentrl.core.writer import write_directory

    def fill(directory: Path) -> None:
        model.lm.save_pretrained(directory)
        (directory / "agentrl.json").write_text(json.dumps({"tokenizer_hash": tokenizer_hash}, sort_keys=True) + "\n")
        if extra:
            torch.save(extra, directory / "training_state.pt")
        if tokenizer_dir is not None:
            for name in TOKENIZER_FILES:
                shutil.copyfile(Path(tokenizer_dir) / name, directory / name)
            for name in CHAT_TEMPLATE_FILES:
                if (Path(tokenizer_dir) / name).is_file():
                    shutil.copyfile(Path(tokenizer_dir) / name, directory / name)
    write_directory(path, fill)


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
