"""What memory and arithmetic allow a phase of a lab on this machine: its floor is the larger of the bytes it must
read over a same-run read bandwidth and its floating-point operations over a same-run GEMM of the model's shapes in
the phase's dtype. A phase's time over its floor says how far the code is from the machine (1.0: at the floor).

Counts, for a decoder of L layers, hidden h, H query and K key-value heads of size d, MLP width I, vocabulary V:

    linear weights per layer   W_l = h*H*d*2 (q, o) + h*K*d*2 (k, v) + 3*h*I (gate, up, down)
    decode step, R rows, context C tokens
        FLOPs   2*R*(L*W_l + V*h) + L * R * 2*2*C*H*d          (projections, LM head; scores and mixing)
        bytes   weight bytes (every linear layer, the LM head included) + the KV cache: L * 2*K*d * C * R * e
    training pass, R rows of T tokens, P policy positions (forward and backward: 3x the forward's FLOPs)
        FLOPs   3 * (2*R*T*L*W_l + L*R*2*T*T*H*d (causal half of 2 * 2*T*T*H*d) + 2*V*h*P)
        bytes   the weights read three times (forward, and the backward's two products) in the compute dtype, and
                the float32 gradient written once: (3*e + 4) * N
    Adam step (float32 master weights)
        bytes   parameter, gradient and both moments read, parameter and both moments written: 7 * 4 * N

e is the compute dtype's bytes per element (fp32 4, bf16 2), N the parameters. Activations are left out: the floor
is what no implementation can go below, not an estimate of this one.
"""
from __future__ import annotations

from dataclasses import dataclass

ELEMENT_BYTES = {"fp32": 4, "bf16": 2}
ADAM_BYTES_PER_PARAMETER = 7 * 4


@dataclass(frozen=True)
class Shapes:
    """The decoder's sizes the counts need (from a transformers config: shapes_of)."""
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    parameters: int

    @property
    def linear_per_layer(self) -> int:
        h, d = self.hidden, self.head_dim
        return h * self.heads * d * 2 + h * self.kv_heads * d * 2 + 3 * h * self.intermediate

    @property
    def linear_weights(self) -> int:
        """Every linear layer's weights, the LM head included (what a decode step multiplies by)."""
        return self.layers * self.linear_per_layer + self.vocab * self.hidden


def shapes_of(config, parameters: int) -> Shapes:
    heads = config.num_attention_heads
    return Shapes(layers=config.num_hidden_layers, hidden=config.hidden_size, heads=heads,
                  kv_heads=config.num_key_value_heads,
                  head_dim=getattr(config, "head_dim", None) or config.hidden_size // heads,
                  intermediate=config.intermediate_size, vocab=config.vocab_size, parameters=parameters)


def decode_step(s: Shapes, rows: int, context: int, dtype: str) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step of `rows` rows at `context` tokens of KV cache."""
    e = ELEMENT_BYTES[dtype]
    flops = 2 * rows * s.linear_weights + s.layers * rows * 4 * context * s.heads * s.head_dim
    kv = s.layers * 2 * s.kv_heads * s.head_dim * context * rows * e
    return float(flops), float(s.linear_weights * e + kv)


def training_pass(s: Shapes, rows: int, width: int, policy_tokens: int, dtype: str) -> tuple[float, float]:
    """(FLOPs, bytes) of one forward and backward over rows x width tokens, the LM head at policy_tokens."""
    tokens = rows * width
    forward = 2 * tokens * s.layers * s.linear_per_layer + s.layers * rows * 2 * width * width * s.heads * s.head_dim
    forward += 2 * s.vocab * s.hidden * policy_tokens
    return 3.0 * forward, float((3 * ELEMENT_BYTES[dtype] + 4) * s.parameters)


def adam_step(s: Shapes) -> tuple[float, float]:
    """(FLOPs, bytes) of one Adam step over float32 master weights (its arithmetic is negligible)."""
    return 0.0, float(ADAM_BYTES_PER_PARAMETER * s.parameters)


def floor(flops: float, nbytes: float, gemm_gflops: float, bandwidth_gbs: float) -> dict:
    """The phase's floor in seconds and what bounds it: its bytes at the read bandwidth or its FLOPs at the GEMM
    rate, whichever takes longer."""
    memory_s, compute_s = nbytes / (bandwidth_gbs * 1e9), flops / (gemm_gflops * 1e9)
    return {"floor_s": max(memory_s, compute_s), "memory_s": memory_s, "compute_s": compute_s,
            "bound": "memory" if memory_s >= compute_s else "compute", "gflop": flops / 1e9, "gbytes": nbytes / 1e9}
