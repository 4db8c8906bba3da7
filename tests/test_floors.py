"""A phase's floor (agentrl.model.floors): the counts on hand-computed vectors, the bound the larger of memory and
arithmetic, and the training pass's FLOPs equal to the count the bench's throughput already used."""
from types import SimpleNamespace

import pytest

from agentrl.model import floors

# 2 layers, hidden 4, 2 query heads and 1 key-value head of size 2, MLP 8, vocabulary 10
SHAPES = floors.Shapes(layers=2, hidden=4, heads=2, kv_heads=1, head_dim=2, intermediate=8, vocab=10,
                       parameters=1000)


def test_the_linear_weights_per_layer_and_in_all():
    # q, o: 4*2*2 each; k, v: 4*1*2 each; gate, up, down: 4*8 each -> 32 + 16 + 96; LM head 10*4
    assert (SHAPES.linear_per_layer, SHAPES.linear_weights) == (144, 2 * 144 + 40)


@pytest.mark.parametrize("dtype, nbytes", [("fp32", 328 * 4 + 2 * 2 * 1 * 2 * 5 * 3 * 4),
                                           ("bf16", 328 * 2 + 2 * 2 * 1 * 2 * 5 * 3 * 2)])
def test_a_decode_step_reads_the_weights_and_the_kv_cache(dtype, nbytes):
    flops, got = floors.decode_step(SHAPES, rows=3, context=5, dtype=dtype)
    assert flops == 2 * 3 * 328 + 2 * 3 * 4 * 5 * 2 * 2 == 2448   # projections and head; scores and mixing
    assert got == nbytes


def test_a_training_pass_is_three_forwards_and_reads_the_weights_three_times():
    flops, nbytes = floors.training_pass(SHAPES, rows=2, width=3, policy_tokens=4, dtype="fp32")
    forward = 2 * 6 * 2 * 144 + 2 * 2 * 2 * 3 * 3 * 2 * 2 + 2 * 10 * 4 * 4   # 3456 + 288 + 320
    assert (flops, nbytes) == (3 * forward, (3 * 4 + 4) * 1000) == (12192, 16000)
    assert floors.training_pass(SHAPES, 2, 3, 4, "bf16")[1] == (3 * 2 + 4) * 1000
    assert floors.adam_step(SHAPES) == (0.0, 28000.0)


def test_the_floor_is_the_slower_of_reading_and_computing():
    memory = floors.floor(flops=2e9, nbytes=4e9, gemm_gflops=4, bandwidth_gbs=2)
    assert (memory["floor_s"], memory["bound"], memory["compute_s"]) == (2.0, "memory", 0.5)
    compute = floors.floor(flops=8e9, nbytes=1e9, gemm_gflops=4, bandwidth_gbs=2)
    assert (compute["floor_s"], compute["bound"], compute["memory_s"]) == (2.0, "compute", 0.5)


def test_the_training_pass_counts_what_the_update_throughput_counted():
    from agentrl.bench.hf import update_flops
    config = SimpleNamespace(num_hidden_layers=30, hidden_size=576, num_attention_heads=9, num_key_value_heads=3,
                             head_dim=64, intermediate_size=1536, vocab_size=49152)   # SmolLM2-135M's shapes
    shapes = floors.shapes_of(config, 134_515_008)
    assert floors.training_pass(shapes, 8, 529, 524, "fp32")[0] == update_flops(config, 8, 529, 524)
    # a decode step at 64 rows is about 17 GFLOP of projections (2 x 64 x the linear weights, the tied head counted)
    assert 16e9 < floors.decode_step(shapes, 64, 0, "fp32")[0] < 18e9


def _meter():
    # bandwidth 1 GB/s, GEMM 1 GFLOP/s: a floor in seconds is max(GB, GFLOP)
    return floors.WorkMeter(SHAPES, "fp32", bandwidth_gbs=1.0, gemm_gflops=1.0)


def test_the_meter_adds_each_operations_floor_to_the_phase_under_way():
    meter = _meter()
    meter.sampler_forward(rows=3, new=1, context=5)   # outside a phase: not counted
    meter.phase = "eval"
    meter.sampler_forward(rows=3, new=1, context=5)   # a decode step
    meter.sampler_forward(rows=3, new=4, context=9)   # a prefill of 4 tokens
    flops, nbytes = floors.prefill(SHAPES, 3, 4, 9, "fp32")
    assert flops == 2 * 3 * 4 * 2 * 144 + 2 * 3 * 4 * 4 * 9 * 2 * 2 + 2 * 3 * 10 * 4   # projections, attention, head
    assert nbytes == 328 * 4 + 2 * 2 * 1 * 2 * 9 * 3 * 4                                  # weights, KV at 9 tokens
    row = meter.end("eval")
    assert row["operations"] == 2
    assert row["floor_s"] == pytest.approx((max(2448, 1792) + max(flops, nbytes)) / 1e9, rel=1e-3)
    assert meter.end("grpo") is None


def test_a_scoring_pass_counts_the_shared_prefix_once_and_a_forward_as_a_third():
    meter = _meter()
    meter.phase = "p"
    meter.scoring_pass(rows=2, width=3, policy_tokens=4, shared=0, backward=True)
    assert meter.phases["p"]["gflop"] == pytest.approx(12192 / 1e9)
    meter.phases.clear()
    meter.scoring_pass(rows=2, width=3, policy_tokens=4, shared=2, backward=True)
    # one row's first 2 tokens not computed again: 3 x (2 x 2 tokens x 2 layers x 144 + 2 layers x 2 x 2 x 2 x 2 x 2)
    assert meter.phases["p"]["gflop"] == pytest.approx((12192 - 3 * (2 * 2 * 2 * 144 + 2 * 2 * 2 * 2 * 2 * 2)) / 1e9)
    meter.phases.clear()
    meter.scoring_pass(rows=2, width=3, policy_tokens=4, shared=0, backward=False)
    assert (meter.phases["p"]["gflop"], meter.phases["p"]["gbytes"]) == (pytest.approx(4064 / 1e9), 4000 / 1e9)


def test_an_adam_step_is_metered_only_while_the_meter_is_installed():
    import torch
    p = torch.nn.Parameter(torch.zeros(250))
    opt = torch.optim.Adam([p], lr=0.1)
    p.grad = torch.ones(250)
    meter = _meter()
    meter.phase = "cold_start"
    with floors.metering(meter):
        opt.step()
    opt.step()   # after the context: the hook is gone
    assert floors.METER is None
    assert meter.phases["cold_start"]["operations"] == 1 and meter.phases["cold_start"]["gbytes"] == 28 * 250 / 1e9
