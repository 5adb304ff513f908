// Paged decode attention on the CPU: one query token per sequence against its KV pages,
// read in place from the pool (no gathered copy), with an online softmax per page.
// Built once per machine by prefixcache/model/kernels/paged_decode.py (torch cpp_extension).
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cmath>
#include <limits>
#include <type_traits>
#include <vector>

#include "simd.h"

namespace {


template <typename T>
inline float dot(const float* q, const T* k, int64_t d) {
  float s = 0.f;
#pragma omp simd reduction(+ : s)
  for (int64_t i = 0; i < d; ++i) s += q[i] * static_cast<float>(k[i]);
  return s;
}

template <typename T>
inline void axpy(float a, const T* v, float* acc, int64_t d) {
#pragma omp simd
  for (int64_t i = 0; i < d; ++i) acc[i] += a * static_cast<float>(v[i]);
}

// Softmax state of one query head over the pages read so far.
struct Row {
  float m, l;  // running max of the scores, sum of exp(score - m)
};

// One job of the decode kernels: row b, KV heads [h0, h1), keys [start, n) of its context.
// Heads are split across jobs too when there are fewer rows than threads.
struct Job {
  int64_t b, h0, h1, n, start;
};

inline int64_t job_splits(int64_t B, int64_t Hkv) {
  return B >= at::get_num_threads() ? 1 : Hkv;
}

inline Job job_of(int64_t job, int64_t splits, int64_t Hkv, const int64_t* ctx,
                  int64_t window) {
  const int64_t b = job / splits;
  const int64_t h0 = splits == 1 ? 0 : job % splits;
  const int64_t n = ctx[b];
  return {b, h0, splits == 1 ? Hkv : h0 + 1, n,
          window > 0 ? std::max<int64_t>(0, n - window) : 0};
}

// q: [B, Hq, D] float32; k, v: [P, bs, Hkv, D]; table: [B, maxP] int64; ctx: [B] int64.
// out: [B, Hq, D] float32. Keys [max(0, ctx - window), ctx) are read (window <= 0: all).
// A job is one row and a range of KV heads [h0, h1); per page, the scores of all its
// tokens for those heads' queries come first (K read in order), then one exp per score
// and the weighted sum of V (V read in order).
// DC > 0: head_dim known at compile time (the inner loops unroll); 0: D at run time.
template <typename T, int64_t DC>
void decode(const float* q, const T* k, const T* v, const int64_t* table,
            const int64_t* ctx, float* out, int64_t B, int64_t Hq, int64_t Hkv,
            int64_t D_run, int64_t bs, int64_t max_pages, int64_t window, float scale) {
  const int64_t D = DC > 0 ? DC : D_run;
  const int64_t G = Hq / Hkv;
  const int64_t tok_stride = Hkv * D;
  const int64_t splits = job_splits(B, Hkv);
  at::parallel_for(0, B * splits, 1, [&](int64_t begin, int64_t end) {
    std::vector<float> qs(Hq * D), acc(Hq * D), s(Hq * bs);
    std::vector<Row> row(Hq);
    for (int64_t job = begin; job < end; ++job) {
      const auto [b, h0, h1, n, start] = job_of(job, splits, Hkv, ctx, window);
      const int64_t r0 = h0 * G, r1 = h1 * G;  // query heads of the job
      for (int64_t r = r0; r < r1; ++r) {
        const float* qr = q + (b * Hq + r) * D;
        for (int64_t i = 0; i < D; ++i) { qs[r * D + i] = qr[i] * scale; acc[r * D + i] = 0.f; }
        row[r] = {-1e30f, 0.f};
      }
      const int64_t* pages = table + b * max_pages;
      for (int64_t p = start / bs; p * bs < n; ++p) {
        const int64_t t0 = std::max<int64_t>(start - p * bs, 0);
        const int64_t t1 = std::min<int64_t>(n - p * bs, bs);
        const T* kp = k + (pages[p] * bs) * tok_stride;
        const T* vp = v + (pages[p] * bs) * tok_stride;
        if ((p + 1) * bs < n) {  // pages are scattered: fetch the next one ahead
          const char* kn = reinterpret_cast<const char*>(k + (pages[p + 1] * bs) * tok_stride);
          const char* vn = reinterpret_cast<const char*>(v + (pages[p + 1] * bs) * tok_stride);
          const int64_t bytes = bs * tok_stride * static_cast<int64_t>(sizeof(T));
          for (int64_t off = 0; off < bytes; off += 64) {
            __builtin_prefetch(kn + off);
            __builtin_prefetch(vn + off);
          }
        }
        for (int64_t t = t0; t < t1; ++t) {
          for (int64_t h = h0; h < h1; ++h) {
            const T* kt = kp + t * tok_stride + h * D;
            for (int64_t g = 0; g < G; ++g) {
              const int64_t r = h * G + g;
              s[r * bs + t] = dot(&qs[r * D], kt, D);
            }
          }
        }
        for (int64_t r = r0; r < r1; ++r) {
          float* sr = &s[r * bs];
          float mx = row[r].m;
          for (int64_t t = t0; t < t1; ++t) mx = std::max(mx, sr[t]);
          float sum = 0.f;
#pragma omp simd reduction(+ : sum)
          for (int64_t t = t0; t < t1; ++t) {
            sr[t] = std::exp(sr[t] - mx);
            sum += sr[t];
          }
          const float corr = std::exp(row[r].m - mx);
          row[r] = {mx, row[r].l * corr + sum};
          if (corr != 1.f) {
            float* ar = &acc[r * D];
#pragma omp simd
            for (int64_t i = 0; i < D; ++i) ar[i] *= corr;
          }
        }
        for (int64_t t = t0; t < t1; ++t) {
          for (int64_t h = h0; h < h1; ++h) {
            const T* vt = vp + t * tok_stride + h * D;
            for (int64_t g = 0; g < G; ++g) {
              const int64_t r = h * G + g;
              axpy(s[r * bs + t], vt, &acc[r * D], D);
            }
          }
        }
      }
      for (int64_t r = r0; r < r1; ++r) {
        float* o = out + (b * Hq + r) * D;
        const float inv = row[r].l > 0.f ? 1.f / row[r].l : 0.f;
        for (int64_t i = 0; i < D; ++i) o[i] = acc[r * D + i] * inv;
      }
    }
  });
}


// ---- fast path: 16-token pages, head_dim a multiple of 16 (GCC vector extensions) ----
using namespace prefixcache_simd;

constexpr int64_t kAhead = 2;  // software prefetch distance, in pages

// lane j of dots16's result holds token kBitrev[j] (the reduction tree's order)
constexpr int kBitrev[16] = {0, 8, 4, 12, 2, 10, 6, 14, 1, 9, 5, 13, 3, 11, 7, 15};

// q (NC vectors) . k_t for the 16 tokens t of a page (k_t = k0 + t * stride): lanes in
// kBitrev order. Partial vectors per token, then one transpose-and-add tree (4 levels)
// instead of 16 separate horizontal sums.
template <typename T, int NC>
inline v16 dots16(const v16* q, const T* k0, int64_t stride) {
  v16 x[16];
  for (int t = 0; t < 16; ++t) {
    const T* kt = k0 + t * stride;
    v16 a = q[0] * load16(kt);
    for (int c = 1; c < NC; ++c) a += q[c] * load16(kt + 16 * c);
    x[t] = a;
  }
  const v16i l1a = {0, 1, 2, 3, 4, 5, 6, 7, 16, 17, 18, 19, 20, 21, 22, 23};
  const v16i l1b = {8, 9, 10, 11, 12, 13, 14, 15, 24, 25, 26, 27, 28, 29, 30, 31};
  const v16i l2a = {0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27};
  const v16i l2b = {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31};
  const v16i l3a = {0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29};
  const v16i l3b = {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31};
  const v16i l4a = {0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30};
  const v16i l4b = {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31};
  v16 z[8], w[4], u[2];
  for (int i = 0; i < 8; ++i)
    z[i] = __builtin_shuffle(x[2 * i], x[2 * i + 1], l1a) +
           __builtin_shuffle(x[2 * i], x[2 * i + 1], l1b);
  for (int i = 0; i < 4; ++i)
    w[i] = __builtin_shuffle(z[2 * i], z[2 * i + 1], l2a) +
           __builtin_shuffle(z[2 * i], z[2 * i + 1], l2b);
  for (int i = 0; i < 2; ++i)
    u[i] = __builtin_shuffle(w[2 * i], w[2 * i + 1], l3a) +
           __builtin_shuffle(w[2 * i], w[2 * i + 1], l3b);
  return __builtin_shuffle(u[0], u[1], l4a) + __builtin_shuffle(u[0], u[1], l4b);
}

// Lane masks of a page's tokens [t0, t1) in kBitrev order: 0 / -1e30 to add to the scores
// and 1 / 0 to multiply their exps by (exp16 clamps at kExpFloor, so masked lanes are zeroed).
struct PageMask {
  v16 add, keep;
  void set(int64_t t0, int64_t t1) {
    for (int j = 0; j < 16; ++j) {
      const bool in = kBitrev[j] >= t0 && kBitrev[j] < t1;
      add[j] = in ? 0.f : -1e30f;  // finite: built with -ffast-math
      keep[j] = in ? 1.f : 0.f;
    }
  }
};

// GB query heads of one KV head over one 16-token page: scores (one transpose-and-add
// tree each), the online softmax on whole vectors, then P V with GB * NC independent
// accumulators, each V vector loaded once for all GB heads.
template <typename T, int NC, int GB>
inline void page_heads(const v16* qv, v16* acc, Row* row, const T* kp, const T* vp,
                       int64_t stride, int64_t t0, int64_t t1, const PageMask* mask) {
  alignas(64) float e[GB][16];
  v16 a[GB][NC];
  for (int g = 0; g < GB; ++g) {
    v16 sv = dots16<T, NC>(qv + g * NC, kp, stride);
    if (mask != nullptr) sv += mask->add;
    const float mx = std::max(row[g].m, hmax16(sv));
    v16 ev = exp16(sv - splat(mx));
    if (mask != nullptr) ev *= mask->keep;
    const float corr = std::exp(row[g].m - mx);
    row[g] = {mx, row[g].l * corr + hsum16(ev)};
    __builtin_memcpy(e[g], &ev, sizeof(ev));
    for (int c = 0; c < NC; ++c) a[g][c] = acc[g * NC + c] * splat(corr);
  }
  for (int64_t t = t0; t < t1; ++t) {
    const T* vt = vp + t * stride;
    v16 vc[NC];
    for (int c = 0; c < NC; ++c) vc[c] = load16(vt + 16 * c);
    for (int g = 0; g < GB; ++g) {
      const v16 et = splat(e[g][kBitrev[t]]);
      for (int c = 0; c < NC; ++c) a[g][c] += et * vc[c];
    }
  }
  for (int g = 0; g < GB; ++g)
    for (int c = 0; c < NC; ++c) acc[g * NC + c] = a[g][c];
}

template <typename T, int64_t D>
void decode16(const float* q, const T* k, const T* v, const int64_t* table,
              const int64_t* ctx, float* out, int64_t B, int64_t Hq, int64_t Hkv,
              int64_t max_pages, int64_t window, float scale) {
  constexpr int NC = static_cast<int>(D / 16);
  constexpr int GB = NC <= 4 ? 4 : 2;  // query heads per P V block (GB * NC accumulators)
  constexpr int64_t bs = 16;
  const int64_t G = Hq / Hkv;
  const int64_t tok_stride = Hkv * D;
  const int64_t splits = job_splits(B, Hkv);
  at::parallel_for(0, B * splits, 1, [&](int64_t begin, int64_t end) {
    std::vector<v16> qv(Hq * NC), acc(Hq * NC);
    std::vector<Row> row(Hq);
    for (int64_t job = begin; job < end; ++job) {
      const auto [b, h0, h1, n, start] = job_of(job, splits, Hkv, ctx, window);
      for (int64_t r = h0 * G; r < h1 * G; ++r) {
        const float* qr = q + (b * Hq + r) * D;
        for (int c = 0; c < NC; ++c) {
          qv[r * NC + c] = load16(qr + 16 * c) * splat(scale);
          acc[r * NC + c] = v16{};
        }
        row[r] = {-1e30f, 0.f};
      }
      const int64_t* pages = table + b * max_pages;
      for (int64_t p = start / bs; p * bs < n; ++p) {
        const int64_t t0 = std::max<int64_t>(start - p * bs, 0);
        const int64_t t1 = std::min<int64_t>(n - p * bs, bs);
        const T* kp = k + (pages[p] * bs) * tok_stride;
        const T* vp = v + (pages[p] * bs) * tok_stride;
        if ((p + kAhead) * bs < n) {  // pages are scattered: fetch one kAhead pages on
          const int64_t next = pages[p + kAhead] * bs * tok_stride + h0 * D;
          const char* kn = reinterpret_cast<const char*>(k + next);
          const char* vn = reinterpret_cast<const char*>(v + next);
          const int64_t span = (h1 - h0) * D * int64_t(sizeof(T));
          const int64_t tb = tok_stride * int64_t(sizeof(T));
          for (int64_t t = 0; t < bs; ++t) {
            for (int64_t off = 0; off < span; off += 64) {
              __builtin_prefetch(kn + t * tb + off);
              __builtin_prefetch(vn + t * tb + off);
            }
          }
        }
        PageMask pm;  // built only for a partial page (the first of a window, the last)
        const PageMask* mask = nullptr;
        if (t0 != 0 || t1 != bs) {
          pm.set(t0, t1);
          mask = &pm;
        }
        for (int64_t h = h0; h < h1; ++h) {
          for (int64_t g = 0; g < G; g += GB) {
            const int64_t r = h * G + g;
            const v16* qr = &qv[r * NC];
            v16* ar = &acc[r * NC];
            const T* kh = kp + h * D;
            const T* vh = vp + h * D;
            switch (std::min<int64_t>(GB, G - g)) {
              case 1: page_heads<T, NC, 1>(qr, ar, &row[r], kh, vh, tok_stride, t0, t1, mask); break;
              case 2: page_heads<T, NC, 2>(qr, ar, &row[r], kh, vh, tok_stride, t0, t1, mask); break;
              case 3: page_heads<T, NC, 3>(qr, ar, &row[r], kh, vh, tok_stride, t0, t1, mask); break;
              default: page_heads<T, NC, GB>(qr, ar, &row[r], kh, vh, tok_stride, t0, t1, mask);
            }
          }
        }
      }
      for (int64_t r = h0 * G; r < h1 * G; ++r) {
        float* o = out + (b * Hq + r) * D;
        const float inv = row[r].l > 0.f ? 1.f / row[r].l : 0.f;
        for (int c = 0; c < NC; ++c) {
          const v16 y = acc[r * NC + c] * splat(inv);
          __builtin_memcpy(o + 16 * c, &y, sizeof(y));
        }
      }
    }
  });
}

template <typename T>
void dispatch(torch::Tensor& q, torch::Tensor& k, torch::Tensor& v, const int64_t* table,
              const int64_t* ctx, torch::Tensor& out, int64_t B, int64_t Hq, int64_t Hkv,
              int64_t D, int64_t bs, int64_t max_pages, int64_t window, float scale) {
  auto run = [&](auto dc) {
    decode<T, decltype(dc)::value>(q.data_ptr<float>(), k.data_ptr<T>(), v.data_ptr<T>(),
                                   table, ctx, out.data_ptr<float>(), B, Hq, Hkv, D, bs,
                                   max_pages, window, scale);
  };
  auto run16 = [&](auto dc) {
    decode16<T, decltype(dc)::value>(q.data_ptr<float>(), k.data_ptr<T>(), v.data_ptr<T>(),
                                     table, ctx, out.data_ptr<float>(), B, Hq, Hkv, max_pages,
                                     window, scale);
  };
  if (bs == 16 && D == 64) run16(std::integral_constant<int64_t, 64>{});
  else if (bs == 16 && D == 128) run16(std::integral_constant<int64_t, 128>{});
  else if (D == 64) run(std::integral_constant<int64_t, 64>{});
  else if (D == 128) run(std::integral_constant<int64_t, 128>{});
  else run(std::integral_constant<int64_t, 0>{});
}

}  // namespace

// Attention output [B, Hq, D] (float32) of decode queries q [B, Hq, D] (float32).
void paged_decode(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                  torch::Tensor page_table, torch::Tensor ctx_lens, torch::Tensor out,
                  int64_t window, double scale) {
  TORCH_CHECK(q.is_contiguous() && out.is_contiguous() && q.scalar_type() == at::kFloat &&
              out.scalar_type() == at::kFloat, "q and out: contiguous float32");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dim() == 4 &&
              k_pool.sizes() == v_pool.sizes() &&
              k_pool.scalar_type() == v_pool.scalar_type(), "k_pool, v_pool: one shape");
  TORCH_CHECK(page_table.is_contiguous() && page_table.scalar_type() == at::kLong &&
              ctx_lens.is_contiguous() && ctx_lens.scalar_type() == at::kLong,
              "page_table, ctx_lens: contiguous int64");
  const int64_t B = q.size(0), Hq = q.size(1), D = q.size(2);
  const int64_t bs = k_pool.size(1), Hkv = k_pool.size(2);
  TORCH_CHECK(k_pool.size(3) == D && Hq % Hkv == 0, "unsupported geometry");
  TORCH_CHECK(page_table.size(0) == B && ctx_lens.size(0) == B, "one row per query");
  const int64_t max_pages = page_table.size(1);
  const int64_t* ctx = ctx_lens.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b) {
    TORCH_CHECK(ctx[b] >= 1 && ctx[b] <= max_pages * bs, "ctx_lens beyond the page table");
  }
  const int64_t* table = page_table.data_ptr<int64_t>();
  const int64_t num_pages = k_pool.size(0);
  for (int64_t i = 0; i < page_table.numel(); ++i) {
    TORCH_CHECK(table[i] >= 0 && table[i] < num_pages, "page id outside the pool");
  }
  if (k_pool.scalar_type() == at::kFloat) {
    dispatch<float>(q, k_pool, v_pool, table, ctx, out, B, Hq, Hkv, D, bs, max_pages, window,
                    static_cast<float>(scale));
  } else {
    TORCH_CHECK(k_pool.scalar_type() == at::kBFloat16, "pool dtype: float32 or bfloat16");
    dispatch<c10::BFloat16>(q, k_pool, v_pool, table, ctx, out, B, Hq, Hkv, D, bs, max_pages,
                            window, static_cast<float>(scale));
  }
}
