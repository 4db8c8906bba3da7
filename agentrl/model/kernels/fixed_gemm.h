// Matrix products (part of fixed.cpp, included inside its anonymous namespace; fixed.cpp's header says
// what the rule of every kernel here is).

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

#endif

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
