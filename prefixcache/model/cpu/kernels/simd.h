// 16-lane float vectors (GCC vector extensions) shared by the CPU kernels: loads from
// float32 or bfloat16, splat, and a vector exp (AVX-512 where built with it).
#pragma once
#include <c10/util/BFloat16.h>
#include <cmath>
#include <cstdint>
#ifdef __AVX512F__
#include <immintrin.h>
#endif

namespace prefixcache_simd {

typedef float v16 __attribute__((vector_size(64)));
typedef int v16i __attribute__((vector_size(64)));

inline v16 load16(const float* p) {
  v16 v;
  __builtin_memcpy(&v, p, sizeof(v));
  return v;
}

inline v16 load16(const c10::BFloat16* p) {
  v16 v;
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(p[i]);
  return v;
}

inline v16 splat(float x) { return v16{} + x; }

// exp of 16 lanes; AVX-512: 2^n * p(r), n = round(x log2 e), r = x - n ln 2 (two-part),
// p a degree-6 Taylor polynomial (relative error below 2e-7 on |r| <= ln2 / 2). Inputs
// are clamped at kExpFloor = -86 (exp: about 4.5e-38, above the smallest normal float,
// 1.18e-38), so no lane ever yields a denormal: x86 handles one with a microcode assist,
// which made the prefill kernel 4-6% slower on its masked lanes (block diagonals) at 1-2
// query heads per KV head (scripts/prefill_kernel_ab.py). A true exp below e^-86 comes out as 4.5e-38: next to the
// softmax sum (at least 1) that is below float32's resolution. Callers zero masked lanes
// themselves. Elsewhere: std::exp per lane.
constexpr float kExpFloor = -86.f;

inline v16 exp16(v16 x) {
#ifdef __AVX512F__
  const __m512 xv = _mm512_max_ps(reinterpret_cast<__m512>(x), _mm512_set1_ps(kExpFloor));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(xv, _mm512_set1_ps(1.44269504f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145752f), xv);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.42860677e-6f), r);
  __m512 p = _mm512_set1_ps(1.f / 720);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return reinterpret_cast<v16>(_mm512_scalef_ps(p, n));
#else
  v16 y;
  for (int i = 0; i < 16; ++i) y[i] = std::exp(x[i]);
  return y;
#endif
}

// Horizontal max and sum of 16 lanes.
inline float hmax16(v16 x) {
#ifdef __AVX512F__
  return _mm512_reduce_max_ps(reinterpret_cast<__m512>(x));
#else
  float m = x[0];
  for (int i = 1; i < 16; ++i) m = m > x[i] ? m : x[i];
  return m;
#endif
}

inline float hsum16(v16 x) {
#ifdef __AVX512F__
  return _mm512_reduce_add_ps(reinterpret_cast<__m512>(x));
#else
  float s = 0.f;
  for (int i = 0; i < 16; ++i) s += x[i];
  return s;
#endif
}

}  // namespace prefixcache_simd
