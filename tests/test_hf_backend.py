"""The Hugging Face backend (agentrl.backends.hf): a wrong model directory, an unsupported architecture or corrupted
weights are one line naming them before any compute; the small Qwen3 made here depends only on the seed, loads back
with from_pretrained and the real tokenizer; its KV-cached sampler, with the prompts' shared prefix computed once,
agrees with the trainer's pass to fp32 rounding; a Llama (SmolLM2's architecture) goes through the same code. The
transformers tests are slow tier."""
import hashlib
from pathlib import Path

import pytest
import torch

from agentrl.backends.hf import TOKENIZER_FILES, check_model_dir
from agentrl.core.config import ConfigError

REPO = Path(__file__).resolve().parents[1]
TOKENIZER = REPO / "data" / "tokenizers" / "qwen3"


def _model_dir(tmp_path, model_type="qwen3", weights=True, tokenizer=TOKENIZER_FILES):
    from test_model_dir import tiny_model_dir  # every file the check reads (tests/test_model_dir.py: the rest)
    d = tiny_model_dir(tmp_path / "m", model_type=model_type)
    if not weights:
        (d / "model.safetensors").unlink()
    for name in set(TOKENIZER_FILES) - set(tokenizer):
        (d / name).unlink()
    return d


def test_a_missing_directory_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"^lab.model: .*nope is not a directory; expected a Hugging Face model"):
        check_model_dir(tmp_path / "nope", "lab.model")


def test_a_directory_without_a_config_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"lab.model: .*config.json is missing or not a JSON model config"):
        check_model_dir(tmp_path, "lab.model")


def test_a_config_of_another_architecture_is_named(tmp_path):
    with pytest.raises(ConfigError, match=r"model_type 'gpt2'; allowed: 'qwen3', 'llama'"):
        check_model_dir(_model_dir(tmp_path, model_type="gpt2"), "lab.model")


def test_missing_tokenizer_files_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"missing the tokenizer file\(s\) tokenizer_config.json"):
        check_model_dir(_model_dir(tmp_path, tokenizer=("tokenizer.json",)), "lab.model")


def test_missing_weights_are_named(tmp_path):
    with pytest.raises(ConfigError, match=r"has no weights"):
        check_model_dir(_model_dir(tmp_path, weights=False), "lab.model")



def test_a_complete_directory_passes(tmp_path):
    assert check_model_dir(_model_dir(tmp_path), "lab.model") == tmp_path / "m"
    (tmp_path / "x").mkdir()
    assert check_model_dir(_model_dir(tmp_path / "x", model_type="llama"), "lab.model") == tmp_path / "x" / "m"


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
    from agentrl.backends.hf import make_small_model
    return make_small_model(tmp_path_factory.mktemp("q3") / "model", torch.Generator().manual_seed(0), TOKENIZER)


@pytest.mark.slow
@needs_tokenizer
def test_the_small_qwen3_depends_on_the_seed_only_and_loads_back(small_qwen3, tmp_path):
    from agentrl.backends.hf import load_model, load_tokenizer, make_small_model
    from agentrl.backends.registry import from_description
    desc = small_qwen3.describe()
    assert desc["backend"] == "hf" and desc["config"]["model_type"] == "qwen3"
    assert desc["config"]["vocab_size"] == 151_936 and desc["config"]["tie_word_embeddings"]
    assert desc["config"]["num_hidden_layers"] == 2 and desc["config"]["hidden_size"] == 64
    again = make_small_model(tmp_path / "again", torch.Generator().manual_seed(0), TOKENIZER)
    other = make_small_model(tmp_path / "other", torch.Generator().manual_seed(1), TOKENIZER)
    assert all(torch.equal(a, b) for a, b in zip(again.parameters(), small_qwen3.parameters()))
    assert not torch.equal(other.lm.get_input_embeddings().weight, small_qwen3.lm.get_input_embeddings().weight)
    assert type(load_model(tmp_path / "again").lm).__name__ == "Qwen3ForCausalLM"
    assert len(load_tokenizer(tmp_path / "again")) == 151_669
    rebuilt = from_description(desc)
    assert type(rebuilt.lm).__name__ == "Qwen3ForCausalLM" and rebuilt.num_params() == small_qwen3.num_params()


@pytest.mark.slow
@needs_tokenizer
def test_corrupted_weights_are_one_line_naming_the_file(small_qwen3, tmp_path):
    import shutil

    from agentrl.backends.hf import load_model
    from agentrl.core.knobs import ConfigError
    shutil.copytree(small_qwen3_dir(small_qwen3), tmp_path / "m")
    weights = tmp_path / "m" / "model.safetensors"
    whole = weights.read_bytes()
    weights.write_bytes(b"\x00" * 64)   # caught by the directory check (agentrl.backends.model_dir), before loading
    with pytest.raises(ConfigError, match=r"^lab.model: .*model.safetensors is not a safetensors file") as err:
        load_model(tmp_path / "m", "lab.model")
    assert "\n" not in str(err.value)
    weights.write_bytes(whole[: len(whole) // 2])   # its header whole, its tensors cut off
    with pytest.raises(ConfigError, match=r"^lab.model: .*model.safetensors") as err:
        load_model(tmp_path / "m", "lab.model")
    assert "\n" not in str(err.value)


def small_qwen3_dir(model) -> Path:
    return Path(model.lm.name_or_path)


@pytest.mark.slow
@needs_tokenizer
def test_a_llama_goes_through_the_same_backend(tmp_path):
    """SmolLM2's architecture, small: made, saved, loaded back as LlamaForCausalLM, sampled with a shared prefix."""
    from agentrl.backends.hf import make_small_model
    model = make_small_model(tmp_path / "llama", torch.Generator().manual_seed(0), TOKENIZER, model_type="llama")
    assert type(model.lm).__name__ == "LlamaForCausalLM" and model.model_type == "llama"
    check_sampler_against_trainer(model, shared=20)


@pytest.mark.slow
@needs_tokenizer
def test_the_cached_sampler_agrees_with_the_trainers_pass(small_qwen3):
    """Rows of different prompt lengths, one of which stops early: every sampled token's log-prob equals the
    trainer's full pass (LM head at those positions only) within 1e-5 nats; without a shared prefix, and with one
    of 20 tokens (computed once for the batch)."""
    check_sampler_against_trainer(small_qwen3, shared=0)
    sampler = check_sampler_against_trainer(small_qwen3, shared=20)
    assert sampler.prefix_tokens == 20


def check_sampler_against_trainer(model, shared: int):
    from agentrl.model.packing import pad_rows
    pad = 151643
    prompts = [list(range(500, 500 + shared)) + list(range(1000 + 7 * n, 1000 + 8 * n)) for n in (7, 19, 12)]
    g = torch.Generator().manual_seed(3)
    sampler = model.sampler(pad)
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
        full = model.log_probs(ids, at)[0]
    sampled = torch.zeros_like(full)
    for r, p in enumerate(prompts):
        sampled[r, len(p) - 1:len(p) - 1 + len(lps[r])] = torch.tensor(lps[r])
    assert float(((full - sampled).abs() * at).max()) < 1e-5
    assert float(full[~at].abs().max()) == 0.0   # the LM head ran at the marked positions only
    return sampler


@pytest.mark.slow
@needs_tokenizer
def test_the_trainers_shared_prefix_pass_equals_the_full_pass_values_and_gradients(small_qwen3, monkeypatch):
    """Rows that share a 24-token prompt (one right-padded): the pass that computes the prefix once and shares its
    keys and values gives the same log-probs and the same parameter gradients as one full pass per row; a batch
    whose rows share less than MIN_SHARED_PREFIX tokens takes the full pass."""
    from agentrl.backends import hf
    g = torch.Generator().manual_seed(5)
    prefix = torch.randint(500, 5000, (24,), generator=g)
    ids = torch.cat([prefix.expand(3, -1), torch.randint(500, 5000, (3, 9), generator=g)], 1)
    ids[2, -3:] = 151643
    at = torch.zeros(3, ids.shape[1] - 1, dtype=torch.bool)
    at[:, 23:] = True
    assert hf.common_prefix(ids) == 24 and hf.common_prefix(ids[:1]) == ids.shape[1] - 1

    def pass_and_grads():
        small_qwen3.zero_grad()
        logp = small_qwen3.log_probs(ids, at)[0]
        (logp * torch.linspace(-1, 1, logp.shape[1])).sum().backward()
        return logp.detach(), [p.grad.clone() for p in small_qwen3.parameters() if p.grad is not None]
    shared, shared_grads = pass_and_grads()
    calls = []
    decoder = type(small_qwen3.decoder).forward
    monkeypatch.setattr(type(small_qwen3.decoder), "forward", lambda self, *a, **k: calls.append(
        k["input_ids"].shape) or decoder(self, *a, **k))
    monkeypatch.setattr(hf, "MIN_SHARED_PREFIX", 10**6)
    full, full_grads = pass_and_grads()
    assert calls == [ids.shape]   # one full pass when sharing is off
    assert float((shared - full).abs().max()) < 1e-5
    assert len(shared_grads) == len(full_grads)
    assert max(float((a - b).abs().max() / (b.abs().max() + 1e-12)) for a, b in zip(shared_grads, full_grads)) < 1e-4


@pytest.mark.slow
@needs_tokenizer
def test_a_pass_without_gradient_takes_at_most_no_grad_rows_rows_at_a_time(small_qwen3, monkeypatch):
    """An evaluation scores every episode at once (action_entropy: 400 episodes of a HumanEval lab); the decoder pass
    keeps every row's keys and values, so without gradient it runs NO_GRAD_ROWS rows at a time, giving the rows' own
    log-probs and entropies; a pass with gradient (a training batch) stays whole."""
    from agentrl.backends import hf
    g = torch.Generator().manual_seed(7)
    ids = torch.cat([torch.randint(500, 5000, (1, 20), generator=g).expand(7, -1),
                     torch.randint(500, 5000, (7, 6), generator=g)], 1)
    at = torch.rand(7, ids.shape[1] - 1, generator=g) < 0.5
    with torch.no_grad():
        whole = small_qwen3.log_probs(ids, at, entropy=True)
    calls = []
    decoder = type(small_qwen3.decoder).forward
    monkeypatch.setattr(type(small_qwen3.decoder), "forward", lambda self, *a, **k: calls.append(
        k["input_ids"].shape[0]) or decoder(self, *a, **k))
    monkeypatch.setattr(hf, "NO_GRAD_ROWS", 3)
    with torch.no_grad():
        chunked = small_qwen3.log_probs(ids, at, entropy=True)
    assert calls == [1, 3, 1, 3, 1]   # per chunk of 3 the shared prefix once, then its rows; the last row alone
    for a, b in zip(whole, chunked):
        assert a.shape == b.shape == at.shape and float((a - b).abs().max()) < 1e-5
    assert float(chunked[0][~at].abs().max()) == 0.0
    calls.clear()
    small_qwen3.log_probs(ids, at)[0].sum().backward()
    assert calls == [1, 7]
    small_qwen3.zero_grad()
