"""TinyAgent's kernels as differentiable functions, and the two kernel sets a model can run on.

    KERNELS["fixed"]   fixed.cpp: every result is defined by a fixed order of operations (the default; the same
                       bits on any CPU vendor and vector width, at any thread count, for any batch composition)
    KERNELS["torch"]   PyTorch's own operators (F.linear on MKL, scaled_dot_product_attention, F.gelu on oneDNN):
                       the plain implementation, kept as the baseline `bench` measures against and as an independent
                       check of the fixed kernels (tests/test_kernels.py)

A kernel set has: linear(x, weight, bias), gelu(x), relu(x), attention(q, k, v, starts) over packed rows (q, k, v
[N, H, Dh]; row b is tokens starts[b]..starts[b+1]-1, causal within the row) and attention_cached(q, row, slot, keys,
values, valid) over a KV cache (agentrl.model.cache), and optionally decode(...): the sampler's pass through every
block in one call, with decode_layout(), the block it runs tensor by tensor, and decode_activation(), the block's
module without tensors and the activations decode computes there (agentrl.model.block holds a model's block against
both). `exp` and `sqrt` below are the fixed kernels for any float32 CPU tensor (PyTorch's otherwise): MKL computes
torch.exp and torch.sqrt with code that depends on the CPU.
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from agentrl.model.kernels.build import load
from agentrl.model.kernels.registry import KERNELS


def _fixed_eligible(x: torch.Tensor) -> bool:
    return x.device.type == "cpu" and x.dtype == torch.float32


# ---------------------------------------------------------------- the fixed kernels as autograd functions

class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, weight, bias):
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None
        return load().mm(x, weight.t(), bias)

    @staticmethod
    def backward(ctx, grad):
        x, weight = ctx.saved_tensors
        ext = load()
        dx = ext.mm(grad, weight) if ctx.needs_input_grad[0] else None
        dw = ext.mm(grad.t(), x) if ctx.needs_input_grad[1] else None
        db = None
        if ctx.has_bias and ctx.needs_input_grad[2]:   # the bias's gradient: a sum over rows, in row order
            db = ext.colsum(grad)
        return dx, dw, db


def fixed_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """x [..., K] @ weight[N, K].T + bias [N] -> [..., N]."""
    lead = x.shape[:-1]
    return _Linear.apply(x.reshape(-1, x.shape[-1]), weight, bias).view(*lead, weight.shape[0])


class _Gelu(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        ctx.save_for_backward(x)
        return load().gelu(x)

    @staticmethod
    def backward(ctx, grad):
        (x,) = ctx.saved_tensors
        return load().gelu_backward(grad, x)


def fixed_gelu(x: torch.Tensor) -> torch.Tensor:
    """x Phi(x) (the erf form of GELU)."""
    return _Gelu.apply(x)


def relu(x: torch.Tensor) -> torch.Tensor:
    """max(x, 0): exact, so PyTorch's operator is the fixed kernel too (fixed.cpp's decode calls the same one)."""
    return torch.relu(x)


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, q, k, v, starts):
        out, stats = load().attention_forward(q, k, v, starts)
        ctx.save_for_backward(q, k, v, out, stats, starts)
        return out

    @staticmethod
    def backward(ctx, grad):
        q, k, v, out, stats, starts = ctx.saved_tensors
        dq, dk, dv = load().attention_backward(grad, q, k, v, out, stats, starts)
        return dq, dk, dv, None


def fixed_attention(q, k, v, starts: torch.Tensor) -> torch.Tensor:
    return _Attention.apply(q.contiguous(), k.contiguous(), v.contiguous(), starts)


def fixed_attention_cached(q, row, slot, keys, values, valid) -> torch.Tensor:
    return load().attention_cached(q, row, slot, keys, values, valid)


class _Exp(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        y = load().exp(x)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, grad):
        (y,) = ctx.saved_tensors
        return grad * y


def exp(x: torch.Tensor) -> torch.Tensor:
    """e^x: the fixed kernel on a float32 CPU tensor, torch.exp otherwise."""
    return _Exp.apply(x) if _fixed_eligible(x) else torch.exp(x)


def sqrt(x: torch.Tensor) -> torch.Tensor:
    """The correctly rounded square root (no gradient): the fixed kernel on a float32 CPU tensor, torch.sqrt
    otherwise."""
    return load().sqrt(x) if _fixed_eligible(x) else torch.sqrt(x)


# ---------------------------------------------------------------- PyTorch's operators, the same interface

def padded(x: torch.Tensor, starts: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Packed rows x [N, ...] -> right-padded [B, T, ...] (zeros after each row) and the flat index of each token
    in [B * T]."""
    lengths = starts[1:] - starts[:-1]
    T = int(lengths.max()) if lengths.numel() else 0
    at = (torch.arange(T)[None] < lengths[:, None]).reshape(-1).nonzero().squeeze(1)
    out = x.new_zeros(lengths.numel() * T, *x.shape[1:])
    out[at] = x
    return out.view(lengths.numel(), T, *x.shape[1:]), at


def torch_attention(q, k, v, starts: torch.Tensor) -> torch.Tensor:
    (qp, at), (kp, _), (vp, _) = padded(q, starts), padded(k, starts), padded(v, starts)
    y = F.scaled_dot_product_attention(qp.transpose(1, 2), kp.transpose(1, 2), vp.transpose(1, 2), is_causal=True)
    return y.transpose(1, 2).reshape(-1, *q.shape[1:])[at]


def torch_attention_cached(q, row, slot, keys, values, valid) -> torch.Tensor:
    """Each query [M, H, Dh] against its row's valid slots up to its own (a mask over every used slot)."""
    S = int(slot.max()) + 1
    visible = valid[row, :S] & (torch.arange(S)[None] <= slot[:, None])
    mask = torch.zeros(visible.shape).masked_fill_(~visible, float("-inf"))[:, None, None]
    seen = visible[:, None, :, None]   # an unwritten slot may hold anything: zeros, so that masked scores stay finite
    k, v = keys[row, :, :S].where(seen, 0.0), values[row, :, :S].where(seen, 0.0)
    y = F.scaled_dot_product_attention(q[:, :, None], k, v, attn_mask=mask)
    return y[:, :, 0]


@functools.cache
def fixed_decode_layout() -> tuple[tuple[str, str], ...]:
    """The block fixed.cpp's decode step runs, as it declares it (BLOCK_LAYOUT): (name in the block, role) of each
    of a layer's tensors, in the order it takes them."""
    return tuple(tuple(entry) for entry in load().decode_layout())


@functools.cache
def fixed_decode_activation() -> tuple[str, tuple[str, ...]]:
    """The block's one module without tensors as fixed.cpp's decode step declares it: its name in the block
    (`mlp.1`) and the activations decode computes there, by their kernel-set names (`gelu`, `relu`)."""
    name, activations = load().decode_activation()
    return name, tuple(activations)


def fixed_decode_weights(weights: list[torch.Tensor]) -> list[torch.Tensor]:
    """Every layer's block tensors, in decode's declared order, as decode reads them: each linear weight packed once
    (the sampler's are frozen)."""
    ext, roles = load(), [role for _, role in fixed_decode_layout()]
    return [ext.pack_linear(w) if roles[i % len(roles)] == "linear.weight" else w for i, w in enumerate(weights)]


def fixed_decode(x, weights: list, kv, valid, row, slot, eps: float, head: list | None = None, vocab: int = 0,
                 last: torch.Tensor | None = None, *, activations: list[str]) -> torch.Tensor:
    """weights: fixed_decode_weights(...) of the model's block tensors; activations: each layer's (one of
    fixed_decode_activation()'s); head: fixed_head_weights(...) (an output layer of `vocab` rows) to return the
    logits of the rows `last` (all rows if None) instead of the hidden states."""
    return load().decode(x, weights, kv, valid, row, slot, eps, list(activations), head or [], vocab, last)


def fixed_head_weights(ln_weight, ln_bias, out_weight) -> list[torch.Tensor]:
    """The final layer norm and the output layer as decode takes them (the output weight packed once)."""
    return [ln_weight, ln_bias, load().pack_linear(out_weight)]


@dataclass(frozen=True)
class KernelSet:
    name: str
    linear: object
    gelu: object
    relu: object
    attention: object
    attention_cached: object
    decode: object = None   # every block of the sampler's pass in one call (no gradient), the per-layer path's bits
    decode_weights: object = None   # the block tensors as decode takes them
    head_weights: object = None     # the final layer norm and output layer as decode takes them
    decode_layout: object = None    # () -> the block decode runs: (name, role) of each tensor of a layer, in order
    decode_activation: object = None   # () -> (the block's module without tensors, the activations decode computes)


KERNELS.register("fixed", KernelSet("fixed", fixed_linear, fixed_gelu, relu, fixed_attention, fixed_attention_cached,
                                    fixed_decode, fixed_decode_weights, fixed_head_weights, fixed_decode_layout,
                                    fixed_decode_activation))
KERNELS.register("torch", KernelSet("torch", F.linear, F.gelu, F.relu, torch_attention, torch_attention_cached))
