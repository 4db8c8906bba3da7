"""TinyAgent's block is its declaration: a subclass that edits it (the activation, the MLP's width) changes the model
on the trainer's packed pass, the sampler's cached pass and the one-call decode step alike, with the same bits on
each; a module the kernels do not compute, or a declared module a pass never computes, is refused at build in one
line; a structural edit decode cannot run samples layer by layer, said in one short line. `never_computed` is the
generic check that every declared module changes the block's output; it fails on planted defects."""
from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
import torch.nn as nn

from agentrl.core.knobs import ConfigError
from agentrl.model.block import Block, compute, layout
from agentrl.model.cache import Chunk, KVCache
from agentrl.model.kernels.registry import KERNELS
from agentrl.model.policy import ModelConfig, TinyAgent

CFG = ModelConfig(vocab_size=40, d_model=16, n_layer=2, n_head=2, d_ff=32, max_len=64)
SUPPORTED = "supported: Linear, LayerNorm, GELU(approximate='none'), ReLU, and nn.Sequential of them"


class ReluBlock(Block):
    """The declaration says ReLU."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.mlp[1] = nn.ReLU()


class WideBlock(Block):
    """An MLP twice as wide."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, 2 * cfg.d_ff), nn.GELU(), nn.Linear(2 * cfg.d_ff, cfg.d_model))


class WideReluBlock(WideBlock):
    def __init__(self, cfg):
        super().__init__(cfg)
        self.mlp[1] = nn.ReLU()


class NoBiasNormBlock(Block):
    """Layer norms without a bias: a tensor decode takes is missing."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model, bias=False), nn.LayerNorm(cfg.d_model, bias=False)


class OtherEpsBlock(Block):
    """Layer norms of another eps than the model's final one: decode takes one eps for every norm."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.ln1, self.ln2 = nn.LayerNorm(cfg.d_model, eps=1e-2), nn.LayerNorm(cfg.d_model, eps=1e-2)


class TrailingReluBlock(Block):
    """The same tensors, one more activation after the MLP: a module decode does not have."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.mlp.append(nn.ReLU())


class HalfResidualBlock(Block):
    """The same modules, another computation around them: only decode's probe can see it."""

    def forward(self, x, starts, ops):
        x = x + self.attn(compute(self.ln1, x, ops), starts, ops)
        return x + 0.5 * compute(self.mlp, compute(self.ln2, x, ops), ops)

    def cached(self, x, chunk, keys, values, valid, ops):
        x = x + self.attn.cached(compute(self.ln1, x, ops), chunk, keys, values, valid, ops)
        return x + 0.5 * compute(self.mlp, compute(self.ln2, x, ops), ops)


class IgnoresItsActivation(ReluBlock):
    """Planted defect: the trainer's pass hard-codes GELU, whatever the declaration says."""

    def forward(self, x, starts, ops):
        x = x + self.attn(compute(self.ln1, x, ops), starts, ops)
        up, _, down = self.mlp
        return x + compute(down, ops.gelu(compute(up, compute(self.ln2, x, ops), ops)), ops)


class DeclaredNeverUsed(Block):
    """Planted defect: a declared module that nothing calls."""

    def __init__(self, cfg):
        super().__init__(cfg)
        self.out_norm = nn.LayerNorm(cfg.d_model)


def with_block(block_class):
    return type(f"TinyAgentWith{block_class.__name__}", (TinyAgent,), {"block": block_class})


# ---------------------------------------------------------------- every declared module changes the output

SWAP = {nn.GELU: nn.ReLU, nn.ReLU: nn.GELU}   # an activation -> another one the kernels compute


def block_passes(block, x, ops=KERNELS["fixed"]):
    """x [6, D], two rows of three tokens, through the block's packed pass and its cached pass."""
    heads = block.attn.n_head
    valid = torch.ones(2, 3, dtype=torch.bool)
    cache = KVCache(1, heads, x.shape[1] // heads)
    chunk = Chunk(valid, cache, cache.append(valid), packed=False)
    with torch.no_grad():
        return block(x, torch.tensor([0, 3, 6]), ops), block.cached(x, chunk, *cache.layer(0), cache.valid, ops)


def never_computed(block: nn.Module) -> list[str]:
    """The names of the block's leaf modules whose perturbation leaves its packed or its cached pass unchanged on a
    probe (a Linear's or LayerNorm's tensors redrawn, a LayerNorm without tensors given another eps, an activation
    swapped for another one the kernels compute): a declared module that a pass does not compute."""
    g = torch.Generator().manual_seed(0)
    base = copy.deepcopy(block).requires_grad_(False)
    for p in base.parameters():
        p.copy_(torch.randn(p.shape, generator=g) * 0.5)
    x = torch.randn(6, block.attn.proj.out_features, generator=g)
    reference = block_passes(base, x)
    out = []
    for name, module in base.named_modules():
        if next(module.children(), None) is not None or type(module) is nn.Sequential:
            continue
        probe = copy.deepcopy(base)
        leaf = probe.get_submodule(name)
        if next(leaf.parameters(), None) is not None:
            for p in leaf.parameters():
                p.copy_(torch.randn(p.shape, generator=g) * 0.5)
        elif isinstance(leaf, nn.LayerNorm):
            leaf.eps = 0.5
        else:
            parent, _, attr = name.rpartition(".")
            setattr(probe.get_submodule(parent), attr, SWAP[type(leaf)]())
        if any(torch.equal(a, b) for a, b in zip(block_passes(probe, x), reference)):
            out.append(name)
    return out


@pytest.mark.parametrize("block_class", [Block, ReluBlock, WideBlock, WideReluBlock, NoBiasNormBlock,
                                         TrailingReluBlock])
def test_every_declared_module_changes_the_output(block_class):
    assert never_computed(block_class(CFG)) == []


@pytest.mark.parametrize("defect, unused, refusal", [
    (IgnoresItsActivation, ["mlp.1"],
     "IgnoresItsActivation.mlp.1: ReLU is declared but the block's forward pass never computes it "
     "(agentrl.model.block.compute)"),
    (DeclaredNeverUsed, ["out_norm"],
     "DeclaredNeverUsed.out_norm: LayerNorm is declared but the block's forward pass never computes it "
     "(agentrl.model.block.compute)")])
def test_a_declared_module_nothing_computes_is_found_and_refused_at_build(defect, unused, refusal):
    assert never_computed(defect(CFG)) == unused   # the check fails on the planted defect
    with pytest.raises(ConfigError) as err:
        with_block(defect)(CFG)
    assert str(err.value) == refusal


# ---------------------------------------------------------------- an edit of the declaration, on every path

IDS = torch.tensor([[1, 5, 7, 9, 11], [1, 6, 8, 3, 2]])


def every_path(model):
    """The logits after each token of two rows: the trainer's packed pass, the sampler's cached pass through the
    model's decode step (if it has one) and layer by layer on the same kernels, and CachedSampler's after its last
    two tokens."""
    kernels = model.kernels
    out = {"trainer": model(IDS).detach()}
    for path, ks in (("sampler", kernels), ("layer by layer", replace(kernels, decode=None))):
        model.kernels = ks
        with torch.no_grad():
            out[path] = model.forward_cached(IDS, torch.arange(5).repeat(2, 1), torch.ones(2, 5, dtype=torch.bool),
                                             model.new_cache())
    model.use_kernels(kernels.name)
    sampler = model.sampler(pad_id=0)
    with torch.no_grad():
        first = sampler.append([row[:4].tolist() for row in IDS])
        then = sampler.step(IDS[:, 4:], torch.ones(2, dtype=torch.bool))
    out["sampler's steps"] = torch.stack([first, then], 1)   # after tokens 3 and 4 of each row
    return out


def test_the_shipped_block_is_the_block_decode_declares_and_samples_through_it(capsys):
    model = TinyAgent(CFG)
    declared = KERNELS["fixed"].decode_layout()
    assert layout(model.blocks[0]) == declared and len(declared) == 12
    assert KERNELS["fixed"].decode_activation() == ("mlp.1", ("gelu", "relu"))
    assert model.decode_step().keywords == {"activations": ["gelu", "gelu"]}
    assert len(model.decode_weights()) == 12 * CFG.n_layer + 3
    out = every_path(model)
    assert all(torch.equal(out["trainer"], out[path]) for path in ("sampler", "layer by layer"))
    assert torch.equal(out["sampler's steps"], out["trainer"][:, 3:5])
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("block_class, activation", [(ReluBlock, "relu"), (WideBlock, "gelu"),
                                                     (WideReluBlock, "relu")])
def test_an_edit_of_the_declaration_changes_the_model_on_every_path(block_class, activation, capsys):
    shipped = TinyAgent(CFG, torch.Generator().manual_seed(1))
    model = with_block(block_class)(CFG, torch.Generator().manual_seed(1))
    if block_class is ReluBlock:   # the same weights, another activation
        assert all(torch.equal(a, b) for a, b in zip(shipped.state_dict().values(), model.state_dict().values()))
    assert model.decode_step().keywords == {"activations": [activation] * CFG.n_layer}   # decode runs it too
    out = every_path(model)
    assert not torch.equal(out["trainer"], shipped(IDS))
    assert all(torch.equal(out["trainer"], out[path]) for path in ("sampler", "layer by layer"))
    assert torch.equal(out["sampler's steps"], out["trainer"][:, 3:5])
    with torch.no_grad():   # PyTorch's operators compute the same edited model
        reference = model.use_kernels("torch")(IDS)
        assert float((reference - out["trainer"]).abs().max()) < 1e-5
        assert float((reference - shipped.use_kernels("torch")(IDS)).abs().max()) > 1e-3
    assert capsys.readouterr().err == ""


@pytest.mark.parametrize("module", [nn.SiLU(), nn.Tanh(), nn.GELU(approximate="tanh")])
@pytest.mark.parametrize("kernels", ["fixed", "torch"])
def test_a_module_the_kernels_do_not_compute_is_refused_at_build_in_one_line(module, kernels):
    class OtherActivationBlock(Block):
        def __init__(self, cfg):
            super().__init__(cfg)
            self.mlp[1] = copy.deepcopy(module)

    with pytest.raises(ConfigError) as err:
        with_block(OtherActivationBlock)(CFG, kernels=kernels)
    name = "GELU(approximate='tanh')" if isinstance(module, nn.GELU) else type(module).__name__
    assert str(err.value) == f"OtherActivationBlock.mlp.1: {name} is not computed by TinyAgent's kernels; {SUPPORTED}"


# ---------------------------------------------------------------- what decode cannot run: layer by layer, one line

@pytest.mark.parametrize("block_class, reason", [
    (NoBiasNormBlock, "no ln1.bias, ln2.bias"),
    (OtherEpsBlock, "layer norm eps 0.01, ln_f's 1e-05"),
    (TrailingReluBlock, "an extra mlp.3 (relu)"),
    (HalfResidualBlock, "other bits than decode on a probe")])
def test_a_block_decode_cannot_run_samples_layer_by_layer_said_in_one_short_line(block_class, reason, capsys):
    model = with_block(block_class)(CFG, torch.Generator().manual_seed(2))
    err = capsys.readouterr().err
    assert err == (f"warning: {block_class.__name__}: fixed decode cannot run it ({reason}); sampling layer by layer "
                   f"on the same kernels, about 2x the rollout time\n")
    assert len(err) < 170
    assert model.decode_step() is None and model.decode_weights() is None
    out = every_path(model)
    assert torch.equal(out["trainer"], out["sampler"]) and torch.equal(out["sampler's steps"], out["trainer"][:, 3:5])
    with_block(block_class)(CFG)
    assert capsys.readouterr().err == ""   # once per block declaration
