// Lane types, the vector paths and the elementwise map (part of fixed.cpp, included inside its anonymous namespace; fixed.cpp's header says
// what the rule of every kernel here is).

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

// the vector paths this CPU has, and the widest one allowed (AGENTRL_KERNELS_ISA)
#ifdef AGENTRL_X86
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

void check_float(const at::Tensor& t, const char* name) {
  TORCH_CHECK(t.device().is_cpu() && t.scalar_type() == at::kFloat, name, ": expected a float32 CPU tensor");
}

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
