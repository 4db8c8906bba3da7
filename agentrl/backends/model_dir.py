"""Is a directory a Hugging Face model this project can load and talk to? Checked before anything loads (no torch,
no weights read), in about a second; each problem is one line naming the field, the file and what is wrong
(ConfigError: exit 2):

- config.json: JSON whose model_type is one of MODEL_TYPES;
- weights: model.safetensors, its header read (the tensors it lists must fit in the file, so a truncated copy is
  named here, not after the loader has read it), or a sharded index whose every shard is there and whole, or
  pytorch_model.bin;
- tokenizer.json and tokenizer_config.json, JSON;
- a chat template (chat_template.jinja, as SmolLM2 ships it, or `chat_template` in tokenizer_config.json) that the
  conversation format can drive: agentrl.env.chat.ToolChat's own start-up probes (the end-of-turn token, the tools,
  a tool response after an assistant call) rendered by transformers' renderer, from the tokenizer files alone.
"""
from __future__ import annotations

import json
import os
import struct
from pathlib import Path

from agentrl.backends.offline import OFFLINE
from agentrl.core import files
from agentrl.core.knobs import ConfigError
from agentrl.env.chat import TemplateError, TokenInTokenOutError, ToolChat

MODEL_TYPES = ("qwen3", "llama")   # agentrl.backends.hf.ARCHITECTURES: what the backend loads
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                "pytorch_model.bin.index.json")
TEMPLATE_FILE = "chat_template.jinja"
MAX_HEADER = 100 * files.MiB   # safetensors' own bound on a header
EXPECTED = f"a Hugging Face model directory (config.json, weights, {', '.join(TOKENIZER_FILES)}, a chat template)"


def _json(path: Path, field: str, what: str, limit: int = files.MAX_RECORD_BYTES):
    try:
        return json.loads(files.read_text(path, limit, what))
    except FileNotFoundError:
        raise ConfigError(f"{field}: {path.parent} is missing {path.name}; expected {EXPECTED}") from None
    except files.InputFileError as exc:
        raise ConfigError(f"{field}: {exc}") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise ConfigError(f"{field}: {path} is not readable JSON ({str(exc).splitlines()[0][:120]})") from None


def _safetensors(path: Path, field: str) -> None:
    """The header of a safetensors file: its length, its JSON, and the end of the last tensor within the file."""
    size = os.stat(path).st_size
    if size == 0:
        raise ConfigError(f"{field}: {path} is empty; copy the model again")
    try:
        with open(path, "rb") as f:
            (n,) = struct.unpack("<Q", f.read(8))
            if not 0 < n <= min(size - 8, MAX_HEADER):
                raise ValueError(f"a header of {n:,} bytes in a file of {size:,}")
            header = json.loads(f.read(n))
        ends = [int(t["data_offsets"][1]) for k, t in header.items() if k != "__metadata__"]
    except (struct.error, ValueError, TypeError, KeyError, IndexError, AttributeError) as exc:
        why = str(exc).splitlines()[0][:120] if str(exc) else type(exc).__name__
        raise ConfigError(f"{field}: {path} is not a safetensors file ({why}); copy the model again") from None
    need = 8 + n + max(ends, default=0)
    if need > size:
        raise ConfigError(f"{field}: {path} is truncated ({size:,} bytes; its header lists {need:,}); copy the model "
                          "again")


def _weights(path: Path, field: str) -> None:
    present = [name for name in WEIGHT_FILES if (path / name).is_file()]
    if not present:
        raise ConfigError(f"{field}: {path} has no weights (expected one of {', '.join(WEIGHT_FILES)})")
    name = present[0]
    if name.endswith(".index.json"):
        weight_map = _json(path / name, field, "a weights index").get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ConfigError(f"{field}: {path / name} has no weight_map; copy the model again")
        shards = sorted(set(map(str, weight_map.values())))
        missing = [s for s in shards if not (path / s).is_file()]
        if missing:
            raise ConfigError(f"{field}: {path} is missing the weights shard {missing[0]} ({len(missing)} of "
                              f"{len(shards)} that {name} lists)")
        for shard in shards:
            if shard.endswith(".safetensors"):
                _safetensors(path / shard, field)
    elif name == "model.safetensors":
        _safetensors(path / name, field)
    elif os.stat(path / name).st_size == 0:
        raise ConfigError(f"{field}: {path / name} is empty; copy the model again")


def _token(value) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or an AddedToken's {"content": ...}."""
    return value.get("content") if isinstance(value, dict) else value if isinstance(value, str) else None


class TemplateTokenizer:
    """What ToolChat asks of a tokenizer at start-up, from the tokenizer files alone: the template, its rendering
    (transformers' own renderer, given the special tokens as apply_chat_template gives them), the special and added
    tokens and the vocabulary. No encoding: `verify()` needs the real tokenizer."""

    def __init__(self, template: str, tokenizer: dict, config: dict):
        self.chat_template = template
        vocab = (tokenizer.get("model") or {}).get("vocab") or {}
        if isinstance(vocab, list):   # a Unigram model: [[piece, score], ...]
            vocab = {str(piece[0]): i for i, piece in enumerate(vocab) if isinstance(piece, list) and piece}
        self.vocab = {str(k): int(v) for k, v in vocab.items() if isinstance(v, int)} if isinstance(vocab, dict) else {}
        added = [t for t in tokenizer.get("added_tokens") or [] if isinstance(t, dict) and "content" in t]
        self.added = {str(t["content"]): int(t.get("id", -1)) for t in added}
        self.special = {name: tok for name in ("bos_token", "eos_token", "unk_token", "pad_token")
                        if (tok := _token(config.get(name))) is not None}
        extra = config.get("additional_special_tokens") or config.get("extra_special_tokens") or []
        extra = extra.values() if isinstance(extra, dict) else extra
        self.all_special_tokens = list(dict.fromkeys([*self.special.values(), *filter(None, map(_token, extra))]))
        self.pad_token_id = self.convert_tokens_to_ids(self.special["pad_token"]) if "pad_token" in self.special \
            else None

    def get_vocab(self) -> dict:
        return {**self.vocab, **self.added}

    def get_added_vocab(self) -> dict:
        return dict(self.added)

    def convert_tokens_to_ids(self, token: str):
        return self.added.get(token, self.vocab.get(token))

    def apply_chat_template(self, messages, tools=None, tokenize=False, add_generation_prompt=False, **kwargs):
        from transformers.utils.chat_template_utils import render_jinja_template
        rendered, _ = render_jinja_template([messages], tools=tools, chat_template=self.chat_template,
                                            add_generation_prompt=add_generation_prompt, **self.special, **kwargs)
        return rendered[0]


PROBE_TOOLS = [{"type": "function", "function": {
    "name": "edit", "description": "Apply one repair op to the function.",
    "parameters": {"type": "object", "properties": {"op": {"type": "string"}}, "required": ["op"]}}}]


class _Probe(ToolChat):
    """The shape of this project's conversations (the gym's: a user message; the coding tools': a system message
    first), one tool, one call."""

    tools = PROBE_TOOLS
    system = False

    def messages_for(self, name: str) -> list[dict]:
        opening = [{"role": "user", "content": f"Repair the Python function `{name}`."}]
        return ([{"role": "system", "content": "You repair Python functions."}] if self.system else []) + opening

    def probe_call(self) -> tuple[str, dict]:
        return "edit", {"op": "fix_range"}


class _ProbeWithSystem(_Probe):
    system = True


def chat_template(path: Path, config: dict, field: str) -> tuple[str, str]:
    """(the template, where it was found): chat_template.jinja first, as transformers reads it, then
    tokenizer_config.json's `chat_template` (a string, or a list of named templates whose `default` is used)."""
    if (path / TEMPLATE_FILE).is_file():
        try:
            template = files.read_text(path / TEMPLATE_FILE, files.MAX_RECORD_BYTES, "a chat template")
        except (OSError, files.InputFileError) as exc:
            raise ConfigError(f"{field}: {path / TEMPLATE_FILE} cannot be read ({exc})") from None
        where = str(path / TEMPLATE_FILE)
    else:
        template, where = config.get("chat_template"), f"{path / 'tokenizer_config.json'} (chat_template)"
        if isinstance(template, list):
            template = next((t.get("template") for t in template
                             if isinstance(t, dict) and t.get("name") == "default"), None)
    if not isinstance(template, str) or not template.strip():
        raise ConfigError(f"{field}: {path} has no chat template ({TEMPLATE_FILE}, or chat_template in "
                          "tokenizer_config.json); the conversation format renders every episode with it: copy it "
                          "from the model's source")
    return template, where


def check_template(path: Path, field: str, formats=(_Probe, _ProbeWithSystem)) -> None:
    """The directory's chat template drives each conversation format of `formats` (ToolChat subclasses) through
    their start-up probes, from the tokenizer files."""
    config = _json(path / "tokenizer_config.json", field, "a tokenizer config")
    if not isinstance(config, dict):
        raise ConfigError(f"{field}: {path / 'tokenizer_config.json'} is not a JSON object")
    template, where = chat_template(path, config, field)
    tokenizer = _json(path / "tokenizer.json", field, "a tokenizer", limit=256 * files.MiB)
    if not isinstance(tokenizer, dict):
        raise ConfigError(f"{field}: {path / 'tokenizer.json'} is not a JSON object")
    os.environ.update(OFFLINE)
    for fmt in formats:
        try:
            chat = fmt(TemplateTokenizer(template, tokenizer, config), verify_at_start=False)
            if chat.stop_id is None:
                raise TemplateError(f"its end-of-turn token {chat.end_of_turn!r} is not in tokenizer.json")
        except (TemplateError, TokenInTokenOutError) as exc:
            raise ConfigError(f"{field}: the chat template in {where} cannot drive the conversation format: "
                              f"{str(exc).splitlines()[0][:200]}") from None
        except Exception as exc:   # a template that does not even compile
            raise ConfigError(f"{field}: the chat template in {where} cannot be rendered ({type(exc).__name__}: "
                              f"{str(exc).splitlines()[0][:160] if str(exc) else ''})") from None


def check_model_dir(path, field: str) -> Path:
    """`path` as a Path if it holds a model this project can load and drive (see the module doc), else a one-line
    ConfigError naming `field` and what is wrong."""
    path = Path(path)
    if not path.is_dir():
        raise ConfigError(f"{field}: {path} is not a directory; expected {EXPECTED}")
    config = path / "config.json"
    try:
        model_type = json.loads(files.read_text(config, files.MAX_RECORD_BYTES, "a model config")).get("model_type")
    except (OSError, ValueError, AttributeError, RecursionError):
        raise ConfigError(f"{field}: {config} is missing or not a JSON model config") from None
    if model_type not in MODEL_TYPES:
        raise ConfigError(f"{field}: {config} has model_type {model_type!r}; allowed: "
                          f"{', '.join(map(repr, MODEL_TYPES))}")
    _weights(path, field)
    missing = [f for f in TOKENIZER_FILES if not (path / f).is_file()]
    if missing:
        raise ConfigError(f"{field}: {path} is missing the tokenizer file(s) {', '.join(missing)}")
    check_template(path, field)
    return path
