"""Every Hugging Face model directory is checked before it loads (agentrl.backends.model_dir): config, weights whose
header fits the file, tokenizer files and a chat template the conversation format can drive, each problem one line
naming the field and the file, within a second, without torch; a lab refuses such a directory before anything
else runs. The directories are built here by hand (a few bytes of weights): no test reads a real model."""
from __future__ import annotations

import json
import shutil
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from agentrl.backends import hf
from agentrl.backends.model_dir import TemplateTokenizer, chat_template, check_model_dir
from agentrl.core.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
FIELD = "lab.configs.x.model"
CHATML = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
          "{{ '<|im_start|>system\nYou are a helpful assistant<|im_end|>\n' }}{% endif %}"
          "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"
          "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")   # SmolLM2's, as it ships


def safetensors(tensors: dict[str, int]) -> bytes:
    """A safetensors file of float32 tensors (name -> element count), zeros."""
    header, offset = {}, 0
    for name, n in tensors.items():
        header[name] = {"dtype": "F32", "shape": [n], "data_offsets": [offset, offset + 4 * n]}
        offset += 4 * n
    head = json.dumps(header).encode()
    return struct.pack("<Q", len(head)) + head + b"\0" * offset


def tiny_model_dir(path: Path, model_type: str = "llama", template: str | None = CHATML,
                   template_in_config: bool = False) -> Path:
    """A model directory with every file the check reads: config, weights, tokenizer files, a chat template."""
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps({"model_type": model_type, "vocab_size": 16}))
    (path / "model.safetensors").write_bytes(safetensors({"embed": 64, "norm": 4}))
    vocab = {w: i for i, w in enumerate(["a", "b", "c", "system", "user", "assistant", "tool", "\n"])}
    flags = {"single_word": False, "lstrip": False, "rstrip": False, "normalized": False, "special": True}
    added = [{"id": 8, "content": "<|im_start|>", **flags}, {"id": 9, "content": "<|im_end|>", **flags}]
    (path / "tokenizer.json").write_text(json.dumps({   # a tokenizer the `tokenizers` library loads too
        "version": "1.0", "truncation": None, "padding": None, "added_tokens": added, "normalizer": None,
        "pre_tokenizer": {"type": "Whitespace"}, "post_processor": None, "decoder": None,
        "model": {"type": "WordLevel", "vocab": vocab, "unk_token": "a"}}))
    config = {"bos_token": "<|im_start|>", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>"}
    if template is not None and template_in_config:
        config["chat_template"] = template
    elif template is not None:
        (path / "chat_template.jinja").write_text(template)
    (path / "tokenizer_config.json").write_text(json.dumps(config))
    return path


def refused(path, match: str) -> str:
    with pytest.raises(ConfigError) as err:
        check_model_dir(path, FIELD)
    line = str(err.value)
    assert line.startswith(f"{FIELD}: ") and "\n" not in line and match in line, line
    return line


CHECK = """
import sys
sys.path.insert(0, REPO)
from agentrl.backends.model_dir import check_model_dir
check_model_dir(PATH, "lab.model")
print("torch" in sys.modules)
"""


def _big_weights(path: Path) -> bytes:
    """4 GiB of weights: a sparse file whose header lists them. Returns the header."""
    head = json.dumps({"w": {"dtype": "F32", "shape": [1 << 30], "data_offsets": [0, 4 << 30]}}).encode()
    with open(path / "model.safetensors", "wb") as f:
        f.write(struct.pack("<Q", len(head)) + head)
        f.truncate(8 + len(head) + (4 << 30))
    return head


def test_the_check_reads_the_weights_header_only(tmp_path, monkeypatch):
    from agentrl.backends import model_dir
    path = tiny_model_dir(tmp_path / "m")
    head = _big_weights(path)
    read = []

    class Counting:
        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def read(self, n=-1):
            data = self.f.read(n)
            read.append(len(data))
            return data
    monkeypatch.setattr(model_dir, "open", lambda p, mode="r": Counting(open(p, mode)), raising=False)
    assert check_model_dir(path, FIELD) == path and sum(read) == 8 + len(head)


@pytest.mark.slow   # a fresh interpreter
def test_the_check_imports_no_torch(tmp_path):
    path = tiny_model_dir(tmp_path / "m")
    _big_weights(path)
    code = CHECK.replace("REPO", repr(str(REPO))).replace("PATH", repr(str(path)))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.split() == ["False"], out.stderr


def test_a_whole_directory_passes_whether_its_template_is_a_file_or_in_the_tokenizer_config(tmp_path):
    assert check_model_dir(tiny_model_dir(tmp_path / "m"), FIELD) == tmp_path / "m"
    assert check_model_dir(tiny_model_dir(tmp_path / "c", template_in_config=True), FIELD) == tmp_path / "c"
    named = tiny_model_dir(tmp_path / "n", template=None)
    config = json.loads((named / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "default", "template": CHATML}, {"name": "rag", "template": "x"}]
    (named / "tokenizer_config.json").write_text(json.dumps(config))
    assert check_model_dir(named, FIELD) == named
    assert hf.check_model_dir(tmp_path / "m", FIELD) == tmp_path / "m"   # the backend's check is this one


@pytest.mark.parametrize("name, match", [("config.json", "config.json is missing or not a JSON model config"),
                                         ("model.safetensors", "has no weights"),
                                         ("tokenizer.json", "missing the tokenizer file(s) tokenizer.json"),
                                         ("tokenizer_config.json", "missing the tokenizer file(s) tokenizer_config"),
                                         ("chat_template.jinja", "has no chat template")])
def test_each_file_missing_is_named(tmp_path, name, match):
    path = tiny_model_dir(tmp_path / "m")
    (path / name).unlink()
    refused(path, match)


@pytest.mark.parametrize("cut", [0, 4, 20, -1])
def test_truncated_or_garbage_weights_are_named_before_any_load(tmp_path, cut):
    path = tiny_model_dir(tmp_path / "m")
    data = (path / "model.safetensors").read_bytes()
    (path / "model.safetensors").write_bytes(data[:cut] if cut >= 0 else data[:-10])
    why = refused(path, "model.safetensors").split("model.safetensors", 1)[1]
    assert why.startswith({0: " is empty", -1: " is truncated"}.get(cut, " is not a safetensors file")), why


def test_a_shard_missing_from_a_sharded_model_is_named(tmp_path):
    path = tiny_model_dir(tmp_path / "m")
    (path / "model.safetensors").unlink()
    for i in (1, 2):
        (path / f"model-0000{i}-of-00002.safetensors").write_bytes(safetensors({f"w{i}": 4}))
    (path / "model.safetensors.index.json").write_text(json.dumps({"weight_map": {
        "w1": "model-00001-of-00002.safetensors", "w2": "model-00002-of-00002.safetensors"}}))
    assert check_model_dir(path, FIELD) == path
    (path / "model-00002-of-00002.safetensors").unlink()
    refused(path, "missing the weights shard model-00002-of-00002.safetensors (1 of 2")


@pytest.mark.parametrize("template, match", [
    ("{% for m in messages %}{% if m['role'] == 'tool' %}{{ raise_exception('no tools here') }}{% endif %}"
     "{{ '<|im_start|>' + m['role'] + '\n' + m['content'] + '<|im_end|>\n' }}{% endfor %}"
     "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}",
     "cannot render a tool message"),
    (CHATML.replace("'<|im_end|>' + '\n'", "'\n'"), "not with a special token"),
    (CHATML.replace("{% endfor %}", "{% endfr %}"), "cannot render"),
    ("   ", "has no chat template")])
def test_a_template_the_format_cannot_drive_is_named(tmp_path, template, match):
    line = refused(tiny_model_dir(tmp_path / "m", template=template), match)
    assert "chat template" in line


def test_a_template_whose_end_of_turn_token_is_not_in_the_tokenizer_is_named(tmp_path):
    """The config names <|eot|> a special token (the template's end of turn) that tokenizer.json does not hold."""
    path = tiny_model_dir(tmp_path / "m", template=CHATML.replace("<|im_end|>", "<|eot|>"))
    config = json.loads((path / "tokenizer_config.json").read_text())
    (path / "tokenizer_config.json").write_text(json.dumps({**config, "eos_token": "<|eot|>"}))
    refused(path, "its end-of-turn token '<|eot|>' is not in tokenizer.json")
    tokenizer = json.loads((path / "tokenizer.json").read_text())
    tokenizer["added_tokens"].append({**tokenizer["added_tokens"][0], "id": 10, "content": "<|eot|>"})
    (path / "tokenizer.json").write_text(json.dumps(tokenizer))
    assert check_model_dir(path, FIELD) == path


def test_the_qwen3_template_passes(tmp_path, qwen3_tokenizer):
    """Qwen3's template (tools rendered natively, a thinking switch) in tokenizer_config.json, 11 MB of tokenizer."""
    path = tiny_model_dir(tmp_path / "m", model_type="qwen3", template=None)
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(qwen3_tokenizer / name, path / name)
    assert check_model_dir(path, FIELD) == path


@pytest.mark.slow   # transformers' tokenizer, with torch
def test_the_template_check_reads_the_tokenizer_files_as_transformers_does(qwen3_tokenizer, tmp_path):
    """The start-up probes of both conversation formats give the same answers from the files alone as from
    transformers' own tokenizer (the end-of-turn token and its id, the tool-response block, the format's hash)."""
    from agentrl.env.coding.chat import CodingToolChat
    from agentrl.env.gym.chat import GymToolChat
    smol = tiny_model_dir(tmp_path / "smol")
    for path in (qwen3_tokenizer, smol):
        config = json.loads((path / "tokenizer_config.json").read_text())
        files = TemplateTokenizer(chat_template(path, config, FIELD)[0],
                                  json.loads((path / "tokenizer.json").read_text()), config)
        real = hf.transformers().AutoTokenizer.from_pretrained(path, local_files_only=True)
        for fmt in (GymToolChat, CodingToolChat):
            a, b = fmt(real, verify_at_start=False), fmt(files, verify_at_start=False)
            for key in ("end_of_turn", "stop_id", "pad_id", "native_tools", "thinking_switch", "block_head",
                        "block_tail", "hash"):
                assert getattr(a, key) == getattr(b, key), (path, fmt.__name__, key)


@pytest.mark.slow   # a lab stage process
def test_a_lab_on_a_model_without_its_chat_template_is_refused_in_a_second(tmp_path):
    """The case of the issue: a lab's model is a copy of a model directory without chat_template.jinja. One line
    naming the entry and the directory, exit 2, before torch, the weights or an MLflow run; nothing written."""
    path = tiny_model_dir(tmp_path / "copy")
    (path / "chat_template.jinja").unlink()
    params = yaml.safe_load((REPO / "params.yaml").read_text())
    params["lab"]["configs"]["x"] = {"model": str(path)}
    work = tmp_path / "work"
    work.mkdir()
    (work / "params.yaml").write_text(yaml.safe_dump(params))
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": str(REPO), "MLFLOW_TRACKING_URI": f"sqlite:///{work}/mlflow.db"}
    t0 = time.time()
    out = subprocess.run([sys.executable, "-m", "stages.lab", "--lab", "x", "--seed", "1"], cwd=work, env=env,
                         capture_output=True, text=True, timeout=120)
    elapsed = time.time() - t0
    assert out.returncode == 2 and out.stderr.splitlines() == [
        f"error: {FIELD}: {path} has no chat template (chat_template.jinja, or chat_template in tokenizer_config.json)"
        "; the conversation format renders every episode with it: copy it from the model's source"], out.stderr
    assert sorted(p.name for p in work.iterdir()) == ["params.yaml"] and elapsed < 10
