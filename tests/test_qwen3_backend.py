"""The Qwen3 backend (agentrl.backends.qwen3): a wrong model directory is one line naming it before anything is
loaded; the small Qwen3 made here depends only on the seed, loads back with from_pretrained and the real tokenizer,
and its KV-cached sampler agrees with the trainer's pass to fp32 rounding. The transformers tests are slow tier."""
import hashlib
import json
from pathlib import Path

import pytest
import torch

from agentrl.backends.qwen3 import TOKENIZER_FILES, check_model_dir
from agentrl.core.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "data" / "tokenizers" / "qwen3"


def _model_dir(tmp_path, model_type="qwen3", weights=True, tokenizer=TOKENIZER_FILES):
    d = tmp_path / "m"
    d.mkdir()
    (d / "config.json").write_text(json.dumps({"model_type": model_type}))
    if weights:
        (d / "model.safetensors").write_bytes(b"")
    for name in tokenizer:
        (d / name).write_text("{}")
    return d


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"^lab.model: .*nope is not a directory; expected a Qwen3 model directory"):
        check_model_dir(tmp_path / "nope")


def test_a_directory_without_a_config_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"lab.model: .*config.json is missing or not a JSON model config"):
        check_model_dir(tmp_path)


def test_a_config_of_another_architecture_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"model_type 'llama'; allowed: 'qwen3'"):
        check_model_dir(_model_dir(tmp_path, model_type="llama"))


def test_missing_tokenizer_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"missing the tokenizer file\(s\) tokenizer_config.json"):
        check_model_dir(_model_dir(tmp_path, tokenizer=("tokenizer.json",)))


def test_missing_weights_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"has no weights"):
        check_model_dir(_model_dir(tmp_path, weights=False))



def test_a_complete_directory_passes(tmp_path):
    assert check_model_dir(_model_dir(tmp_path)) == tmp_path / "m"


def _makefile_pin(name: str) -> str:
    line = next(x for x in (REPO / "Makefile").read_text().splitlines() if x.startswith(name + " :="))
    return line.split(":=")[1].strip()


needs_tokenizer = pytest.mark.usefixtures("qwen3_tokenizer")   # fails, never skips, when it is missing


@pytest.mark.slow
@needs_tokenizer
def test_the_fetched_tokenizer_files_are_the_pinned_ones():
    for name, pin in (("tokenizer.json", "QWEN3_TOKENIZER_JSON_SHA256"),
                      ("tokenizer_config.json", "QWEN3_TOKENIZER_CONFIG_SHA256")):
        assert hashlib.sha256((TOKENIZER / name).read_bytes()).hexdigest() == _makefile_pin(pin)


@pytest.fixture(scope="module")
def small_qwen3(tmp_path_factory):
    from agentrl.backends.qwen3 import make_small_qwen3
    return make_small_qwen3(tmp_path_factory.mktemp("q3") / "model", torch.Generator().manual_seed(0), TOKENIZER)


@pytest.mark.slow
@needs_tokenizer
def test_the_small_qwen3_depends_on_the_seed_only_and_loads_back(small_qwen3, tmp_path):
    from agentrl.backends.qwen3 import load_qwen3, load_tokenizer, make_small_qwen3
    desc = small_qwen3.describe()
    assert desc["config"]["vocab_size"] == 151_936 and desc["config"]["tie_word_embeddings"]
    assert desc["config"]["num_hidden_layers"] == 2 and desc["config"]["hidden_size"] == 64
    again = make_small_qwen3(tmp_path / "again", torch.Generator().manual_seed(0), TOKENIZER)
    other = make_small_qwen3(tmp_path / "other", torch.Generator().manual_seed(1), TOKENIZER)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), small_qwen3.parameters()))
    assert not torch.equal(other.lm.model.embed_tokens.weight, small_qwen3.lm.model.embed_tokens.weight)
    assert type(load_qwen3(tmp_path / "again").lm).__name__ == "Qwen3ForCausalLM"
    assert len(load_tokenizer(tmp_path / "again")) == 151_669


@pytest.mark.slow
@needs_tokenizer
def test_the_cached_sampler_agrees_with_the_trainers_pass(small_qwen3):
    """Rows of different prompt lengths, one of which stops early: every sampled token's log-prob equals the
    trainer's full pass (LM head at those positions only) within 1e-5 nats."""
    from agentrl.model.packing import pad_rows
    pad = 151643
    prompts = [list(range(1000, 1000 + n)) for n in (7, 19, 12)]
    g = torch.Generator().manual_seed(3)
    sampler = small_qwen3.sampler(pad)
    logits = sampler.append(prompts)
    seqs, lps = [list(p) for p in prompts], [[] for _ in prompts]
    active = torch.ones(3, dtype=torch.bool)
    with torch.inference_mode():
        for k in range(10):
            rows = active.nonzero().squeeze(1)
            token = torch.multinomial(torch.softmax(logits[rows], -1), 1, generator=g).squeeze(1)
            lp = torch.log_softmax(logits[rows], -1).gather(1, token[:, None]).squeeze(1)
            for r, t, v in zip(rows.tolist(), token.tolist(), lp.tolist()):
                seqs[r].append(t)
                lps[r].append(v)
            step = torch.full((3, 1), pad)
            step[rows, 0] = token
            if k == 4:
                active[1] = False
            logits[active] = sampler.step(step, active.clone())
    ids = pad_rows(seqs, pad)
    at = torch.zeros(ids.shape[0], ids.shape[1] - 1, dtype=torch.bool)
    for r, p in enumerate(prompts):
        at[r, len(p) - 1:len(p) - 1 + len(lps[r])] = True
    with torch.no_grad():
        full = small_qwen3.log_probs(ids, at)[0]
    sampled = torch.zeros_like(full)
    for r, p in enumerate(prompts):
        sampled[r, len(p) - 1:len(p) - 1 + len(lps[r])] = torch.tensor(lps[r])
    assert float(((full - sampled).abs() * at).max()) < 1e-5
    assert float(full[~at].abs().max()) == 0.0   # the LM head ran at the marked positions only
