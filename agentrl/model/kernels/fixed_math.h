// The elementwise math of fixed.cpp, written once over a lane type O (fixed.cpp includes this file twice: with
// its default ISA, and again inside an AVX-512 target region, so that each lane type compiles for its own ISA).
// Scalar defines the result; every lane type performs the same IEEE operations on each lane. No #include here: the
// including file provides <cmath> and <limits>.

constexpr float kExpHi = 88.72283935546875f, kExpLo = -103.97208404541015625f;

// exp(x): Cody-Waite reduction x = n ln2 + r (|r| <= ln2/2), a degree-6 minimax polynomial (Cephes' expf),
// then 2^n applied in two steps so that results below the normal range round once, as denormals. NaN stays NaN,
// exp(x > kExpHi) = inf, exp(x < kExpLo) = 0.
template <class O>
AGENTRL_INLINE typename O::V exp_t(typename O::V x) {
  using V = typename O::V;
  const V xc = O::clamp(x, kExpLo, kExpHi);
  const V n = O::floor(O::fma(xc, O::set(1.44269504088896341f), O::set(0.5f)));
  V r = O::fma(n, O::set(-0.693359375f), xc);
  r = O::fma(n, O::set(2.12194440e-4f), r);
  V p = O::set(1.9875691500e-4f);
  p = O::fma(p, r, O::set(1.3981999507e-3f));
  p = O::fma(p, r, O::set(8.3334519073e-3f));
  p = O::fma(p, r, O::set(4.1665795894e-2f));
  p = O::fma(p, r, O::set(1.6666665459e-1f));
  p = O::fma(p, r, O::set(5.0000001201e-1f));
  const V y = O::add(O::fma(p, O::mul(r, r), r), O::set(1.0f));
  V p1, p2;
  O::pow2_pair(O::select(O::isnan(n), O::set(0.0f), n), &p1, &p2);
  V out = O::mul(O::mul(y, p1), p2);
  out = O::select(O::gt(x, O::set(kExpHi)), O::set(std::numeric_limits<float>::infinity()), out);
  out = O::select(O::lt(x, O::set(kExpLo)), O::set(0.0f), out);
  return O::select(O::isnan(x), x, out);
}

// erfc(z) for z >= 0: Numerical Recipes' erfcc (fractional error < 1.2e-7 in exact arithmetic).
template <class O>
AGENTRL_INLINE typename O::V erfc_nonneg_t(typename O::V z) {
  using V = typename O::V;
  const V t = O::div(O::set(1.0f), O::fma(O::set(0.5f), z, O::set(1.0f)));
  V p = O::set(0.17087277f);
  p = O::fma(p, t, O::set(-0.82215223f));
  p = O::fma(p, t, O::set(1.48851587f));
  p = O::fma(p, t, O::set(-1.13520398f));
  p = O::fma(p, t, O::set(0.27886807f));
  p = O::fma(p, t, O::set(-0.18628806f));
  p = O::fma(p, t, O::set(0.09678418f));
  p = O::fma(p, t, O::set(0.37409196f));
  p = O::fma(p, t, O::set(1.00002368f));
  p = O::fma(p, t, O::set(-1.26551223f));
  return O::mul(t, exp_t<O>(O::fma(O::neg(z), z, p)));
}

constexpr float kInvSqrt2 = 0.70710678118654752f;
constexpr float kInvSqrt2Pi = 0.39894228040143268f;

// Phi(x) = P(N(0,1) <= x) = erfc(-x / sqrt 2) / 2, from erfc(|u|): erfc(u) = 2 - erfc(-u) for u < 0
template <class O>
AGENTRL_INLINE typename O::V normal_cdf_t(typename O::V x) {
  const typename O::V u = O::mul(O::neg(x), O::set(kInvSqrt2)), e = erfc_nonneg_t<O>(O::abs(u));
  return O::mul(O::set(0.5f), O::select(O::ge(u, O::set(0.0f)), e, O::sub(O::set(2.0f), e)));
}

template <class O>
typename O::V gelu_t(typename O::V x) { return O::mul(x, normal_cdf_t<O>(x)); }

// d/dx x Phi(x) = Phi(x) + x phi(x)
template <class O>
typename O::V gelu_grad_t(typename O::V x) {
  const typename O::V half_sq = O::mul(O::mul(O::set(-0.5f), x), x);
  return O::fma(x, O::mul(O::set(kInvSqrt2Pi), exp_t<O>(half_sq)), normal_cdf_t<O>(x));
}

template <class O>
AGENTRL_INLINE typename O::V sqrt_t(typename O::V x) { return O::sqrt(x); }
