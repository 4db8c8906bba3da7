// Attention (part of fixed.cpp, included inside its anonymous namespace; fixed.cpp's header says
// what the rule of every kernel here is).

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
