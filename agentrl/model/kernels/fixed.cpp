// TinyAgent's fixed-order kernels: every floating-point result is defined by the order of operations written here,
// never by the CPU's vendor, its vector width, the library's blocking or the thread count.
//
// The rule that makes this so: each output element is computed by one thread, in one fixed sequence of IEEE
// operations (a sum runs over its terms in index order, one fused multiply-add per term, from +0). Vector
// instructions only compute several independent outputs at once; threads only split outputs among themselves.
// So the AVX2 and AVX-512 paths, the scalar path of another architecture, and any thread count give the same
// bits, and a row's result does not depend on which other rows share the call (the trainer's packed pass, the
// sampler's cache and the dense pass agree bit for bit).
//
// Kernels: mm (C = A B, + bias; fixed_gemm.h), attention over packed rows (forward and backward) and over a KV cache
// (forward; fixed_attention.h), GELU (erf form, forward and backward), exp and sqrt (fixed_math.h over the lane
// types of fixed_lanes.h), and the sampler's decode step (here). ReLU is exact (max(x, 0)): PyTorch's operator is its
// kernel, here and in Python. Compiled with -ffp-contract=off: the compiler never fuses what is written as a separate
// multiply and add.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define AGENTRL_X86 1
#endif

namespace {

#include "fixed_lanes.h"
#include "fixed_gemm.h"
#include "fixed_attention.h"

// ------------------------------------------------------------------------------------------------ elementwise

template <Fn F>
at::Tensor map(const at::Tensor& x_in) {
  const at::Tensor x = x_in.contiguous();
  check_float(x, "x");
  at::Tensor y = at::empty_like(x);
  const float* xp = x.data_ptr<float>();
  float* yp = y.data_ptr<float>();
  at::parallel_for(0, x.numel(), 1 << 14, [&](int64_t begin, int64_t end) {
    map_floats<F>(xp + begin, yp + begin, end - begin);
  });
  return y;
}

at::Tensor exp_(const at::Tensor& x) { return map<Fn::Exp>(x); }
at::Tensor gelu_(const at::Tensor& x) { return map<Fn::Gelu>(x); }
at::Tensor sqrt_(const at::Tensor& x) { return map<Fn::Sqrt>(x); }   // IEEE's correctly rounded square root

at::Tensor gelu_backward(const at::Tensor& grad_in, const at::Tensor& x_in) {
  const at::Tensor g = grad_in.contiguous();
  check_float(g, "grad");
  TORCH_CHECK(g.sizes() == x_in.sizes(), "gelu_backward: shapes differ");
  at::Tensor d = map<Fn::GeluGrad>(x_in);
  return d.mul_(g);   // g * gelu'(x), elementwise
}

// ------------------------------------------------------------------------------------------------ decode
// The sampler's pass through every block in one call: the same operations, in the same order, as the model's
// per-layer path (agentrl.model.block: Block.cached) -- ATen's layer norm, addition and ReLU, the kernels above --
// so its results are that path's bits, without a Python call per operation.
//
// The block it runs, declared once: each of a layer's tensors by its name in the block and its role, in the order
// decode takes them, and the block's one module without tensors, the MLP's activation (ACTIVATION_MODULE), which
// decode takes by name for each layer, one of DECODE_ACTIVATIONS. TinyAgent passes its tensors in this order and the
// binding packs the `linear.weight`s (agentrl.model.kernels.ops); a model whose block has other tensors or modules,
// or computes other bits on a probe, samples layer by layer instead (agentrl.model.block.decode_mismatch).
enum BlockTensor : int { LN1_W, LN1_B, QKV_W, QKV_B, PROJ_W, PROJ_B, LN2_W, LN2_B, UP_W, UP_B, DOWN_W, DOWN_B,
                         PER_LAYER };
const char* const BLOCK_LAYOUT[PER_LAYER][2] = {
    {"ln1.weight", "layer_norm.weight"}, {"ln1.bias", "layer_norm.bias"},
    {"attn.qkv.weight", "linear.weight"}, {"attn.qkv.bias", "linear.bias"},
    {"attn.proj.weight", "linear.weight"}, {"attn.proj.bias", "linear.bias"},
    {"ln2.weight", "layer_norm.weight"}, {"ln2.bias", "layer_norm.bias"},
    {"mlp.0.weight", "linear.weight"}, {"mlp.0.bias", "linear.bias"},
    {"mlp.2.weight", "linear.weight"}, {"mlp.2.bias", "linear.bias"}};

enum Activation : int { GELU, RELU, ACTIVATIONS };
const char* const ACTIVATION_MODULE = "mlp.1";   // between BLOCK_LAYOUT's mlp.0 and mlp.2
const char* const DECODE_ACTIVATIONS[ACTIVATIONS] = {"gelu", "relu"};   // by Activation, as the kernel sets name them

std::vector<std::pair<std::string, std::string>> decode_layout() {
  std::vector<std::pair<std::string, std::string>> out;
  for (const auto& entry : BLOCK_LAYOUT) out.emplace_back(entry[0], entry[1]);
  return out;
}

std::pair<std::string, std::vector<std::string>> decode_activation() {
  return {ACTIVATION_MODULE, std::vector<std::string>(DECODE_ACTIVATIONS, DECODE_ACTIVATIONS + ACTIVATIONS)};
}

//   x [M, D] at the chunk's computed slots; per layer the PER_LAYER tensors of BLOCK_LAYOUT (each linear weight
//   packed by pack_linear) and its activation; kv [2, layers, R, H, C, Dh]; valid [R, C]; row, slot [M] -> x after
//   the last block [M, D]
// every block for the queries [m0, m1) (all queries of their cache rows), written into out
void decode_rows(const at::Tensor& x_in, int64_t m0, int64_t m1, const std::vector<at::Tensor>& weights,
                 const std::vector<Activation>& activations, const at::Tensor& kv, const at::Tensor& valid,
                 const at::Tensor& row, const at::Tensor& slot, double eps, at::Tensor& out) {
  at::AutoDispatchBelowAutograd below_autograd;   // no gradient here (and a worker thread has no grad mode set)
  const int64_t layers = kv.size(1), M = m1 - m0, D = x_in.size(1), H = kv.size(3), Dh = kv.size(5);
  at::Tensor x = x_in.narrow(0, m0, M);
  const at::Tensor rows = row.narrow(0, m0, M), slots = slot.narrow(0, m0, M);
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* w = weights.data() + PER_LAYER * i;
    const at::Tensor keys = kv[0][i], values = kv[1][i];
    const at::Tensor qkv = mm_packed(at::layer_norm(x, {D}, w[LN1_W], w[LN1_B], eps), w[QKV_W], 3 * D, w[QKV_B]);
    const float* qkvp = qkv.data_ptr<float>();
    float* kp = keys.data_ptr<float>();
    float* vp = values.data_ptr<float>();
    const int64_t ks0 = keys.stride(0), ks1 = keys.stride(1), ks2 = keys.stride(2);
    for (int64_t m = 0; m < M; ++m)
      for (int64_t h = 0; h < H; ++h) {
        const float* src = qkvp + m * 3 * D + h * Dh;
        std::memcpy(kp + rp[m] * ks0 + h * ks1 + sp[m] * ks2, src + D, sizeof(float) * Dh);
        std::memcpy(vp + rp[m] * ks0 + h * ks1 + sp[m] * ks2, src + 2 * D, sizeof(float) * Dh);
      }
    const at::Tensor q = qkv.narrow(1, 0, D).reshape({M, H, Dh});
    const at::Tensor y = attention_cached(q, rows, slots, keys, values, valid).reshape({M, D});
    x = at::add(x, mm_packed(y, w[PROJ_W], D, w[PROJ_B]));
    const at::Tensor h2 = at::layer_norm(x, {D}, w[LN2_W], w[LN2_B], eps);
    const at::Tensor up = mm_packed(h2, w[UP_W], w[UP_B].numel(), w[UP_B]);
    const at::Tensor act = activations[i] == RELU ? at::relu(up) : gelu_(up);
    x = at::add(x, mm_packed(act, w[DOWN_W], D, w[DOWN_B]));
  }
  out.narrow(0, m0, M).copy_(x);
}

// decode(...) -> the hidden states after the last block [M, D]; `activations`: each layer's, by name (one of
// DECODE_ACTIVATIONS); with `head` (ln_f weight, ln_f bias, the output layer's weight packed, of `vocab` rows;
// `last`: which of the M rows, or every row if undefined) -> their logits, as the model's _logits computes them
at::Tensor decode(const at::Tensor& x, const std::vector<at::Tensor>& weights, const at::Tensor& kv,
                  const at::Tensor& valid, const at::Tensor& row_in, const at::Tensor& slot_in, double eps,
                  const std::vector<std::string>& activation_names, const std::vector<at::Tensor>& head,
                  int64_t vocab, const c10::optional<at::Tensor>& last) {
  const int64_t layers = kv.size(1), M = x.size(0), D = x.size(1), H = kv.size(3), Dh = kv.size(5);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == PER_LAYER * layers, "decode: ", PER_LAYER,
              " tensors per layer (BLOCK_LAYOUT), got ", weights.size(), " for ", layers, " layers");
  TORCH_CHECK(static_cast<int64_t>(activation_names.size()) == layers, "decode: one activation per layer, got ",
              activation_names.size(), " for ", layers, " layers");
  std::vector<Activation> activations;
  for (const std::string& name : activation_names) {
    int a = 0;
    while (a < ACTIVATIONS && name != DECODE_ACTIVATIONS[a]) ++a;
    TORCH_CHECK(a < ACTIVATIONS, "decode: activation '", name, "' is not one of gelu, relu");
    activations.push_back(static_cast<Activation>(a));
  }
  TORCH_CHECK(H * Dh == D, "decode: heads do not tile the model width");
  const at::Tensor row = row_in.to(at::kLong).contiguous(), slot = slot_in.to(at::kLong).contiguous();
  at::Tensor out = at::empty_like(x);
  // the queries split between threads at cache-row boundaries (a row's queries read the keys its other queries
  // write in this chunk); every result is its row's alone, so the split changes no bit
  const int64_t* rp = row.data_ptr<int64_t>();
  std::vector<int64_t> starts;
  for (int64_t m = 0; m < M; ++m)
    if (m == 0 || rp[m] != rp[m - 1]) starts.push_back(m);
  const int64_t segments = static_cast<int64_t>(starts.size());
  starts.push_back(M);
  const at::ThreadLocalState caller;   // grad and inference mode travel to the worker threads
  at::parallel_for(0, segments, 8, [&](int64_t begin, int64_t end) {
    at::ThreadLocalStateGuard same_state(caller);
    decode_rows(x, starts[begin], starts[end], weights, activations, kv, valid, row, slot, eps, out);
  });
  if (head.empty()) return out;
  TORCH_CHECK(head.size() == 3, "decode: head is ln_f weight, ln_f bias, packed output weight");
  at::AutoDispatchBelowAutograd below_autograd;
  const at::Tensor h = last.has_value() && last->defined() ? out.index_select(0, *last) : out;
  return mm_packed(at::layer_norm(h, {D}, head[0], head[1], eps), head[2], vocab, c10::nullopt);
}

void set_isa_cap(int64_t cap) { g_isa_cap = static_cast<int>(cap); }

std::string isa() {
  const int i = active_isa();
  return i == 2 ? "avx512" : i == 1 ? "avx2" : "scalar";
}

}  // namespace

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("mm", &mm, "C = A B (+ bias), fixed order", py::arg("a"), py::arg("b"), py::arg("bias") = py::none());
  m.def("pack_linear", &pack_linear);
  m.def("mm_packed", &mm_packed);
  m.def("colsum", &colsum);
  m.def("attention_forward", &attention_forward);
  m.def("attention_backward", &attention_backward);
  m.def("attention_cached", &attention_cached);
  m.def("decode", &decode);
  m.def("decode_layout", &decode_layout);
  m.def("decode_activation", &decode_activation);
  m.def("exp", &exp_);
  m.def("sqrt", &sqrt_);
  m.def("gelu", &gelu_);
  m.def("gelu_backward", &gelu_backward);
  m.def("set_isa_cap", &set_isa_cap);
  m.def("isa", &isa);
}
