// Paged prefill attention on the CPU: the new tokens of one sequence (a chunk at positions
// [first, first + n)) against all their keys [0, first + n), read in place from the pool's
// pages (the cached prefix and the chunk's own keys, already written), causal, no gathered
// copy and no mask tensor. Built with the other CPU kernels (build.py).
//
// Layout: a job is one KV head and a chunk of query rows (the G query heads of that KV
// head times 48 / G tokens: 48 rows, three 16-lane vectors). Rows are the vector lanes, so
// scores are held transposed, S^T [keys][rows]: a score tile is 8 keys x 48 rows, built by
// broadcasting each key's element d against the d-th row of the chunk's transposed queries
// Q^T [d][rows], and the softmax over keys is a lane-wise max / exp / sum. The output is
// kept transposed too, O^T [d][rows], and gets P V by broadcasting V[key][d] against the
// probabilities P^T[key][rows]. Keys go in blocks of 64 with an online softmax per block;
// a block is masked only where it reaches past the chunk's first position.
#include <torch/extension.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <algorithm>
#include <cstdint>
#include <vector>

#include "simd.h"

namespace {

using namespace prefixcache_simd;

constexpr int NV = 3;                  // vectors of rows per job
constexpr int64_t kLanes = 16 * NV;    // query rows per job
constexpr int64_t kBlock = 64;         // keys per online-softmax block
constexpr int64_t kTile = 8;           // keys per score tile; head dims per P V tile
constexpr int64_t kGroup = 8;          // chunks per job (they share each block of keys)

inline float to_float(float x) { return x; }
inline float to_float(c10::BFloat16 x) { return static_cast<float>(x); }

inline v16 vmax(v16 a, v16 b) { return a > b ? a : b; }

// The softmax state of one chunk of kLanes query rows (lane r: token t0 + r / G, query
// head h * G + r % G; padded lanes repeat row 0): Q^T [D][lanes] (scaled), O^T [D][lanes],
// the running max m and sum l per lane, and each lane's position.
struct Chunk {
  std::vector<v16> qt, ot;
  v16 m[NV], l[NV];
  v16i pos[NV];
  int64_t t0 = 0, rows = 0, nkeys = 0, open_until = 0;
};

// One block of kb keys (their rows kp, vp) for one chunk: the scores, the online-softmax
// update and P V. st: scratch [kBlock + kTile][NV].
template <typename T>
inline void attend_block(Chunk& ch, int64_t j0, int64_t kb, const T* const* kp,
                         const T* const* vp, v16* st, int64_t D) {
  // S^T [i][lanes] = sum_d K[i][d] * Q^T[d][lanes]; a last partial tile repeats a key
  for (int64_t i0 = 0; i0 < kb; i0 += kTile) {
    const T* kt[kTile];
    for (int64_t i = 0; i < kTile; ++i) kt[i] = kp[std::min(i0 + i, kb - 1)];
    v16 acc[kTile][NV] = {};
    for (int64_t d = 0; d < D; ++d) {
      const v16* qd = &ch.qt[d * NV];
      for (int64_t i = 0; i < kTile; ++i) {
        const v16 b = splat(to_float(kt[i][d]));
        for (int c = 0; c < NV; ++c) acc[i][c] += b * qd[c];
      }
    }
    for (int64_t i = 0; i < kTile; ++i)
      for (int c = 0; c < NV; ++c) st[(i0 + i) * NV + c] = acc[i][c];
  }
  const bool masked = j0 + kb > ch.open_until;  // some lanes do not see some keys
  if (masked) {
    for (int64_t i = 0; i < kb; ++i) {
      const v16i j = v16i{} + static_cast<int>(j0 + i);
      for (int c = 0; c < NV; ++c) st[i * NV + c] = (j <= ch.pos[c]) ? st[i * NV + c] : splat(-1e30f);
    }
  }
  v16 mb[NV], alpha[NV], sum[NV];
  for (int c = 0; c < NV; ++c) mb[c] = ch.m[c];
  for (int64_t i = 0; i < kb; ++i)
    for (int c = 0; c < NV; ++c) mb[c] = vmax(mb[c], st[i * NV + c]);
  for (int c = 0; c < NV; ++c) {
    alpha[c] = exp16(ch.m[c] - mb[c]);
    ch.m[c] = mb[c];
    sum[c] = v16{};
  }
  for (int64_t i = 0; i < kb; ++i) {
    const v16i j = v16i{} + static_cast<int>(j0 + i);
    for (int c = 0; c < NV; ++c) {
      v16 e = exp16(st[i * NV + c] - ch.m[c]);
      if (masked) e = (j <= ch.pos[c]) ? e : v16{};
      st[i * NV + c] = e;
      sum[c] += e;
    }
  }
  for (int c = 0; c < NV; ++c) ch.l[c] = ch.l[c] * alpha[c] + sum[c];
  // O^T [d][lanes] = alpha * O^T + sum_i V[i][d] * P^T[i][lanes]
  for (int64_t d0 = 0; d0 < D; d0 += kTile) {
    v16 acc[kTile][NV];
    for (int64_t e = 0; e < kTile; ++e)
      for (int c = 0; c < NV; ++c) acc[e][c] = ch.ot[(d0 + e) * NV + c] * alpha[c];
    for (int64_t i = 0; i < kb; ++i) {
      const v16* p = &st[i * NV];
      const T* vi = vp[i] + d0;
      for (int64_t e = 0; e < kTile; ++e) {
        const v16 b = splat(to_float(vi[e]));
        for (int c = 0; c < NV; ++c) acc[e][c] += b * p[c];
      }
    }
    for (int64_t e = 0; e < kTile; ++e)
      for (int c = 0; c < NV; ++c) ch.ot[(d0 + e) * NV + c] = acc[e][c];
  }
}

// q: [n, Hq, D] float32 (token stride q_stride); k, v: [P, bs, Hkv, D]; table: the
// sequence's pages; out: [n, Hq, D] (token stride out_stride). Query row t (position
// first + t) attends keys j <= first + t. A job is one KV head and up to kGroup chunks, so
// each block of keys read from memory serves all of them.
template <typename T>
void prefill(const float* q, int64_t q_stride, const T* k, const T* v, const int64_t* table,
             int64_t n, int64_t first, float* out, int64_t out_stride, int64_t Hq,
             int64_t Hkv, int64_t D, int64_t bs, float scale) {
  const int64_t G = Hq / Hkv;
  const int64_t tc = kLanes / G;  // tokens per chunk
  const int64_t chunks = (n + tc - 1) / tc;
  const int64_t groups = (chunks + kGroup - 1) / kGroup;
  const int64_t tok_stride = Hkv * D;
  std::vector<int64_t> key_off(first + n);  // element offset of key j's token in the pool
  for (int64_t j = 0; j < first + n; ++j) key_off[j] = (table[j / bs] * bs + j % bs) * tok_stride;
  at::parallel_for(0, Hkv * groups, 1, [&](int64_t begin, int64_t end) {
    std::vector<Chunk> chs(kGroup);
    for (auto& ch : chs) { ch.qt.resize(D * NV); ch.ot.resize(D * NV); }
    std::vector<v16> st((kBlock + kTile) * NV);
    std::vector<const T*> kp(kBlock), vp(kBlock);
    for (int64_t job = begin; job < end; ++job) {
      const int64_t h = job / groups, c0 = (job % groups) * kGroup;
      const int64_t nch = std::min(kGroup, chunks - c0);
      int64_t nkeys = 0;
      for (int64_t c = 0; c < nch; ++c) {
        Chunk& ch = chs[c];
        ch.t0 = (c0 + c) * tc;
        const int64_t t1 = std::min(n, ch.t0 + tc);
        ch.rows = (t1 - ch.t0) * G;
        float* qtf = reinterpret_cast<float*>(ch.qt.data());
        for (int64_t r = 0; r < kLanes; ++r) {
          const int64_t rr = r < ch.rows ? r : 0;
          const float* qr = q + (ch.t0 + rr / G) * q_stride + (h * G + rr % G) * D;
          for (int64_t d = 0; d < D; ++d) qtf[d * kLanes + r] = qr[d] * scale;
          ch.pos[r / 16][r % 16] = static_cast<int>(first + ch.t0 + rr / G);
        }
        for (auto& o : ch.ot) o = v16{};
        for (int i = 0; i < NV; ++i) { ch.m[i] = splat(-1e30f); ch.l[i] = v16{}; }
        ch.nkeys = first + t1;            // keys the chunk's last token sees
        ch.open_until = first + ch.t0 + 1;  // keys below this: seen by every lane
        nkeys = std::max(nkeys, ch.nkeys);
      }
      for (int64_t j0 = 0; j0 < nkeys; j0 += kBlock) {
        const int64_t kb_all = std::min(kBlock, nkeys - j0);
        for (int64_t i = 0; i < kb_all; ++i) {
          kp[i] = k + key_off[j0 + i] + h * D;
          vp[i] = v + key_off[j0 + i] + h * D;
        }
        for (int64_t c = 0; c < nch; ++c) {
          Chunk& ch = chs[c];
          if (ch.nkeys > j0)
            attend_block(ch, j0, std::min(kBlock, ch.nkeys - j0), kp.data(), vp.data(),
                         st.data(), D);
        }
      }
      for (int64_t c = 0; c < nch; ++c) {
        const Chunk& ch = chs[c];
        const float* otf = reinterpret_cast<const float*>(ch.ot.data());
        const float* lf = reinterpret_cast<const float*>(ch.l);
        for (int64_t r = 0; r < ch.rows; ++r) {
          float* o = out + (ch.t0 + r / G) * out_stride + (h * G + r % G) * D;
          const float inv = 1.f / lf[r];
          for (int64_t d = 0; d < D; ++d) o[d] = otf[d * kLanes + r] * inv;
        }
      }
    }
  });
}

}  // namespace

// Attention output out [n, Hq, D] (float32) of the chunk's queries q [n, Hq, D] (float32)
// at positions [first, first + n), against keys [0, first + n) in the pages of page_table.
// q and out may have any token stride (their heads and head dims contiguous).
void paged_prefill(torch::Tensor q, torch::Tensor k_pool, torch::Tensor v_pool,
                   torch::Tensor page_table, int64_t first, torch::Tensor out, double scale) {
  TORCH_CHECK(q.is_cpu() && out.is_cpu() && k_pool.is_cpu() && v_pool.is_cpu() &&
              page_table.is_cpu(), "paged_prefill: CPU tensors only");
  TORCH_CHECK(q.dim() == 3 && q.sizes() == out.sizes() && q.scalar_type() == at::kFloat &&
              out.scalar_type() == at::kFloat, "q and out: float32 [n, heads, head_dim]");
  const int64_t n = q.size(0), Hq = q.size(1), D = q.size(2);
  TORCH_CHECK(q.stride(2) == 1 && q.stride(1) == D && out.stride(2) == 1 &&
              out.stride(1) == D && q.stride(0) >= Hq * D && out.stride(0) >= Hq * D,
              "q and out: each token's heads contiguous");
  TORCH_CHECK(k_pool.is_contiguous() && v_pool.is_contiguous() && k_pool.dim() == 4 &&
              k_pool.sizes() == v_pool.sizes() &&
              k_pool.scalar_type() == v_pool.scalar_type(), "k_pool, v_pool: one shape");
  TORCH_CHECK(page_table.is_contiguous() && page_table.scalar_type() == at::kLong &&
              page_table.dim() == 1, "page_table: contiguous int64 [pages]");
  const int64_t bs = k_pool.size(1), Hkv = k_pool.size(2);
  TORCH_CHECK(Hq >= 1 && Hkv >= 1 && bs >= 1 && D >= 1 && k_pool.size(3) == D &&
              Hq % Hkv == 0 && Hq / Hkv <= kLanes && D % kTile == 0, "unsupported geometry");
  // positions are held as int32 lanes: first + n < 2^31 (and no overflow below)
  TORCH_CHECK(n >= 1 && first >= 0 && first <= INT32_MAX - n &&
              first + n <= page_table.size(0) * bs,
              "the chunk's keys reach beyond its page table");
  const int64_t* table = page_table.data_ptr<int64_t>();
  const int64_t num_pages = k_pool.size(0);
  for (int64_t i = 0; i < (first + n + bs - 1) / bs; ++i) {
    TORCH_CHECK(table[i] >= 0 && table[i] < num_pages, "page id outside the pool");
  }
  const float s = static_cast<float>(scale);
  if (k_pool.scalar_type() == at::kFloat) {
    prefill<float>(q.data_ptr<float>(), q.stride(0), k_pool.data_ptr<float>(),
                   v_pool.data_ptr<float>(), table, n, first, out.data_ptr<float>(),
                   out.stride(0), Hq, Hkv, D, bs, s);
  } else {
    TORCH_CHECK(k_pool.scalar_type() == at::kBFloat16, "pool dtype: float32 or bfloat16");
    prefill<c10::BFloat16>(q.data_ptr<float>(), q.stride(0), k_pool.data_ptr<c10::BFloat16>(),
                           v_pool.data_ptr<c10::BFloat16>(), table, n, first,
                           out.data_ptr<float>(), out.stride(0), Hq, Hkv, D, bs, s);
  }
}
