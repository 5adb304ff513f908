// y [M, N] = x [M, K] . w [N, K]^T (+ bias) (+ residual) for a few rows (decode steps, M up
// to 8) on the CPU, float32. At a few rows a linear layer is bound by reading its weight
// once; oneDNN's and MKL's GEMM kernels read a vocabulary-sized weight at about half the
// rate a GEMV does (kernels/README in small_gemm.py). Here each weight row is read once,
// from memory, and dotted with every x row while it is in L1: 16 lanes along K, one
// accumulator per x row, then a horizontal sum. Each output element is summed in the same
// order whatever M is, so a row's result does not depend on the others in the step.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <algorithm>
#include <cstdint>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace {

constexpr int64_t kMaxRows = 8;

// res[i][j] = w row i . x row j over K, for NB weight rows and MC x rows (NB * MC
// accumulators; each (i, j) summed lane-wise along K, then across lanes, the same order
// whatever NB and MC are).
#ifdef __AVX512F__
template <int NB, int MC>
inline void dot_block(const float* const* ws, const float* const* xs, int64_t K,
                      float res[][4]) {
  __m512 acc[NB][MC];
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MC; ++j) acc[i][j] = _mm512_setzero_ps();
  int64_t k = 0;
  for (; k + 16 <= K; k += 16) {
    __m512 xv[MC];
    for (int j = 0; j < MC; ++j) xv[j] = _mm512_loadu_ps(xs[j] + k);
    for (int i = 0; i < NB; ++i) {
      _mm_prefetch(reinterpret_cast<const char*>(ws[i] + k) + 8192, _MM_HINT_T0);
      const __m512 wv = _mm512_loadu_ps(ws[i] + k);
      for (int j = 0; j < MC; ++j) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  if (k < K) {
    const __mmask16 m = static_cast<__mmask16>((1u << (K - k)) - 1);
    __m512 xv[MC];
    for (int j = 0; j < MC; ++j) xv[j] = _mm512_maskz_loadu_ps(m, xs[j] + k);
    for (int i = 0; i < NB; ++i) {
      const __m512 wv = _mm512_maskz_loadu_ps(m, ws[i] + k);
      for (int j = 0; j < MC; ++j) acc[i][j] = _mm512_fmadd_ps(wv, xv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MC; ++j) res[i][j] = _mm512_reduce_add_ps(acc[i][j]);
}
#else
template <int NB, int MC>
inline void dot_block(const float* const* ws, const float* const* xs, int64_t K,
                      float res[][4]) {
  for (int i = 0; i < NB; ++i)
    for (int j = 0; j < MC; ++j) {
      float acc[16] = {};
      for (int64_t k = 0; k < K; ++k) acc[k % 16] += ws[i][k] * xs[j][k];
      float s = 0.f;
      for (int l = 0; l < 16; ++l) s += acc[l];
      res[i][j] = s;
    }
}
#endif

constexpr int kNB = 4;  // weight rows per block

// Rows of x go in chunks of MC (at most 4); each block of kNB weight rows is read from
// memory once and from L1 for the later chunks.
template <int MC>
void run(const float* x, int64_t xs, const float* w, const float* bias, const float* r,
         int64_t rs, float* out, int64_t os, int64_t M, int64_t N, int64_t K) {
  at::parallel_for(0, (N + kNB - 1) / kNB, 64, [&](int64_t begin, int64_t end) {
    float res[kNB][4];
    const float* rows[MC];
    const float* ws[kNB];
    for (int64_t blk = begin; blk < end; ++blk) {
      const int64_t n0 = blk * kNB, nb = std::min<int64_t>(kNB, N - n0);
      for (int64_t i = 0; i < nb; ++i) ws[i] = w + (n0 + i) * K;
      for (int64_t m0 = 0; m0 < M; m0 += MC) {
        const int64_t mc = std::min<int64_t>(MC, M - m0);
        for (int j = 0; j < MC; ++j) rows[j] = x + (m0 + std::min<int64_t>(j, mc - 1)) * xs;
        if (nb == kNB) {
          dot_block<kNB, MC>(ws, rows, K, res);
        } else {  // the last, partial block: one weight row at a time
          for (int64_t i = 0; i < nb; ++i) dot_block<1, MC>(ws + i, rows, K, res + i);
        }
        for (int64_t i = 0; i < nb; ++i) {
          const int64_t n = n0 + i;
          for (int64_t j = 0; j < mc; ++j) {
            const int64_t m = m0 + j;
            float y = bias ? res[i][j] + bias[n] : res[i][j];
            if (r) y = r[m * rs + n] + y;
            out[m * os + n] = y;
          }
        }
      }
    }
  });
}

}  // namespace

// out [M, N] = x [M, K] . weight [N, K]^T (+ bias [N]) (+ residual [M, N]), M in 1..8,
// float32; rows of x, residual and out contiguous (any row stride), weight contiguous.
void small_linear(torch::Tensor x, torch::Tensor weight, c10::optional<torch::Tensor> bias,
                  c10::optional<torch::Tensor> residual, torch::Tensor out) {
  auto rows_ok = [](const torch::Tensor& t) {
    return t.is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 2 && t.stride(1) == 1;
  };
  TORCH_CHECK(rows_ok(x) && rows_ok(out), "x, out: float32 CPU [rows, n], rows contiguous");
  TORCH_CHECK(rows_ok(weight) && weight.is_contiguous(), "weight: contiguous float32 [N, K]");
  const int64_t M = x.size(0), K = x.size(1), N = weight.size(0);
  TORCH_CHECK(M >= 1 && M <= kMaxRows, "small_linear: 1 to 8 rows, got ", M);
  TORCH_CHECK(weight.size(1) == K && out.size(0) == M && out.size(1) == N, "shapes");
  const float* b = nullptr;
  if (bias.has_value()) {
    TORCH_CHECK(bias->is_cpu() && bias->scalar_type() == at::kFloat && bias->is_contiguous() &&
                bias->numel() == N, "bias: float32 [N]");
    b = bias->data_ptr<float>();
  }
  const float* r = nullptr;
  int64_t rs = 0;
  if (residual.has_value()) {
    TORCH_CHECK(rows_ok(*residual) && residual->size(0) == M && residual->size(1) == N,
                "residual: float32 [M, N], rows contiguous");
    r = residual->data_ptr<float>();
    rs = residual->stride(0);
  }
  const float* xp = x.data_ptr<float>();
  const float* wp = weight.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const int64_t xs = x.stride(0), os = out.stride(0);
  // x rows in chunks of at most 4 of equal size (8 rows: two chunks of 4)
  const int64_t chunks = (M + 3) / 4;
  switch ((M + chunks - 1) / chunks) {
    case 1: run<1>(xp, xs, wp, b, r, rs, op, os, M, N, K); break;
    case 2: run<2>(xp, xs, wp, b, r, rs, op, os, M, N, K); break;
    case 3: run<3>(xp, xs, wp, b, r, rs, op, os, M, N, K); break;
    default: run<4>(xp, xs, wp, b, r, rs, op, os, M, N, K); break;
  }
}
