"""The fixed-order kernels (agentrl/model/kernels): accurate against float64 references, and the same bits on every
vector path (scalar, AVX2, AVX-512: AGENTRL_KERNELS_ISA), at every thread count and whoever shares the call."""
import math
from dataclasses import replace

import pytest
import torch
import torch.nn.functional as F

from agentrl.model.kernels.build import ISA_CAPS, KernelBuildError, isa_cap, load
from agentrl.model.kernels.ops import exp, fixed_attention, sqrt, torch_attention, torch_attention_cached
from agentrl.model.kernels.registry import KERNELS

ext = load()


def rnd(*shape, seed=0, scale=1.0):
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed)) * scale


def same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit-identical, NaN payloads aside (which NaN an operation returns is not defined by IEEE 754)."""
    nan = a.isnan()
    return bool(torch.equal(nan, b.isnan()) and torch.equal(a[~nan].view(torch.int32), b[~nan].view(torch.int32)))


def on_every_path(fn):
    """fn() under each vector path this CPU has, then at 1 thread; the results."""
    out = []
    try:
        for cap in ISA_CAPS.values():
            ext.set_isa_cap(cap)
            out.append(fn())
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        out.append(fn())
        torch.set_num_threads(threads)
    finally:
        ext.set_isa_cap(isa_cap())
    return out


def test_paths_exist_and_the_default_is_the_widest():
    assert ext.isa() in ISA_CAPS
    ext.set_isa_cap(0)
    assert ext.isa() == "scalar"
    ext.set_isa_cap(isa_cap())


# ---------------------------------------------------------------- mm

@pytest.mark.parametrize("M, K, N", [(77, 64, 150), (1, 64, 192), (13, 300, 33), (37, 1000, 70), (256, 700, 64)])
def test_mm_is_accurate_and_the_same_on_every_path(M, K, N):
    a, b, bias = rnd(M, K, seed=1), rnd(K, N, seed=2), rnd(N, seed=3)
    results = on_every_path(lambda: ext.mm(a, b, bias))
    assert all(torch.equal(results[0], r) for r in results[1:])
    exact = a.double() @ b.double() + bias.double()
    assert float((results[0].double() - exact).abs().max()) < 1e-5 * math.sqrt(K) * 3


def test_mm_is_the_sequential_sum_of_products():
    """c = 0; c = fma(a[k], b[k], c) for k in order; then c + bias: emulated in float64 with one rounding per fma
    (float64 holds a float32 product exactly)."""
    a, b, bias = rnd(5, 40, seed=4), rnd(40, 3, seed=5), rnd(3, seed=6)
    got = ext.mm(a, b, bias)
    for m in range(5):
        for n in range(3):
            c = torch.tensor(0.0, dtype=torch.float32)
            for k in range(40):
                c = (a[m, k].double() * b[k, n].double() + c.double()).float()   # fma: one rounding
            assert torch.equal(got[m, n], c + bias[n]), (m, n)


def test_mm_rows_do_not_depend_on_the_other_rows_or_on_strides():
    a, w, bias = rnd(90, 64, seed=7), rnd(120, 64, seed=8), rnd(120, seed=9)
    full = ext.mm(a, w.t(), bias)
    assert torch.equal(ext.mm(a[31:33], w.t(), bias), full[31:33])
    assert torch.equal(ext.mm(a.t().contiguous().t(), w.t().contiguous(), bias), full)   # other layouts, same bits
    assert torch.equal(ext.colsum(a), ext.mm(torch.ones(1, 90), a).squeeze(0))


def test_packed_weights_give_the_same_bits():
    x, w, b = rnd(40, 64, seed=10), rnd(190, 64, seed=11), rnd(190, seed=12)
    packed = ext.pack_linear(w)
    assert packed.shape[1] == 64 and packed.shape[0] * packed.shape[2] >= 190
    assert torch.equal(ext.mm_packed(x, packed, 190, b), ext.mm(x, w.t(), b))


# ---------------------------------------------------------------- elementwise

def test_exp_is_accurate_and_handles_the_edges():
    x = rnd(100_000, seed=13, scale=10.0)
    rel = ((exp(x).double() - torch.exp(x.double())) / torch.exp(x.double())).abs().max()
    assert float(rel) < 2e-7
    edges = torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 88.8, -104.0, -103.9])
    y = exp(edges)
    assert y[0].isnan() and y[1] == float("inf") and y[2] == 0 and y[3] == 1 and y[4] == 1 and y[5] == float("inf")
    assert y[6] == 0 and y[7] == 2 ** -149       # the smallest denormal: rounded once, not flushed


def test_exp_has_its_gradient():
    x = rnd(10, seed=14).requires_grad_()
    exp(x).sum().backward()
    assert torch.equal(x.grad, exp(x.detach()))


def test_gelu_and_its_gradient_against_the_erf_form_in_float64():
    x = rnd(100_000, seed=15, scale=4.0)
    assert float((ext.gelu(x).double() - F.gelu(x.double())).abs().max()) < 1e-6
    xd = x.double().requires_grad_()
    F.gelu(xd).sum().backward()
    assert float((ext.gelu_backward(torch.ones_like(x), x).double() - xd.grad).abs().max()) < 1e-6


def test_sqrt_is_correctly_rounded():
    x = rnd(100_000, seed=16).abs()
    assert torch.equal(sqrt(x), x.double().sqrt().float())


def test_elementwise_bits_are_the_same_on_every_path():
    x = torch.cat([rnd(50_003, seed=17, scale=30.0),
                   torch.tensor([float("nan"), float("inf"), float("-inf"), 0.0, -0.0, 1e-40, -1e-40])])
    for fn in (ext.exp, ext.gelu, lambda v: ext.gelu_backward(torch.ones_like(v), v), lambda v: ext.sqrt(v.abs())):
        results = on_every_path(lambda fn=fn: fn(x / 5))
        assert all(same_bits(results[0], r) for r in results[1:])


def test_other_tensors_fall_back_to_torch():
    x = rnd(10, seed=18).double()
    assert torch.equal(exp(x), torch.exp(x)) and torch.equal(sqrt(x.abs()), torch.sqrt(x.abs()))


# ---------------------------------------------------------------- attention

def packed_rows(lengths, H=4, Dh=16, seed=19):
    lengths = torch.tensor(lengths)
    starts = torch.cat([torch.zeros(1, dtype=torch.long), lengths.cumsum(0)])
    N = int(lengths.sum())
    return [rnd(N, H, Dh, seed=seed + i) for i in range(3)], starts


def test_attention_forward_and_backward_against_sdpa_in_float64():
    (q, k, v), starts = packed_rows([5, 9, 1, 23])
    grad = rnd(*q.shape, seed=30)
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    torch_attention(qd, kd, vd, starts).backward(grad.double())
    qf, kf, vf = (t.clone().requires_grad_() for t in (q, k, v))
    out = fixed_attention(qf, kf, vf, starts)
    out.backward(grad)
    reference = torch_attention(q.double(), k.double(), v.double(), starts)
    assert float((out.detach().double() - reference).abs().max()) < 1e-6
    for fixed, reference in ((qf, qd), (kf, kd), (vf, vd)):
        assert float((fixed.grad.double() - reference.grad).abs().max()) < 2e-6


def test_attention_is_the_same_on_every_path_and_a_row_alone():
    (q, k, v), starts = packed_rows([17, 3, 40])
    grad = rnd(*q.shape, seed=31)

    def both():
        out, stats = ext.attention_forward(q, k, v, starts)
        return torch.cat([out.reshape(-1), *(g.reshape(-1) for g in ext.attention_backward(grad, q, k, v, out, stats,
                                                                                              starts))])
    results = on_every_path(both)
    assert all(torch.equal(results[0], r) for r in results[1:])
    alone = ext.attention_forward(q[17:20], k[17:20], v[17:20], torch.tensor([0, 3]))[0]
    assert torch.equal(alone, ext.attention_forward(q, k, v, starts)[0][17:20])


def test_cached_attention_sees_the_valid_slots_as_the_packed_pass_sees_the_row():
    (q, k, v), starts = packed_rows([5, 9])
    H, Dh, cap = 4, 16, 16
    keys, values = torch.zeros(2, H, cap, Dh), torch.zeros(2, H, cap, Dh)
    valid = torch.zeros(2, cap, dtype=torch.bool)
    slots = [0, 1, 3, 4, 5, 8, 9, 10, 12]                    # row 1's 9 tokens, invalid slots between them
    for i, s in enumerate(slots):
        keys[1, :, s], values[1, :, s], valid[1, s] = k[5 + i], v[5 + i], True
    keys[1, :, 2] = float("nan")                             # an invalid slot is never read
    row, slot = torch.ones(9, dtype=torch.long), torch.tensor(slots)
    packed = ext.attention_forward(q, k, v, starts)[0][5:]
    assert torch.equal(ext.attention_cached(q[5:], row, slot, keys, values, valid), packed)
    keys[1, :, 2] = 0.0
    assert float((torch_attention_cached(q[5:], row, slot, keys, values, valid) - packed).abs().max()) < 1e-6


# ---------------------------------------------------------------- the model on both kernel sets

def test_the_fixed_decode_is_the_per_layer_path_bit_for_bit(make_model):
    model = make_model(seed=3, emb_std=0.02).eval()
    ids = torch.tensor([[2, 10, 11, 12, 13], [2, 20, 21, 0, 0]])
    valid = torch.tensor([[True] * 5, [True, True, True, False, False]])
    pos = torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 3, 3]])

    def run():
        cache = model.new_cache()
        with torch.no_grad():
            first = model.forward_cached(ids, pos, valid, cache, last=True)
            step = model.forward_cached(torch.tensor([[14], [22]]), torch.tensor([[5], [3]]),
                                        torch.tensor([[True], [True]]), cache, last=True)
            every = model.forward_cached(ids[:, :2], pos[:, :2] + 6, valid[:, :2], cache)   # all slots, not only last
        return first, step, every
    fused = run()
    model.kernels = replace(KERNELS["fixed"], decode=None, decode_weights=None, head_weights=None)
    per_layer = run()   # the same kernels through Block.cached, layer by layer in Python
    model.use_kernels("fixed")
    assert all(torch.equal(a, b) for a, b in zip(fused, per_layer))


def test_both_kernel_sets_compute_the_same_model(make_model, tok):
    model = make_model(seed=4)
    ids = torch.randint(0, len(tok), (3, 30), generator=torch.Generator().manual_seed(5))
    fixed = model(ids)
    reference = model.use_kernels("torch")(ids)
    model.use_kernels("fixed")
    assert float((fixed - reference).detach().abs().max()) < 1e-4
    assert set(KERNELS.names()) >= {"fixed", "torch"}


# ---------------------------------------------------------------- the build

def test_an_unknown_isa_setting_is_one_line(monkeypatch):
    monkeypatch.setenv("AGENTRL_KERNELS_ISA", "avx1024")
    with pytest.raises(KernelBuildError, match="AGENTRL_KERNELS_ISA='avx1024': expected one of scalar, avx2, avx512"):
        isa_cap()
