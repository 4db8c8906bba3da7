"""What memory and arithmetic allow a phase of a lab on this machine: its floor is the larger of the bytes it must
read over a same-run read bandwidth and its floating-point operations over a same-run GEMM of the model's shapes in
the phase's dtype. A phase's time over its floor says how far the code is from the machine (1.0: at the floor).

Counts, for a decoder of L layers, hidden h, H query and K key-value heads of size d, MLP width I, vocabulary V:

    linear weights per layer   W_l = h*H*d*2 (q, o) + h*K*d*2 (k, v) + 3*h*I (gate, up, down)
    decode step, R rows, context C tokens
        FLOPs   2*R*(L*W_l + V*h) + L * R * 2*2*C*H*d          (projections, LM head; scores and mixing)
        bytes   weight bytes (every linear layer, the LM head included) + the KV cache: L * 2*K*d * C * R * e,
                or, where the first P of the C positions are a prefix stored once for all rows,
                L * 2*K*d * (P + (C - P) * R) * e
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

import statistics
import time
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


def kv_bytes(s: Shapes, rows: int, context: int, shared: int, e: int) -> int:
    """Bytes of `rows` rows' keys and values at `context` positions whose first `shared` are stored once."""
    return s.layers * 2 * s.kv_heads * s.head_dim * (shared + (context - shared) * rows) * e


def decode_step(s: Shapes, rows: int, context: int, dtype: str, shared: int = 0) -> tuple[float, float]:
    """(FLOPs, bytes) of one decode step of `rows` rows at `context` tokens of KV cache, the first `shared` of
    them stored once for all rows (0: every row holds its own copy)."""
    e = ELEMENT_BYTES[dtype]
    flops = 2 * rows * s.linear_weights + s.layers * rows * 4 * context * s.heads * s.head_dim
    return float(flops), float(s.linear_weights * e + kv_bytes(s, rows, context, shared, e))


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


def prefill(s: Shapes, rows: int, new: int, context: int, dtype: str, shared: int = 0) -> tuple[float, float]:
    """(FLOPs, bytes) of appending `new` tokens to each of `rows` rows that attend to `context` tokens (the new ones
    included; the first `shared` stored once), the LM head at one position a row: the weights read once, the KV
    cache read once and written."""
    e = ELEMENT_BYTES[dtype]
    flops = 2 * rows * new * s.layers * s.linear_per_layer + s.layers * rows * 4 * new * context * s.heads * s.head_dim
    flops += 2 * rows * s.vocab * s.hidden
    return float(flops), float(s.linear_weights * e + kv_bytes(s, rows, context, shared, e))


class WorkMeter:
    """The floors of the work a lab did, phase by phase: every sampler forward (a decode step or a prefill), every
    training or scoring pass and every Adam step adds its floor (floor(), at this meter's bandwidth and GEMM rate)
    to the phase under way. A phase's floor is the sum of its operations' floors: no implementation of the same
    operations can take less."""

    def __init__(self, shapes: Shapes, dtype: str, bandwidth_gbs: float, gemm_gflops: float):
        self.shapes, self.dtype = shapes, dtype
        self.bandwidth_gbs, self.gemm_gflops = bandwidth_gbs, gemm_gflops
        self.phase: str | None = None
        self.phases: dict = {}

    def add(self, flops: float, nbytes: float) -> None:
        if self.phase is None:
            return
        f = floor(flops, nbytes, self.gemm_gflops, self.bandwidth_gbs)
        row = self.phases.setdefault(self.phase, {"floor_s": 0.0, "gflop": 0.0, "gbytes": 0.0, "operations": 0})
        row["floor_s"] += f["floor_s"]
        row["gflop"] += f["gflop"]
        row["gbytes"] += f["gbytes"]
        row["operations"] += 1

    def sampler_forward(self, rows: int, new: int, context: int, shared: int = 0) -> None:
        self.add(*(decode_step(self.shapes, rows, context, self.dtype, shared) if new == 1 else
                   prefill(self.shapes, rows, new, context, self.dtype, shared)))

    def scoring_pass(self, rows: int, width: int, policy_tokens: int, shared: int, backward: bool) -> None:
        """A trainer's pass over rows x width tokens whose first `shared` columns every row shares (computed once
        for all rows), the LM head at policy_tokens; forward only unless `backward`."""
        s = self.shapes
        flops, nbytes = training_pass(s, rows, width, policy_tokens, self.dtype)
        once = 3 * (2 * shared * s.layers * s.linear_per_layer + s.layers * 2 * shared * shared * s.heads * s.head_dim)
        flops -= (rows - 1) * once
        if not backward:
            flops, nbytes = flops / 3, float(s.parameters * ELEMENT_BYTES[self.dtype])
        self.add(flops, nbytes)

    def optimizer_step(self, parameters: int) -> None:
        self.add(0.0, float(ADAM_BYTES_PER_PARAMETER * parameters))

    def end(self, phase: str) -> dict | None:
        """The finished phase's floor (None if it did no metered work), rounded for the record."""
        row = self.phases.get(phase)
        return None if row is None else {k: float(f"{v:.4g}") if isinstance(v, float) else v for k, v in row.items()}


def gemm_gflops(m: int, k: int, n: int, repeats: int = 5, dtype=None) -> float:
    """A matrix product of the model's shapes ([m, k] @ [k, n]) in `dtype` (float32 by default), median GFLOP/s."""
    import torch
    a, b = torch.randn(m, k, dtype=dtype), torch.randn(k, n, dtype=dtype)
    a @ b
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        a @ b
        times.append(time.perf_counter() - t0)
    return 2 * m * k * n / statistics.median(times) / 1e9


def memory_bandwidth_gbs(mib: int = 512, repeats: int = 5) -> float:
    """Same-run read bandwidth: the median GB/s of summing a float32 tensor of `mib` MiB (larger than any cache)."""
    import torch
    x = torch.ones(mib * 2**18)
    x.sum()
    times = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - t0)
    return x.numel() * 4 / statistics.median(times) / 1e9


def measured_meter(config, parameters: int, dtype: str) -> WorkMeter:
    """A meter at this machine's same-run read bandwidth and GEMM of the model's shapes in `dtype` (about a
    second)."""
    import torch
    shapes = shapes_of(config, parameters)
    torch_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype]
    gemm = gemm_gflops(2048, shapes.hidden, shapes.intermediate, dtype=torch_dtype)
    return WorkMeter(shapes, dtype, memory_bandwidth_gbs(), gemm)


METER: WorkMeter | None = None   # the meter a lab installed (agentrl.labs.recipe), None when nothing is metered


def metering(meter: WorkMeter | None):
    """Install `meter` for the hooks (the sampler's forward, the trainer's passes, Adam's steps) until the context
    ends."""
    import contextlib

    @contextlib.contextmanager
    def installed():
        global METER
        from torch.optim.optimizer import register_optimizer_step_post_hook
        previous, METER = METER, meter
        handle = register_optimizer_step_post_hook(
            lambda opt, *_: METER is not None and METER.optimizer_step(
                sum(p.numel() for g in opt.param_groups for p in g["params"])))
        try:
            yield meter
        finally:
            handle.remove()
            METER = previous
    return installed()
