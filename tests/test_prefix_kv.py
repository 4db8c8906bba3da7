"""The sampler's shared prefix kept once (agentrl.backends.hf_sampler PREFIX_KV `once`): the attention over it equals
a plain softmax over the prefix and the row's own slots, and a sampler that keeps it once gives the same logits as one
that copies it into every row, through appends, decode steps, inactive rows and rows leaving. Tiny random decoders
made from a config (no tokenizer, no weights on disk): the fast tier."""
from __future__ import annotations

import pytest
import torch

from agentrl.backends.hf import HFPolicy
from agentrl.backends.hf_sampler import _SAMPLING_CACHE, prefix_once_attention
from agentrl.model import floors

PAD = 0


def tiny(model_type: str) -> HFPolicy:
    torch.manual_seed(0)
    config = {"model_type": model_type, "vocab_size": 97, "hidden_size": 48, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 8,
              "max_position_embeddings": 256, "tie_word_embeddings": True}
    return HFPolicy.from_config(config).eval()


class _Layer:
    def __init__(self, keys, values):
        self.prefix_keys, self.prefix_values = keys, values


class _Cache:
    def __init__(self, keys, values):
        self.layers = [_Layer(keys, values)]


class _Module:
    layer_idx = 0


def test_prefix_once_attention_is_one_softmax_over_the_prefix_and_the_rows_own_slots():
    """R=3 rows, H=6 query heads over K=2 key-value heads, L=2 new slots, S=4 own slots (some masked), n=5 prefix
    positions: against softmax(q k^T * scale + mask) v over the prefix repeated into every row, heads repeated as
    transformers' repeat_kv does."""
    g = torch.Generator().manual_seed(1)
    R, H, K, L, S, n, d = 3, 6, 2, 2, 4, 5, 8
    q = torch.randn(R, H, L, d, generator=g)
    k, v = torch.randn(R, K, S, d, generator=g), torch.randn(R, K, S, d, generator=g)
    kp, vp = torch.randn(1, K, n, d, generator=g), torch.randn(1, K, n, d, generator=g)
    mask = torch.ones(R, 1, L, S, dtype=torch.bool)
    mask[0, 0, :, 1] = False          # a padded slot of row 0
    mask[2, 0, 0, 3] = False          # causal: the first new slot does not see the second
    token = _SAMPLING_CACHE.set(_Cache(kp, vp))
    try:
        out, weights = prefix_once_attention(_Module(), q, k, v, mask, scaling=0.3)
    finally:
        _SAMPLING_CACHE.reset(token)
    assert weights is None and out.shape == (R, L, H, d)
    keys = torch.cat([kp.expand(R, -1, -1, -1), k], 2).repeat_interleave(H // K, 1)
    values = torch.cat([vp.expand(R, -1, -1, -1), v], 2).repeat_interleave(H // K, 1)
    scores = q @ keys.transpose(-1, -2) * 0.3
    scores[..., n:] = scores[..., n:].masked_fill(~mask, float("-inf"))
    expected = (torch.softmax(scores, -1) @ values).transpose(1, 2)
    assert torch.allclose(out, expected, atol=1e-6)


@pytest.mark.parametrize("model_type", ["llama", "qwen3"])
def test_a_prefix_kept_once_samples_what_a_prefix_in_every_row_samples(model_type):
    """Four rows sharing a 20-token prompt prefix, own parts of 3-11 tokens; 6 decode steps with row 1 idle from the
    third, row 2 leaving (keep), then a tool result of different lengths appended and 3 more steps: every logit
    within 1e-5 of the `repeat` sampler's, the prefix's keys and values held once (one row, not four)."""
    model = tiny(model_type)
    g = torch.Generator().manual_seed(2)
    prefix = torch.randint(1, 97, (20,), generator=g).tolist()
    prompts = [prefix + torch.randint(1, 97, (m,), generator=g).tolist() for m in (3, 11, 7, 5)]
    tokens = torch.randint(1, 97, (9, 4), generator=g)
    results = [torch.randint(1, 97, (m,), generator=g).tolist() for m in (4, 1, 6)]

    def run(prefix_kv: str):
        model.prefix_kv = prefix_kv
        sampler = model.sampler(PAD)
        active = torch.ones(4, dtype=torch.bool)
        with torch.inference_mode():
            seen = [sampler.append(prompts)]
            for k in range(6):
                if k == 2:
                    active[1] = False
                out = sampler.step(torch.where(active, tokens[k], PAD)[:, None], active.clone())
                seen.append(out)
            sampler.keep(torch.tensor([0, 1, 3]))
            seen.append(sampler.append(results))
            for k in range(6, 9):
                seen.append(sampler.step(tokens[k, :3, None], torch.ones(3, dtype=torch.bool)))
        return sampler, seen

    repeated, expected = run("repeat")
    once, got = run("once")
    assert once.prefix_apart and not repeated.prefix_apart and once.prefix_tokens == 20
    assert all(layer.prefix_keys.shape[0] == 1 and layer.prefix_keys.shape[2] == 20 for layer in once.cache.layers)
    assert once.cache.layers[0].slots == repeated.cache.layers[0].slots - 20
    for a, b in zip(got, expected):
        assert a.shape == b.shape
        assert float((a - b).abs().max()) < 1e-5
    assert model.lm.config._attn_implementation == "sdpa"   # switched for the sampler's forwards only


def test_a_batch_without_a_shared_prefix_samples_as_before():
    """No prefix of MIN_SHARED_PREFIX tokens: `once` has nothing to keep apart and is `repeat`, bit for bit."""
    model = tiny("llama")
    prompts = [[5, 6, 7, 8], [9, 10, 11]]
    out = {}
    for mode in ("repeat", "once"):
        model.prefix_kv = mode
        sampler = model.sampler(PAD)
        with torch.inference_mode():
            out[mode] = (sampler.append(prompts), sampler.step(torch.tensor([[3], [4]]), torch.ones(2, dtype=bool)))
        assert not sampler.prefix_apart
    assert all(torch.equal(a, b) for a, b in zip(out["repeat"], out["once"]))


def test_an_unknown_prefix_kv_names_the_allowed_values():
    model = tiny("llama")
    model.prefix_kv = "twice"
    with pytest.raises(ValueError, match=r"^prefix_kv: unknown value 'twice'; allowed: repeat, once$"):
        model.sampler(PAD)


def test_once_refuses_a_model_whose_attention_has_a_sliding_window():
    """prefix_once_attention is full causal attention: a Qwen3 with sliding-window layers is refused in one line
    naming the field and what it allows, before any forward; `repeat` (transformers' own attention) still serves it."""
    torch.manual_seed(0)
    config = {"model_type": "qwen3", "vocab_size": 97, "hidden_size": 48, "intermediate_size": 96,
              "num_hidden_layers": 2, "num_attention_heads": 6, "num_key_value_heads": 2, "head_dim": 8,
              "max_position_embeddings": 256, "use_sliding_window": True, "sliding_window": 8, "max_window_layers": 0}
    model = HFPolicy.from_config(config).eval()
    model.prefix_kv = "once"
    with pytest.raises(ValueError, match=r"^prefix_kv: 'once' needs full causal attention in every layer; this model "
                                         r"has sliding_attention; allowed for it: repeat$"):
        model.sampler(PAD)
    model.prefix_kv = "repeat"
    assert model.sampler(PAD).prefix_kv == "repeat"


def test_a_decode_steps_floor_reads_a_prefix_kept_once_once():
    """Hand-counted: 2 layers, 1 KV head of 4, fp32; 3 rows at 10 positions, 6 of them a shared prefix: the KV cache
    is 2 * 2*1*4 * 4 bytes = 64 bytes a position, (6 + 4 * 3) positions kept once, 10 * 3 in every row."""
    s = floors.Shapes(layers=2, hidden=4, heads=1, kv_heads=1, head_dim=4, intermediate=8, vocab=10, parameters=100)
    weights = s.linear_weights * 4
    assert floors.decode_step(s, 3, 10, "fp32")[1] == weights + 64 * 30
    assert floors.decode_step(s, 3, 10, "fp32", shared=6)[1] == weights + 64 * 18
    assert floors.decode_step(s, 3, 10, "fp32", shared=6)[0] == floors.decode_step(s, 3, 10, "fp32")[0]
