// Small AVX-512 helpers shared by houchu's CPU kernels: 16-lane float32 loads and stores
// of float32 / bfloat16 data, and a vectorized exp. Compiled only where the compiler
// targets AVX-512 (-march=native on such a CPU); every kernel keeps a portable path.
#pragma once

#if defined(__AVX512F__) && defined(__AVX512BW__)
#define HOUCHU_AVX512 1
#include <immintrin.h>

#include <c10/util/BFloat16.h>

namespace houchu_cpu::vec {

inline __m512 load16(const float* p) { return _mm512_loadu_ps(p); }

inline __m512 load16(const c10::BFloat16* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

inline void store16(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

// The 16 bfloat16 bit patterns of v: round to nearest even, NaN stays NaN (as
// c10::BFloat16's conversion).
inline __m256i bf16_bits16(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_srli_epi32(r, 16);
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  r = _mm512_mask_mov_epi32(r, nan, _mm512_set1_epi32(0x7FC0));
  return _mm512_cvtepi32_epi16(r);
}

inline void store16(c10::BFloat16* p, __m512 v) {
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bf16_bits16(v));
}

// Round every lane to T's precision and back to float32 (a no-op for float).
template <typename T>
inline __m512 round16(__m512 v);
template <>
inline __m512 round16<float>(__m512 v) {
  return v;
}
template <>
inline __m512 round16<c10::BFloat16>(__m512 v) {
  const __m512i u = _mm512_castps_si512(v);
  const __m512i lsb = _mm512_and_si512(_mm512_srli_epi32(u, 16), _mm512_set1_epi32(1));
  __m512i r = _mm512_add_epi32(u, _mm512_add_epi32(lsb, _mm512_set1_epi32(0x7FFF)));
  r = _mm512_and_si512(r, _mm512_set1_epi32(static_cast<int>(0xFFFF0000u)));
  const __mmask16 nan = _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
  return _mm512_mask_mov_ps(_mm512_castsi512_ps(r), nan, v);
}

// exp(x), relative error ~2e-7 on [-87, 88]: 2^n * p(r) with n = round(x / ln 2) and
// r = x - n ln 2 (Cody-Waite split), p the degree-6 Taylor polynomial of exp on
// |r| <= ln 2 / 2. Below -87.3 the result flushes toward 0; above 88.7 it is inf.
inline __m512 exp16(__m512 x) {
  x = _mm512_max_ps(x, _mm512_set1_ps(-87.3f));
  x = _mm512_min_ps(x, _mm512_set1_ps(88.7f));
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.4426950408889634f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
  __m512 p = _mm512_set1_ps(1.f / 720.f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
  return _mm512_scalef_ps(p, n);
}

}  // namespace houchu_cpu::vec
#endif

#include "simd.h"  // the AVX2 + FMA helpers, where AVX-512 is not targeted
#include "neon.h"  // the aarch64 NEON helpers
