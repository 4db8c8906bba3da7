"""TinyAgent's block against the one declaration of it that the sampler's decode step runs (fixed.cpp's BLOCK_LAYOUT,
read through KernelSet.decode_layout): the shipped block matches it and samples through decode; a block changed in a
subclass -- in its tensors, or only in what it computes -- is caught at start-up, said in one line with what decode
expects, and samples layer by layer with the trainer's bits, never silently different."""
from __future__ import annotations

import torch
import torch.nn as nn

from agentrl.model.block import Block, decode_mismatch, layout
from agentrl.model.kernels.registry import KERNELS
from agentrl.model.policy import ModelConfig, TinyAgent

CFG = ModelConfig(vocab_size=40, d_model=16, n_layer=2, n_head=2, d_ff=32, max_len=64)


class NoBiasNormBlock(Block):
    """Layer norms without a bias: a tensor decode takes is missing."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model, bias=False), nn.LayerNorm(cfg.d_model, bias=False)


class ReluBlock(Block):
    """The same tensors, another MLP: only the probe can see it."""

    def _mlp(self, x, ops):
        up, _, down = self.mlp
        h = nn.functional.layer_norm(x, x.shape[-1:], self.ln2.weight, self.ln2.bias, self.ln2.eps)
        return ops.linear(torch.relu(ops.linear(h, up.weight, up.bias)), down.weight, down.bias)


def with_block(block_class):
    return type(f"TinyAgentWith{block_class.__name__}", (TinyAgent,), {"block": block_class})


def sampled_and_trained(model):
    """The sampler's logits after each token of two rows (its KV-cached pass) and the trainer's at the same
    positions (the packed pass)."""
    ids = torch.tensor([[1, 5, 7, 9, 11], [1, 6, 8, 3, 2]])
    with torch.no_grad():
        cache = model.new_cache()
        cached = model.forward_cached(ids, torch.arange(5).repeat(2, 1), torch.ones(2, 5, dtype=torch.bool), cache)
        packed = model(ids)
    return cached, packed


def test_the_shipped_block_is_the_block_decode_declares_and_samples_through_it(capsys):
    model = TinyAgent(CFG)
    declared = KERNELS["fixed"].decode_layout()
    assert layout(model.blocks[0]) == declared and len(declared) == 12
    assert {role for _, role in declared} == {"layer_norm.weight", "layer_norm.bias", "linear.weight", "linear.bias"}
    assert model.decode_step() is KERNELS["fixed"].decode and decode_mismatch(model.blocks[0], model.kernels) is None
    assert len(model.decode_weights()) == 12 * CFG.n_layer + 3
    cached, packed = sampled_and_trained(model)
    assert torch.equal(cached, packed)
    assert capsys.readouterr().err == ""


def test_a_block_with_other_tensors_is_refused_by_decode_in_one_line_and_samples_layer_by_layer(capsys):
    model = with_block(NoBiasNormBlock)(CFG)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and err.startswith(
        "warning: NoBiasNormBlock: the fixed kernels' decode step runs a block of ln1.weight (layer_norm.weight), "
        "ln1.bias (layer_norm.bias),")
    assert "and its tensors are ln1.weight (layer_norm.weight), attn.qkv.weight" in err
    assert "samples layer by layer on the same kernels (the trainer's bits), about" in err
    assert model.decode_step() is None and model.decode_weights() is None
    cached, packed = sampled_and_trained(model)
    assert torch.equal(cached, packed)
    with_block(NoBiasNormBlock)(CFG)
    assert capsys.readouterr().err == ""   # once per block class


def test_a_block_that_only_computes_something_else_is_caught_by_the_probe(capsys):
    model = with_block(ReluBlock)(CFG)
    assert layout(model.blocks[0]) == KERNELS["fixed"].decode_layout()   # the tensors alone cannot tell
    cached, packed = sampled_and_trained(model)
    assert torch.equal(cached, packed)   # through decode, sampling would have drawn from the GELU block
    assert model.decode_step() is None
    err = capsys.readouterr().err
    assert "ReluBlock" in err and "its layer-by-layer pass computes other bits than decode's on a probe" in err
