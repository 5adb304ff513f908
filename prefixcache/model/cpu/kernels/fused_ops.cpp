// Fused elementwise ops of the decoder layer on the CPU (float32): each replaces a chain of
// torch ops by one pass over the data, with the same roundings in the same order, so the
// results are the bits torch computes (fused_ops.py checks that on load and falls back to
// torch ops if not):
//   rope_write  RoPE of q and k in place in the fused qkv projection, and the KV write
//               into the pool (apply_rope + two index_copy_ calls);
//   silu_mul    silu(gate) * up from the fused gate/up projection (F.silu + mul_);
//   rms_apply   (x * r) * weight, RMSNorm after its mean square (mul + mul_).
// This file is compiled without fast-math and without FMA contraction (the pragma below):
// a contracted a * b - c or a reciprocal in place of a division would change the bits.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <cmath>
#include <cstdint>
#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
// torch's vectorised exp (Vectorized<float>::exp on AVX-512 / AVX2), exported by libtorch_cpu
#ifdef __AVX512F__
extern "C" __m512 Sleef_expf16_u10(__m512);
constexpr int kVecWidth = 16;
#elif defined(__AVX2__)
extern "C" __m256 Sleef_expf8_u10(__m256);
constexpr int kVecWidth = 8;
#else
constexpr int kVecWidth = 1;
#endif

#pragma GCC push_options
#pragma GCC optimize("no-fast-math", "fp-contract=off")

namespace {

template <typename T>
inline T store_as(float x) { return static_cast<T>(x); }  // BFloat16: round to nearest even

// One token's heads [H][D] rotated in place: per pair (a, b) = (x[i], x[i + D/2]),
// a' = a cos_i - b sin_i and b' = b cos_{i+D/2} + a sin_i, each product rounded first
// (the roundings of x * cos, then -= / += rotate_half(x) * sin).
inline void rotate(float* x, int64_t H, int64_t D, const float* c, const float* s) {
  const int64_t half = D / 2;
  for (int64_t h = 0; h < H; ++h) {
    float* a = x + h * D;
    float* b = a + half;
    for (int64_t i = 0; i < half; ++i) {
      const float ai = a[i], bi = b[i];
      const float ac = ai * c[i], bs = bi * s[i];
      const float bc = bi * c[half + i], as = ai * s[i];
      a[i] = ac - bs;
      b[i] = bc + as;
    }
  }
}

template <typename T>
void rope_write_impl(float* qkv, int64_t row_stride, const float* cos, const float* sin,
                     const int64_t* slots, T* k_pool, T* v_pool, int64_t n, int64_t Hq,
                     int64_t Hkv, int64_t D) {
  at::parallel_for(0, n, 16, [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      float* row = qkv + t * row_stride;
      rotate(row, Hq + Hkv, D, cos + t * D, sin + t * D);  // q heads, then k heads
      const float* k = row + Hq * D;
      const float* v = k + Hkv * D;
      T* kd = k_pool + slots[t] * Hkv * D;
      T* vd = v_pool + slots[t] * Hkv * D;
      for (int64_t e = 0; e < Hkv * D; ++e) {
        kd[e] = store_as<T>(k[e]);
        vd[e] = store_as<T>(v[e]);
      }
    }
  });
}

// silu(x) * u for n elements: torch's vector path (x / (1 + exp(-x)), Sleef's exp) on the
// first whole blocks of two vectors of the row, its scalar path (std::exp) on the rest, as
// torch's cpu_kernel_vec loop does (torch's vector width must be this build's: checked on
// load by fused_ops.py).
inline void silu_mul_row(const float* g, const float* u, float* o, int64_t n) {
  int64_t i = 0;
#ifdef __AVX512F__
  const __m512 one = _mm512_set1_ps(1.f), sign = _mm512_set1_ps(-0.f);
  for (; i + 32 <= n; i += 16) {
    const __m512 x = _mm512_loadu_ps(g + i);
    const __m512 e = Sleef_expf16_u10(_mm512_xor_ps(sign, x));
    const __m512 s = _mm512_div_ps(x, _mm512_add_ps(one, e));
    _mm512_storeu_ps(o + i, _mm512_mul_ps(s, _mm512_loadu_ps(u + i)));
    const __m512 x2 = _mm512_loadu_ps(g + i + 16);
    const __m512 e2 = Sleef_expf16_u10(_mm512_xor_ps(sign, x2));
    const __m512 s2 = _mm512_div_ps(x2, _mm512_add_ps(one, e2));
    _mm512_storeu_ps(o + i + 16, _mm512_mul_ps(s2, _mm512_loadu_ps(u + i + 16)));
    i += 16;
  }
#elif defined(__AVX2__)
  const __m256 one = _mm256_set1_ps(1.f), sign = _mm256_set1_ps(-0.f);
  for (; i + 16 <= n; i += 16) {
    for (int64_t j = i; j < i + 16; j += 8) {
      const __m256 x = _mm256_loadu_ps(g + j);
      const __m256 e = Sleef_expf8_u10(_mm256_xor_ps(sign, x));
      const __m256 s = _mm256_div_ps(x, _mm256_add_ps(one, e));
      _mm256_storeu_ps(o + j, _mm256_mul_ps(s, _mm256_loadu_ps(u + j)));
    }
  }
#endif
  for (; i < n; ++i) {
    const float x = g[i];
    const float s = x / (1.f + std::exp(-x));
    o[i] = s * u[i];
  }
}

void check_rows(const torch::Tensor& t, const char* name) {
  TORCH_CHECK(t.is_cpu() && t.scalar_type() == at::kFloat && t.dim() == 2 &&
              t.stride(1) == 1 && t.stride(0) >= t.size(1),
              name, ": float32 CPU [rows, n] with contiguous rows");
}

}  // namespace

// RoPE of the q and k heads of qkv [n, (Hq + 2 Hkv) * D] in place (cos, sin [n, D]) and the
// rotated k and the v of each token written to slot slots[t] of k_pool / v_pool
// [P, bs, Hkv, D] (float32 or bfloat16).
void rope_write(torch::Tensor qkv, torch::Tensor cos, torch::Tensor sin, int64_t num_heads,
                torch::Tensor slots, torch::Tensor k_pool, torch::Tensor v_pool) {
  check_rows(qkv, "qkv");
  check_rows(cos, "cos");
  check_rows(sin, "sin");
  TORCH_CHECK(k_pool.is_cpu() && k_pool.is_contiguous() && v_pool.is_contiguous() &&
              k_pool.dim() == 4 && k_pool.sizes() == v_pool.sizes() &&
              k_pool.scalar_type() == v_pool.scalar_type(), "k_pool, v_pool: one shape");
  const int64_t n = qkv.size(0), Hkv = k_pool.size(2), D = k_pool.size(3);
  TORCH_CHECK(D % 2 == 0 && num_heads >= 1 && qkv.size(1) == (num_heads + 2 * Hkv) * D,
              "qkv: [n, (heads + 2 kv_heads) * head_dim]");
  TORCH_CHECK(cos.size(0) == n && sin.size(0) == n && cos.size(1) == D && sin.size(1) == D,
              "cos, sin: [n, head_dim]");
  TORCH_CHECK(cos.is_contiguous() && sin.is_contiguous(), "cos, sin: contiguous");
  TORCH_CHECK(slots.is_cpu() && slots.is_contiguous() && slots.scalar_type() == at::kLong &&
              slots.dim() == 1 && slots.size(0) == n, "slots: contiguous int64 [n]");
  const int64_t num_slots = k_pool.size(0) * k_pool.size(1);
  const int64_t* sl = slots.data_ptr<int64_t>();
  for (int64_t t = 0; t < n; ++t)
    TORCH_CHECK(sl[t] >= 0 && sl[t] < num_slots, "slot outside the pool");
  if (k_pool.scalar_type() == at::kFloat) {
    rope_write_impl<float>(qkv.data_ptr<float>(), qkv.stride(0), cos.data_ptr<float>(),
                           sin.data_ptr<float>(), sl, k_pool.data_ptr<float>(),
                           v_pool.data_ptr<float>(), n, num_heads, Hkv, D);
  } else {
    TORCH_CHECK(k_pool.scalar_type() == at::kBFloat16, "pool dtype: float32 or bfloat16");
    rope_write_impl<c10::BFloat16>(qkv.data_ptr<float>(), qkv.stride(0), cos.data_ptr<float>(),
                                   sin.data_ptr<float>(), sl, k_pool.data_ptr<c10::BFloat16>(),
                                   v_pool.data_ptr<c10::BFloat16>(), n, num_heads, Hkv, D);
  }
}

// Lanes of the vector exp silu_mul calls (16: AVX-512, 8: AVX2, 1: scalar only).
int64_t fused_vector_width() { return kVecWidth; }

// out [n, I] = silu(gate_up[:, :I]) * gate_up[:, I:] for gate_up [n, 2 I].
void silu_mul(torch::Tensor gate_up, torch::Tensor out) {
  check_rows(gate_up, "gate_up");
  check_rows(out, "out");
  const int64_t n = gate_up.size(0), I = out.size(1);
  TORCH_CHECK(out.size(0) == n && gate_up.size(1) == 2 * I, "gate_up [n, 2 I], out [n, I]");
  const float* g = gate_up.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t gs = gate_up.stride(0), os = out.stride(0);
  at::parallel_for(0, n, std::max<int64_t>(1, 32768 / std::max<int64_t>(I, 1)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) silu_mul_row(g + t * gs, g + t * gs + I, o + t * os, I);
  });
}

// out [n, h] = (x * r) * weight for x [n, h], r [n, 1] (the rsqrt of the mean square plus
// eps), weight [h].
void rms_apply(torch::Tensor x, torch::Tensor r, torch::Tensor weight, torch::Tensor out) {
  check_rows(x, "x");
  check_rows(out, "out");
  const int64_t n = x.size(0), h = x.size(1);
  TORCH_CHECK(r.is_cpu() && r.scalar_type() == at::kFloat && r.numel() == n &&
              r.is_contiguous(), "r: float32 [n, 1]");
  TORCH_CHECK(weight.is_cpu() && weight.scalar_type() == at::kFloat &&
              weight.is_contiguous() && weight.numel() == h, "weight: float32 [h]");
  TORCH_CHECK(out.size(0) == n && out.size(1) == h, "out: x's shape");
  const float* xp = x.data_ptr<float>();
  const float* rp = r.data_ptr<float>();
  const float* w = weight.data_ptr<float>();
  float* o = out.data_ptr<float>();
  const int64_t xs = x.stride(0), os = out.stride(0);
  at::parallel_for(0, n, std::max<int64_t>(1, 32768 / std::max<int64_t>(h, 1)),
                   [&](int64_t begin, int64_t end) {
    for (int64_t t = begin; t < end; ++t) {
      const float rt = rp[t];
      const float* xr = xp + t * xs;
      float* orow = o + t * os;
      for (int64_t i = 0; i < h; ++i) {
        const float y = xr[i] * rt;
        orow[i] = y * w[i];
      }
    }
  });
}

#pragma GCC pop_options
