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
// Kernels: mm (C = A B, + bias), attention over packed rows (forward and backward) and over a KV cache (forward),
// GELU (erf form, forward and backward), exp and sqrt. Compiled with -ffp-contract=off: the compiler never fuses what
// is written as a separate multiply and add.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <ATen/ThreadLocalState.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#if defined(__x86_64__) || defined(_M_X64)
#include <immintrin.h>
#define AGENTRL_X86 1
#endif

namespace {

// ------------------------------------------------------------------------------------------------ math
// exp, erfc, Phi and GELU are written once, as templates over a lane type: Scalar (one float) defines the result;
// Avx2 (eight floats) performs the same operation on each lane (+, -, *, /, fma, floor, comparisons, selects and
// exponent bits are exact IEEE or integer operations), so every path gives every element the same bits.

inline float bits_to_float(uint32_t u) { float f; std::memcpy(&f, &u, 4); return f; }

struct Scalar {
  using V = float;
  using M = bool;
  static V set(float a) { return a; }
  static V add(V a, V b) { return a + b; }
  static V sub(V a, V b) { return a - b; }
  static V mul(V a, V b) { return a * b; }
  static V div(V a, V b) { return a / b; }
  static V fma(V a, V b, V c) { return std::fma(a, b, c); }
  static V floor(V a) { return std::floor(a); }
  static V sqrt(V a) { return std::sqrt(a); }
  static V neg(V a) { return -a; }
  static V abs(V a) { return std::fabs(a); }
  static M lt(V a, V b) { return a < b; }
  static M gt(V a, V b) { return a > b; }
  static M ge(V a, V b) { return a >= b; }
  static M isnan(V a) { return a != a; }
  static V select(M m, V a, V b) { return m ? a : b; }
  static V clamp(V a, float lo, float hi) { return a < lo ? lo : (a > hi ? hi : a); }   // NaN stays NaN
  // 2^e1 * 2^e2 with e1 = floor(n / 2), e2 = n - e1, for an integral n in [-150, 128]
  static void pow2_pair(V n, V* p1, V* p2) {
    const int e = static_cast<int>(n), e1 = e >> 1, e2 = e - e1;
    *p1 = bits_to_float(static_cast<uint32_t>(e1 + 127) << 23);
    *p2 = bits_to_float(static_cast<uint32_t>(e2 + 127) << 23);
  }
};

#ifdef AGENTRL_X86
struct Avx2 {
  using V = __m256;
  using M = __m256;
  static V set(float a) { return _mm256_set1_ps(a); }
  static V add(V a, V b) { return _mm256_add_ps(a, b); }
  static V sub(V a, V b) { return _mm256_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm256_mul_ps(a, b); }
  static V div(V a, V b) { return _mm256_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm256_fmadd_ps(a, b, c); }
  static V floor(V a) { return _mm256_floor_ps(a); }
  static V sqrt(V a) { return _mm256_sqrt_ps(a); }
  static V neg(V a) { return _mm256_xor_ps(a, _mm256_set1_ps(-0.0f)); }
  static V abs(V a) { return _mm256_andnot_ps(_mm256_set1_ps(-0.0f), a); }
  static M lt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_LT_OQ); }
  static M gt(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GT_OQ); }
  static M ge(V a, V b) { return _mm256_cmp_ps(a, b, _CMP_GE_OQ); }
  static M isnan(V a) { return _mm256_cmp_ps(a, a, _CMP_UNORD_Q); }
  static V select(M m, V a, V b) { return _mm256_blendv_ps(b, a, m); }
  static V clamp(V a, float lo, float hi) {
    const V c = _mm256_min_ps(_mm256_max_ps(a, set(lo)), set(hi));
    return select(isnan(a), a, c);
  }
  static void pow2_pair(V n, V* p1, V* p2) {
    const __m256i e = _mm256_cvttps_epi32(n), e1 = _mm256_srai_epi32(e, 1), e2 = _mm256_sub_epi32(e, e1);
    const __m256i bias = _mm256_set1_epi32(127);
    *p1 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e1, bias), 23));
    *p2 = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(e2, bias), 23));
  }
};
#endif

#define AGENTRL_INLINE inline __attribute__((always_inline))
#include "fixed_math.h"

int active_isa();

// the elementwise functions, by name, for any lane type
enum class Fn { Exp, Gelu, GeluGrad, Sqrt };

template <Fn F, class O>
AGENTRL_INLINE typename O::V apply_fn(typename O::V x) {
  if constexpr (F == Fn::Exp) return exp_t<O>(x);
  else if constexpr (F == Fn::Gelu) return gelu_t<O>(x);
  else if constexpr (F == Fn::GeluGrad) return gelu_grad_t<O>(x);
  else return sqrt_t<O>(x);
}

#ifdef AGENTRL_X86
template <Fn F>
void map_avx2(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, apply_fn<F, Avx2>(_mm256_loadu_ps(x + i)));
  if (i < n) {   // the tail through a zero-padded vector
    alignas(32) float buf[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int64_t j = i; j < n; ++j) buf[j - i] = x[j];
    _mm256_store_ps(buf, apply_fn<F, Avx2>(_mm256_load_ps(buf)));
    for (int64_t j = i; j < n; ++j) y[j] = buf[j - i];
  }
}

// The same math for sixteen lanes, compiled for AVX-512 (the file's own math templates, included again inside the
// target region, so that nothing outside it is compiled for AVX-512)
#pragma GCC push_options
#pragma GCC target("avx512f")
namespace wide {
struct Avx512 {
  using V = __m512;
  using M = __mmask16;
  static V set(float a) { return _mm512_set1_ps(a); }
  static V add(V a, V b) { return _mm512_add_ps(a, b); }
  static V sub(V a, V b) { return _mm512_sub_ps(a, b); }
  static V mul(V a, V b) { return _mm512_mul_ps(a, b); }
  static V div(V a, V b) { return _mm512_div_ps(a, b); }
  static V fma(V a, V b, V c) { return _mm512_fmadd_ps(a, b, c); }
  static V floor(V a) { return _mm512_roundscale_ps(a, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC); }
  static V sqrt(V a) { return _mm512_sqrt_ps(a); }
  static V neg(V a) {
    return _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(a), _mm512_set1_epi32(INT32_MIN)));
  }
  static V abs(V a) { return _mm512_abs_ps(a); }
  static M lt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_LT_OQ); }
  static M gt(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GT_OQ); }
  static M ge(V a, V b) { return _mm512_cmp_ps_mask(a, b, _CMP_GE_OQ); }
  static M isnan(V a) { return _mm512_cmp_ps_mask(a, a, _CMP_UNORD_Q); }
  static V select(M m, V a, V b) { return _mm512_mask_blend_ps(m, b, a); }
  static V clamp(V a, float lo, float hi) {
    const V c = _mm512_min_ps(_mm512_max_ps(a, set(lo)), set(hi));
    return select(isnan(a), a, c);
  }
  static void pow2_pair(V n, V* p1, V* p2) {
    const __m512i e = _mm512_cvttps_epi32(n), e1 = _mm512_srai_epi32(e, 1), e2 = _mm512_sub_epi32(e, e1);
    const __m512i bias = _mm512_set1_epi32(127);
    *p1 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e1, bias), 23));
    *p2 = _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_add_epi32(e2, bias), 23));
  }
};
#include "fixed_math.h"

template <Fn F>
void map_avx512(const float* x, float* y, int64_t n) {
  int64_t i = 0;
  auto f = [](__m512 v) {
    if constexpr (F == Fn::Exp) return exp_t<Avx512>(v);
    else if constexpr (F == Fn::Gelu) return gelu_t<Avx512>(v);
    else if constexpr (F == Fn::GeluGrad) return gelu_grad_t<Avx512>(v);
    else return sqrt_t<Avx512>(v);
  };
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, f(_mm512_loadu_ps(x + i)));
  if (i < n) {   // the tail through masked lanes (zeros in the others)
    const __mmask16 m = static_cast<__mmask16>((1u << (n - i)) - 1);
    _mm512_mask_storeu_ps(y + i, m, f(_mm512_maskz_loadu_ps(m, x + i)));
  }
}
}  // namespace wide
#pragma GCC pop_options
#endif

// y[i] = F(x[i]) over n floats: sixteen or eight lanes at a time, or one float at a time (no AVX2, or
// AGENTRL_KERNELS_ISA=scalar). The same bits on every path.
template <Fn F>
void map_floats(const float* x, float* y, int64_t n) {
#ifdef AGENTRL_X86
  const int isa = active_isa();
  if (isa == 2) return wide::map_avx512<F>(x, y, n);
  if (isa == 1) return map_avx2<F>(x, y, n);
#endif
  for (int64_t i = 0; i < n; ++i) y[i] = apply_fn<F, Scalar>(x[i]);
}

// ------------------------------------------------------------------------------------------------ mm
// C[M, N] = A[M, K] B[K, N] (+ bias[N]): c = 0; for k in 0..K-1: c = fma(a[m, k], b[k, n], c); c = c + bias[n].
// B is packed into panels of P columns, [panels][K][P], zero beyond N; A is read in place (rows contiguous). A block
// of R rows x P columns keeps its R x P sums in registers for the whole of K. P and R depend on the vector width
// (AVX-512: 8 x 32, AVX2: 6 x 16, scalar: 4 x 16); the sums do not.

void pack_b(const float* b, int64_t K, int64_t N, int64_t sk, int64_t sn, int P, float* out) {
  const int64_t panels = (N + P - 1) / P;
  for (int64_t p = 0; p < panels; ++p) {
    float* dst = out + p * K * P;
    const int64_t n0 = p * P, width = std::min<int64_t>(P, N - n0);
    if (sk == 1) {   // B's columns are contiguous (a transposed matrix): read them in order
      for (int64_t j = 0; j < P; ++j) {
        const float* col = b + (n0 + j) * sn;
        for (int64_t k = 0; k < K; ++k) dst[k * P + j] = j < width ? col[k] : 0.0f;
      }
      continue;
    }
    for (int64_t k = 0; k < K; ++k) {
      int64_t j = 0;
      for (; j < width; ++j) dst[k * P + j] = b[k * sk + (n0 + j) * sn];
      for (; j < P; ++j) dst[k * P + j] = 0.0f;
    }
  }
}

inline void store_row(const float* acc, const float* bias, float* c, int64_t width) {
  for (int64_t j = 0; j < width; ++j) c[j] = bias ? acc[j] + bias[j] : acc[j];
}

// The rows of A past M in the last, partial row block: that block is copied with zero rows added, [K][R].
std::vector<float> pad_last_block(const float* a, int64_t M, int64_t K, int64_t sm, int64_t sk, int R) {
  const int64_t m0 = (M / R) * R;
  std::vector<float> out(static_cast<size_t>(K * R), 0.0f);
  for (int64_t k = 0; k < K; ++k)
    for (int64_t m = m0; m < M; ++m) out[k * R + (m - m0)] = a[m * sm + k * sk];
  return out;
}

// one block of A (R rows at a, row stride ar, column stride ak; only the first `rows` are stored) times one panel of B
template <int R>
void block_scalar(int rows, const float* a, int64_t ar_, int64_t ak, const float* panel, int64_t ldp, int64_t K,
                  const float* bias, float* c, int64_t ldc, int64_t width, bool resume) {
  constexpr int P = 16;
  float acc[R][P];
  for (int r = 0; r < R; ++r)
    for (int j = 0; j < P; ++j) acc[r][j] = resume && r < rows && j < width ? c[r * ldc + j] : 0.0f;
  for (int64_t k = 0; k < K; ++k) {
    const float* bk = panel + k * ldp;
    for (int r = 0; r < R; ++r) {
      const float ar = a[k * ak + r * ar_];
      for (int j = 0; j < P; ++j) acc[r][j] = std::fma(ar, bk[j], acc[r][j]);
    }
  }
  for (int r = 0; r < rows; ++r) store_row(acc[r], bias, c + r * ldc, width);
}

#ifdef AGENTRL_X86
template <int R>
__attribute__((target("avx2,fma"))) void block_avx2(int rows, const float* a, int64_t ar_, int64_t ak,
                                                    const float* panel, int64_t ldp, int64_t K, const float* bias,
                                                    float* c, int64_t ldc, int64_t width, bool resume) {
  __m256 acc[R][2];
  alignas(32) float tmp[16];
  for (int r = 0; r < R; ++r) {
    if (resume && r < rows) {
      for (int j = 0; j < 16; ++j) tmp[j] = j < width ? c[r * ldc + j] : 0.0f;
      acc[r][0] = _mm256_load_ps(tmp);
      acc[r][1] = _mm256_load_ps(tmp + 8);
    } else {
      acc[r][0] = acc[r][1] = _mm256_setzero_ps();
    }
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m256 b0 = _mm256_loadu_ps(panel + k * ldp), b1 = _mm256_loadu_ps(panel + k * ldp + 8);
    for (int r = 0; r < R; ++r) {
      const __m256 ar = _mm256_broadcast_ss(a + k * ak + r * ar_);
      acc[r][0] = _mm256_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm256_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  for (int r = 0; r < rows; ++r) {
    if (width == 16 && !bias) {
      _mm256_storeu_ps(c + r * ldc, acc[r][0]);
      _mm256_storeu_ps(c + r * ldc + 8, acc[r][1]);
      continue;
    }
    _mm256_store_ps(tmp, acc[r][0]);
    _mm256_store_ps(tmp + 8, acc[r][1]);
    store_row(tmp, bias, c + r * ldc, width);
  }
}

template <int R>
__attribute__((target("avx512f"))) void block_avx512(int rows, const float* a, int64_t ar_, int64_t ak,
                                                     const float* panel, int64_t ldp, int64_t K, const float* bias,
                                                     float* c, int64_t ldc, int64_t width, bool resume) {
  const __mmask16 m0 = width >= 16 ? __mmask16(0xFFFF) : __mmask16((1u << width) - 1);
  const __mmask16 m1 = width >= 32 ? __mmask16(0xFFFF) : width <= 16 ? __mmask16(0) : __mmask16((1u << (width - 16)) - 1);
  __m512 acc[R][2];
  for (int r = 0; r < R; ++r) {
    const bool load = resume && r < rows;
    acc[r][0] = load ? _mm512_maskz_loadu_ps(m0, c + r * ldc) : _mm512_setzero_ps();
    acc[r][1] = load ? _mm512_maskz_loadu_ps(m1, c + r * ldc + 16) : _mm512_setzero_ps();
  }
  for (int64_t k = 0; k < K; ++k) {
    const __m512 b0 = _mm512_loadu_ps(panel + k * ldp), b1 = _mm512_loadu_ps(panel + k * ldp + 16);
    for (int r = 0; r < R; ++r) {
      const __m512 ar = _mm512_set1_ps(a[k * ak + r * ar_]);
      acc[r][0] = _mm512_fmadd_ps(ar, b0, acc[r][0]);
      acc[r][1] = _mm512_fmadd_ps(ar, b1, acc[r][1]);
    }
  }
  const __m512 bias0 = bias ? _mm512_maskz_loadu_ps(m0, bias) : _mm512_setzero_ps();
  const __m512 bias1 = bias ? _mm512_maskz_loadu_ps(m1, bias + 16) : _mm512_setzero_ps();
  for (int r = 0; r < rows; ++r) {
    _mm512_mask_storeu_ps(c + r * ldc, m0, bias ? _mm512_add_ps(acc[r][0], bias0) : acc[r][0]);
    _mm512_mask_storeu_ps(c + r * ldc + 16, m1, bias ? _mm512_add_ps(acc[r][1], bias1) : acc[r][1]);
  }
}

const bool kHasAvx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
const bool kHasAvx512 = __builtin_cpu_supports("avx512f");
#endif

int g_isa_cap = 2;   // 0 scalar, 1 avx2, 2 avx512: the widest path allowed (tests force each to compare bits)

int active_isa() {
#ifdef AGENTRL_X86
  if (kHasAvx512 && g_isa_cap >= 2) return 2;
  if (kHasAvx2 && g_isa_cap >= 1) return 1;
#endif
  return 0;
}

// the block shape of each path: rows R x panel width P
constexpr int kRowsOf[3] = {4, 6, 8};
constexpr int kPanelOf[3] = {16, 16, 32};

// resume: continue the sums stored in c (a later slice of K); bias: given with the last slice only
void block_rows(int isa, int rows, const float* a, int64_t ar, int64_t ak, const float* panel, int64_t ldp, int64_t K,
                const float* bias, float* c, int64_t ldc, int64_t width, bool resume) {
#ifdef AGENTRL_X86
  if (isa == 2) return block_avx512<8>(rows, a, ar, ak, panel, ldp, K, bias, c, ldc, width, resume);
  if (isa == 1) return block_avx2<6>(rows, a, ar, ak, panel, ldp, K, bias, c, ldc, width, resume);
#endif
  block_scalar<4>(rows, a, ar, ak, panel, ldp, K, bias, c, ldc, width, resume);
}

// K is cut into slices of kSlice: a thread runs every block of its share for one slice before the next slice (the
// slice of a B panel stays in cache across row blocks); a block's sums wait in C between slices, stored and
// reloaded exactly, so each output still sees its K terms in order.
constexpr int64_t kSlice = 256;

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name, ": expected a float32 CPU tensor");
}

// C = A B (+ bias) with B given as panels: panel p starts at panels[p] with row stride ldp[p]
at::Tensor mm_panels(const at::Tensor& a, int64_t N, const std::vector<const float*>& panel, const std::vector<int64_t>& ldp,
                     int isa, const at::Tensor& bias) {
  const int64_t M = a.size(0), K = a.size(1);
  at::Tensor c = at::empty({M, N}, a.options());
  if (M == 0 || N == 0) return c;
  const int P = kPanelOf[isa], R = kRowsOf[isa];
  const int64_t panels = (N + P - 1) / P, row_blocks = (M + R - 1) / R;
  const float* ap = a.data_ptr<float>();
  const int64_t sm = a.stride(0), sk = a.stride(1);
  const std::vector<float> tail = M % R ? pad_last_block(ap, M, K, sm, sk, R) : std::vector<float>();
  const float* bp = bias.defined() ? bias.data_ptr<float>() : nullptr;
  float* cp = c.data_ptr<float>();
  const int64_t tasks = row_blocks * panels;
  const int64_t grain = std::max<int64_t>(1, (int64_t{1} << 17) / std::max<int64_t>(1, int64_t{R} * P * K));
  at::parallel_for(0, tasks, grain, [&](int64_t begin, int64_t end) {
    for (int64_t k0 = 0; k0 < K; k0 += kSlice) {
      const int64_t kc = std::min<int64_t>(kSlice, K - k0);
      const bool last = k0 + kc == K;
      for (int64_t t = begin; t < end; ++t) {
        const int64_t p = t / row_blocks, rb = t % row_blocks;
        const int64_t m0 = rb * R, n0 = p * P;
        const int rows = static_cast<int>(std::min<int64_t>(R, M - m0));
        const int64_t width = std::min<int64_t>(P, N - n0);
        const bool partial = rows < R;
        const float* ablock = partial ? tail.data() + k0 * R : ap + m0 * sm + k0 * sk;
        block_rows(isa, rows, ablock, partial ? 1 : sm, partial ? R : sk, panel[p] + k0 * ldp[p], ldp[p], kc,
                   last && bp ? bp + n0 : nullptr, cp + m0 * N + n0, N, width, k0 > 0);
      }
    }
  });
  return c;
}

at::Tensor checked_bias(const c10::optional<at::Tensor>& bias_in, int64_t N) {
  at::Tensor bias;
  if (bias_in.has_value() && bias_in->defined()) {
    bias = bias_in->contiguous();
    check_float(bias, "bias");
    TORCH_CHECK(bias.numel() == N, "mm: bias has ", bias.numel(), " entries for ", N, " columns");
  }
  return bias;
}

// a [M, K] (any strides), b [K, N] (any strides), bias [N] or undefined -> [M, N]
at::Tensor mm(const at::Tensor& a, const at::Tensor& b, const c10::optional<at::Tensor>& bias_in) {
  check_float(a, "a");
  check_float(b, "b");
  TORCH_CHECK(a.dim() == 2 && b.dim() == 2 && a.size(1) == b.size(0), "mm: shapes ", a.sizes(), " and ", b.sizes(),
              " do not chain");
  const int64_t K = a.size(1), N = b.size(1);
  const at::Tensor bias = checked_bias(bias_in, N);
  const int isa = active_isa();
  const int P = kPanelOf[isa];
  const int64_t panels = (N + P - 1) / P;
  // B with contiguous rows is read in place, panel p at b + p * P with row stride ldb; otherwise (and for a last
  // panel narrower than P) it is copied into panels [K][P]
  const bool direct = b.stride(1) == 1 && K > 0;
  const int64_t full = direct ? N / P : 0;
  std::vector<float> packed(static_cast<size_t>((panels - full) * K * P));
  if (panels > full)
    pack_b(b.data_ptr<float>() + full * P * b.stride(1), K, N - full * P, b.stride(0), b.stride(1), P,
           packed.data());
  std::vector<const float*> panel(panels);
  std::vector<int64_t> ldp(panels);
  for (int64_t p = 0; p < panels; ++p) {
    const bool in_place = p < full;
    panel[p] = in_place ? b.data_ptr<float>() + p * P : packed.data() + (p - full) * K * P;
    ldp[p] = in_place ? b.stride(0) : P;
  }
  return mm_panels(a, N, panel, ldp, isa, bias);
}

// A linear layer's weight [N, K] packed once as the panels of its transpose, [panels, K, P] (P: the active path's
// panel width), for calls that multiply by the same weight many times (the sampler's decode)
at::Tensor pack_linear(const at::Tensor& w_in) {
  const at::Tensor w = w_in.contiguous();
  check_float(w, "weight");
  const int64_t N = w.size(0), K = w.size(1);
  const int P = kPanelOf[active_isa()];
  const int64_t panels = (N + P - 1) / P;
  at::Tensor out = at::empty({panels, K, P}, w.options());
  pack_b(w.data_ptr<float>(), K, N, 1, K, P, out.data_ptr<float>());
  return out;
}

// x [M, K] @ w.T + bias with w packed by pack_linear (N: w's rows)
at::Tensor mm_packed(const at::Tensor& a, const at::Tensor& packed, int64_t N, const c10::optional<at::Tensor>& bias_in) {
  check_float(a, "a");
  const int isa = active_isa();
  const int64_t panels = packed.size(0), K = packed.size(1), P = packed.size(2);
  TORCH_CHECK(P == kPanelOf[isa] && a.size(1) == K && panels * P >= N, "mm_packed: weights packed for another path");
  std::vector<const float*> panel(panels);
  std::vector<int64_t> ldp(panels, P);
  for (int64_t p = 0; p < panels; ++p) panel[p] = packed.data_ptr<float>() + p * K * P;
  return mm_panels(a, N, panel, ldp, isa, checked_bias(bias_in, N));
}

// s[n] = sum over m of x[m, n], m in order (what mm(ones [1, M], x) computes: fma(1, x, s) is s + x), lanes over n
at::Tensor colsum(const at::Tensor& x_in) {
  const at::Tensor x = x_in.contiguous();
  check_float(x, "x");
  TORCH_CHECK(x.dim() == 2, "colsum: a matrix");
  const int64_t M = x.size(0), N = x.size(1);
  at::Tensor s = at::zeros({N}, x.options());
  const float* xp = x.data_ptr<float>();
  float* sp = s.data_ptr<float>();
  at::parallel_for(0, N, 256, [&](int64_t begin, int64_t end) {
    for (int64_t m = 0; m < M; ++m) {
      const float* row = xp + m * N;
      for (int64_t n = begin; n < end; ++n) sp[n] = sp[n] + row[n];
    }
  });
  return s;
}

// ------------------------------------------------------------------------------------------------ attention
// Query i of a row attends to the keys j of its own row with j <= i (causal). With scale s = 1/sqrt(Dh):
//   score_j = s * dot(q_i, k_j)            dot: fma over d in order, from +0
//   m = max_j score_j;  p_j = exp(score_j - m);  l = sum_j p_j (j in order)
//   out_i[d] = (sum_j fma(p_j, v_j[d])) / l
// Keys are visited in index order in every path, so the packed rows here and the cache below agree. The backward
// first copies a head's keys and values into blocks transposed to [Dh][keys], so that eight of its dot products
// run in eight lanes at once, each lane still summing over d in order.

inline float dot(const float* x, const float* y, int64_t n) {
  float acc = 0.0f;
  for (int64_t d = 0; d < n; ++d) acc = std::fma(x[d], y[d], acc);
  return acc;
}

inline void exp_floats(const float* x, float* y, int64_t n) {
  map_floats<Fn::Exp>(x, y, n);
}

// keys (or values) of one head, transposed: t[d * stride + j] = the d-th element of key j
struct Transposed {
  std::vector<float> t;
  int64_t stride = 0;
  void fill(const float* const* rows, int64_t count, int64_t Dh) {
    stride = (count + 7) & ~int64_t{7};
    t.assign(static_cast<size_t>(Dh * stride), 0.0f);
    for (int64_t j = 0; j < count; ++j)
      for (int64_t d = 0; d < Dh; ++d) t[d * stride + j] = rows[j][d];
  }
};

// out[j] = scale * dot(q, key j) - shift for j < count (the keys transposed in kt): the scalar path's operations
inline void scores(const float* q, const Transposed& kt, int64_t count, int64_t Dh, float scale, float shift,
                   float* out) {
  int64_t j = 0;
#ifdef AGENTRL_X86
  if (active_isa() >= 1) {
    const __m256 s = _mm256_set1_ps(scale), sh = _mm256_set1_ps(shift);
    for (; j + 8 <= count; j += 8) {
      __m256 acc = _mm256_setzero_ps();
      for (int64_t d = 0; d < Dh; ++d)
        acc = _mm256_fmadd_ps(_mm256_set1_ps(q[d]), _mm256_loadu_ps(kt.t.data() + d * kt.stride + j), acc);
      _mm256_storeu_ps(out + j, _mm256_sub_ps(_mm256_mul_ps(s, acc), sh));
    }
  }
#endif
  for (; j < count; ++j) {
    float acc = 0.0f;
    for (int64_t d = 0; d < Dh; ++d) acc = std::fma(q[d], kt.t[d * kt.stride + j], acc);
    out[j] = scale * acc - shift;
  }
}

// one query against `count` keys (pointers to each key's and value's Dh floats); writes out[Dh], returns (m, l)
inline void attend(const float* q, const float* const* keys, const float* const* values, int64_t count, int64_t Dh,
                   float scale, float* scores, float* out, float* m_out, float* l_out) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < count; ++j) {
    scores[j] = scale * dot(q, keys[j], Dh);
    m = std::max(m, scores[j]);
  }
  for (int64_t j = 0; j < count; ++j) scores[j] = scores[j] - m;
  exp_floats(scores, scores, count);
  float l = 0.0f;
  for (int64_t d = 0; d < Dh; ++d) out[d] = 0.0f;
  for (int64_t j = 0; j < count; ++j) {
    const float p = scores[j];
    l += p;
    const float* vj = values[j];
    for (int64_t d = 0; d < Dh; ++d) out[d] = std::fma(p, vj[d], out[d]);
  }
  for (int64_t d = 0; d < Dh; ++d) out[d] = count ? out[d] / l : 0.0f;
  *m_out = m;
  *l_out = l;
}

// The accumulation of attend() for up to four queries at once: l_g += p_g[j] and out_g += p_g[j] v_g[j] for
// j in order, each query its own chain, interleaved so that the chains overlap (Dh == 16 on AVX2; otherwise one
// query at a time). p_g holds exp(score - m) already; out_g[Dh] = sum / l.
inline void accumulate_group(int nq, const float* const* p, const float* const* const* values, const int64_t* count,
                             int64_t Dh, float* const* out, float* l_out) {
#ifdef AGENTRL_X86
  if (Dh == 16 && active_isa() >= 1) {
    __m256 o0[4], o1[4];
    float l[4] = {0.0f, 0.0f, 0.0f, 0.0f};
    int64_t common = count[0];
    for (int g = 0; g < nq; ++g) {
      o0[g] = o1[g] = _mm256_setzero_ps();
      common = std::min(common, count[g]);
    }
    int64_t j = 0;
    if (nq == 4) {
      for (; j < common; ++j)
        for (int g = 0; g < 4; ++g) {
          const float pj = p[g][j];
          l[g] += pj;
          const __m256 w = _mm256_set1_ps(pj);
          o0[g] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values[g][j]), o0[g]);
          o1[g] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values[g][j] + 8), o1[g]);
        }
    }
    for (int g = 0; g < nq; ++g) {
      for (int64_t jj = j; jj < count[g]; ++jj) {
        const float pj = p[g][jj];
        l[g] += pj;
        const __m256 w = _mm256_set1_ps(pj);
        o0[g] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values[g][jj]), o0[g]);
        o1[g] = _mm256_fmadd_ps(w, _mm256_loadu_ps(values[g][jj] + 8), o1[g]);
      }
      const __m256 denom = _mm256_set1_ps(l[g]);
      const bool any = count[g] > 0;
      _mm256_storeu_ps(out[g], any ? _mm256_div_ps(o0[g], denom) : _mm256_setzero_ps());
      _mm256_storeu_ps(out[g] + 8, any ? _mm256_div_ps(o1[g], denom) : _mm256_setzero_ps());
      l_out[g] = l[g];
    }
    return;
  }
#endif
  for (int g = 0; g < nq; ++g) {
    float l = 0.0f;
    float* o = out[g];
    for (int64_t d = 0; d < Dh; ++d) o[d] = 0.0f;
    for (int64_t j = 0; j < count[g]; ++j) {
      l += p[g][j];
      for (int64_t d = 0; d < Dh; ++d) o[d] = std::fma(p[g][j], values[g][j][d], o[d]);
    }
    for (int64_t d = 0; d < Dh; ++d) o[d] = count[g] ? o[d] / l : 0.0f;
    l_out[g] = l;
  }
}

// exp(score - m) of one query in place over p[count] (p holds the scores); returns m
inline float softmax_numerators(float* p, int64_t count) {
  float m = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < count; ++j) m = std::max(m, p[j]);
  for (int64_t j = 0; j < count; ++j) p[j] = p[j] - m;
  exp_floats(p, p, count);
  return m;
}

// q, k, v [N, H, Dh] contiguous; starts [B + 1] (row b holds tokens starts[b] .. starts[b+1]-1)
// -> out [N, H, Dh], stats [N, H, 2] (m, l) for the backward
std::vector<at::Tensor> attention_forward(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                                          const at::Tensor& starts_in) {
  for (auto* t : {&q, &k, &v}) check_float(*t, "q/k/v");
  TORCH_CHECK(q.is_contiguous() && k.is_contiguous() && v.is_contiguous() && q.dim() == 3 && q.sizes() == k.sizes()
              && q.sizes() == v.sizes(), "attention: q, k, v must be contiguous [N, H, Dh] of one shape");
  const at::Tensor starts = starts_in.to(at::kLong).contiguous();
  const int64_t H = q.size(1), Dh = q.size(2), B = starts.numel() - 1;
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  at::Tensor out = at::empty_like(q), stats = at::empty({q.size(0), H, 2}, q.options());
  const int64_t* st = starts.data_ptr<int64_t>();
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  float *op = out.data_ptr<float>(), *sp = stats.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<const float*> keys, values;
    std::vector<float> p;
    Transposed kt;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / H, h = t % H, s0 = st[b], n = st[b + 1] - st[b];
      keys.resize(n);
      values.resize(n);
      p.resize(4 * (n + 8));
      for (int64_t j = 0; j < n; ++j) {
        keys[j] = kp + ((s0 + j) * H + h) * Dh;
        values[j] = vp + ((s0 + j) * H + h) * Dh;
      }
      kt.fill(keys.data(), n, Dh);
      for (int64_t i0 = 0; i0 < n; i0 += 4) {
        const int nq = static_cast<int>(std::min<int64_t>(4, n - i0));
        const float* pg[4];
        const float* const* vg[4];
        int64_t count[4];
        float* og[4];
        float lg[4];
        for (int g = 0; g < nq; ++g) {
          const int64_t i = i0 + g, row = (s0 + i) * H + h;
          float* pi = p.data() + g * (n + 8);
          scores(qp + row * Dh, kt, i + 1, Dh, scale, 0.0f, pi);
          sp[row * 2] = softmax_numerators(pi, i + 1);
          pg[g] = pi;
          vg[g] = values.data();
          count[g] = i + 1;
          og[g] = op + row * Dh;
        }
        accumulate_group(nq, pg, vg, count, Dh, og, lg);
        for (int g = 0; g < nq; ++g) sp[((s0 + i0 + g) * H + h) * 2 + 1] = lg[g];
      }
    }
  });
  return {out, stats};
}

// The gradient of attention_forward: with P_ij = p_ij / l_i, D_i = dot(dout_i, out_i) and
// dS_ij = P_ij (dot(dout_i, v_j) - D_i):  dq_i = s sum_j dS_ij k_j,  dk_j = s sum_i dS_ij q_i,  dv_j = sum_i P_ij dout_i
// (sums in index order).
std::vector<at::Tensor> attention_backward(const at::Tensor& dout_in, const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, const at::Tensor& out, const at::Tensor& stats,
                                           const at::Tensor& starts_in) {
  const at::Tensor dout = dout_in.contiguous();
  check_float(dout, "dout");
  const at::Tensor starts = starts_in.to(at::kLong).contiguous();
  const int64_t H = q.size(1), Dh = q.size(2), B = starts.numel() - 1;
  TORCH_CHECK(Dh <= 128, "attention_backward: head width up to 128");
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  at::Tensor dq = at::empty_like(q), dk = at::zeros_like(k), dv = at::zeros_like(v);
  const int64_t* st = starts.data_ptr<int64_t>();
  const float *qp = q.data_ptr<float>(), *kp = k.data_ptr<float>(), *vp = v.data_ptr<float>();
  const float *op = out.data_ptr<float>(), *sp = stats.data_ptr<float>(), *gp = dout.data_ptr<float>();
  float *dqp = dq.data_ptr<float>(), *dkp = dk.data_ptr<float>(), *dvp = dv.data_ptr<float>();
  at::parallel_for(0, B * H, 1, [&](int64_t begin, int64_t end) {
    std::vector<const float*> keys, values;
    std::vector<float> P, dp, ds;
    Transposed kt, vt;
    for (int64_t t = begin; t < end; ++t) {
      const int64_t b = t / H, h = t % H, s0 = st[b], n = st[b + 1] - st[b];
      keys.resize(n);
      values.resize(n);
      P.resize(4 * (n + 8));
      dp.resize(4 * (n + 8));
      ds.resize(4 * (n + 8));
      auto at_ = [&](const float* base, int64_t i) { return base + ((s0 + i) * H + h) * Dh; };
      auto at_mut = [&](float* base, int64_t i) { return base + ((s0 + i) * H + h) * Dh; };
      for (int64_t j = 0; j < n; ++j) {
        keys[j] = at_(kp, j);
        values[j] = at_(vp, j);
      }
      kt.fill(keys.data(), n, Dh);
      vt.fill(values.data(), n, Dh);
      for (int64_t i0 = 0; i0 < n; i0 += 4) {   // four queries at a time: their chains interleave
        const int nq = static_cast<int>(std::min<int64_t>(4, n - i0));
        float* Pg[4];
        float* dsg[4];
        for (int g = 0; g < nq; ++g) {
          const int64_t i = i0 + g, row = (s0 + i) * H + h;
          const float m = sp[row * 2], l = sp[row * 2 + 1];
          const float* qi = at_(qp, i);
          const float* gi = at_(gp, i);
          const float Di = dot(gi, at_(op, i), Dh);
          float* P_ = P.data() + g * (n + 8);
          float* dp_ = dp.data() + g * (n + 8);
          float* ds_ = ds.data() + g * (n + 8);
          scores(qi, kt, i + 1, Dh, scale, m, P_);   // scale * dot(q_i, k_j) - m
          exp_floats(P_, P_, i + 1);
          scores(gi, vt, i + 1, Dh, 1.0f, 0.0f, dp_);   // 1 * dot(dout_i, v_j) - 0: the dot itself
          for (int64_t j = 0; j <= i; ++j) {
            P_[j] = P_[j] / l;
            ds_[j] = P_[j] * (dp_[j] - Di);
          }
          Pg[g] = P_;
          dsg[g] = ds_;
        }
        // for j in order: dv_j += P_ij dout_i and dk_j += (s dS_ij) q_i for the group's i in order; dq_i += dS_ij k_j
        float dqacc[4][128];
        for (int g = 0; g < nq; ++g)
          for (int64_t d = 0; d < Dh; ++d) dqacc[g][d] = 0.0f;
        const int64_t jmax = i0 + nq - 1;
        for (int64_t j = 0; j <= jmax; ++j) {
          float* dvj = at_mut(dvp, j);
          float* dkj = at_mut(dkp, j);
          const float* kj = keys[j];
          for (int g = 0; g < nq; ++g) {
            if (j > i0 + g) continue;
            const float Pj = Pg[g][j], dsj = dsg[g][j], w = scale * dsj;
            const float* gi = at_(gp, i0 + g);
            const float* qi = at_(qp, i0 + g);
            for (int64_t d = 0; d < Dh; ++d) {
              dvj[d] = std::fma(Pj, gi[d], dvj[d]);
              dkj[d] = std::fma(w, qi[d], dkj[d]);
              dqacc[g][d] = std::fma(dsj, kj[d], dqacc[g][d]);
            }
          }
        }
        for (int g = 0; g < nq; ++g) {
          float* dqi = at_mut(dqp, i0 + g);
          for (int64_t d = 0; d < Dh; ++d) dqi[d] = scale * dqacc[g][d];
        }
      }
    }
  });
  return {dq, dk, dv};
}

// The sampler's attention: queries q [M, H, Dh] at (row[m], slot[m]) of a cache keys, values [R, H, C, Dh] whose
// slots valid [R, C] hold a token; query m attends to the valid slots <= slot[m] of its row, in slot order (the
// same keys, in the same order, as the packed pass over that row's tokens).
at::Tensor attention_cached(const at::Tensor& q_in, const at::Tensor& row_in, const at::Tensor& slot_in,
                            const at::Tensor& keys, const at::Tensor& values, const at::Tensor& valid_in) {
  const at::Tensor q = q_in.contiguous();
  check_float(q, "q");
  check_float(keys, "keys");
  check_float(values, "values");
  const at::Tensor row = row_in.to(at::kLong).contiguous(), slot = slot_in.to(at::kLong).contiguous();
  const at::Tensor valid = valid_in.to(at::kBool).contiguous();
  const int64_t M = q.size(0), H = q.size(1), Dh = q.size(2), C = valid.size(1);
  TORCH_CHECK(keys.size(3) == Dh && keys.stride(3) == 1 && values.stride(3) == 1, "attention_cached: layout");
  const float scale = 1.0f / std::sqrt(static_cast<float>(Dh));
  at::Tensor out = at::empty_like(q);
  const int64_t *rp = row.data_ptr<int64_t>(), *slp = slot.data_ptr<int64_t>();
  const bool* vp = valid.data_ptr<bool>();
  const float *qp = q.data_ptr<float>(), *kp = keys.data_ptr<float>(), *valp = values.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t ks0 = keys.stride(0), ks1 = keys.stride(1), ks2 = keys.stride(2);
  const int64_t vs0 = values.stride(0), vs1 = values.stride(1), vs2 = values.stride(2);
  at::parallel_for(0, M, 4, [&](int64_t begin, int64_t end) {
    std::vector<int64_t> seen;
    std::vector<const float*> ks, vs;   // [H][count]
    std::vector<float> p;               // [H][count + 8]
    for (int64_t m = begin; m < end; ++m) {
      const int64_t r = rp[m], last = std::min<int64_t>(slp[m], C - 1);
      seen.clear();
      for (int64_t j = 0; j <= last; ++j)
        if (vp[r * C + j]) seen.push_back(j);
      const int64_t count = static_cast<int64_t>(seen.size()), width = count + 8;
      ks.resize(H * count);
      vs.resize(H * count);
      p.resize(H * width);
      for (int64_t h = 0; h < H; ++h) {
        const float* qh = qp + (m * H + h) * Dh;
        float* ph = p.data() + h * width;
        for (int64_t j = 0; j < count; ++j) {
          ks[h * count + j] = kp + r * ks0 + h * ks1 + seen[j] * ks2;
          vs[h * count + j] = valp + r * vs0 + h * vs1 + seen[j] * vs2;
          ph[j] = scale * dot(qh, ks[h * count + j], Dh);
        }
        softmax_numerators(ph, count);
      }
      for (int64_t h0 = 0; h0 < H; h0 += 4) {   // the heads' sums, four chains at a time
        const int nq = static_cast<int>(std::min<int64_t>(4, H - h0));
        const float* pg[4];
        const float* const* vg[4];
        int64_t counts[4];
        float* og[4];
        float lg[4];
        for (int g = 0; g < nq; ++g) {
          pg[g] = p.data() + (h0 + g) * width;
          vg[g] = vs.data() + (h0 + g) * count;
          counts[g] = count;
          og[g] = op + (m * H + h0 + g) * Dh;
        }
        accumulate_group(nq, pg, vg, counts, Dh, og, lg);
      }
    }
  });
  return out;
}

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
// per-layer path (agentrl.model.policy: Block.cached) -- ATen's layer norm and addition, the kernels above -- so
// its results are that path's bits, without a Python call per operation.
//   x [M, D] at the chunk's computed slots; per layer 12 tensors (ln1 w, b; qkv w, b; proj w, b; ln2 w, b; up w, b;
//   down w, b; each linear weight packed by pack_linear); kv [2, layers, R, H, C, Dh]; valid [R, C]; row, slot [M] -> x after the last block [M, D]
// every block for the queries [m0, m1) (all queries of their cache rows), written into out
void decode_rows(const at::Tensor& x_in, int64_t m0, int64_t m1, const std::vector<at::Tensor>& weights,
                 const at::Tensor& kv, const at::Tensor& valid, const at::Tensor& row, const at::Tensor& slot,
                 double eps, at::Tensor& out) {
  at::AutoDispatchBelowAutograd below_autograd;   // no gradient here (and a worker thread has no grad mode set)
  const int64_t layers = kv.size(1), M = m1 - m0, D = x_in.size(1), H = kv.size(3), Dh = kv.size(5);
  at::Tensor x = x_in.narrow(0, m0, M);
  const at::Tensor rows = row.narrow(0, m0, M), slots = slot.narrow(0, m0, M);
  const int64_t* rp = rows.data_ptr<int64_t>();
  const int64_t* sp = slots.data_ptr<int64_t>();
  for (int64_t i = 0; i < layers; ++i) {
    const at::Tensor* w = weights.data() + 12 * i;
    const at::Tensor keys = kv[0][i], values = kv[1][i];
    const at::Tensor qkv = mm_packed(at::layer_norm(x, {D}, w[0], w[1], eps), w[2], 3 * D, w[3]);   // [M, 3D]
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
    x = at::add(x, mm_packed(y, w[4], D, w[5]));
    const at::Tensor h2 = at::layer_norm(x, {D}, w[6], w[7], eps);
    const at::Tensor up = mm_packed(h2, w[8], w[9].numel(), w[9]);
    x = at::add(x, mm_packed(gelu_(up), w[10], D, w[11]));
  }
  out.narrow(0, m0, M).copy_(x);
}

// decode(...) -> the hidden states after the last block [M, D]; with `head` (ln_f weight, ln_f bias, the output
// layer's weight packed, of `vocab` rows; `last`: which of the M rows, or every row if undefined) -> their logits,
// as the model's _logits computes them
at::Tensor decode(const at::Tensor& x, const std::vector<at::Tensor>& weights, const at::Tensor& kv,
                  const at::Tensor& valid, const at::Tensor& row_in, const at::Tensor& slot_in, double eps,
                  const std::vector<at::Tensor>& head, int64_t vocab, const c10::optional<at::Tensor>& last) {
  const int64_t layers = kv.size(1), M = x.size(0), D = x.size(1), H = kv.size(3), Dh = kv.size(5);
  TORCH_CHECK(static_cast<int64_t>(weights.size()) == 12 * layers, "decode: 12 weight tensors per layer");
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
    decode_rows(x, starts[begin], starts[end], weights, kv, valid, row, slot, eps, out);
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
  m.def("exp", &exp_);
  m.def("sqrt", &sqrt_);
  m.def("gelu", &gelu_);
  m.def("gelu_backward", &gelu_backward);
  m.def("set_isa_cap", &set_isa_cap);
  m.def("isa", &isa);
}
