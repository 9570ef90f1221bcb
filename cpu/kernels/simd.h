// Small AVX2 + FMA helpers shared by houchu's CPU kernels on CPUs without AVX-512 (the
// avx2 level's build, -march=x86-64-v3): 8-lane float32 loads and stores of float32 /
// bfloat16 data, bfloat16 rounding and a vectorized exp, the same arithmetic as vec.h's
// 16-lane AVX-512 versions so both levels round alike. Compiled only where the compiler
// targets AVX2 and FMA but not AVX-512 (vec.h takes that case).
#pragma once

#if defined(__AVX2__) && defined(__FMA__) && !(defined(__AVX512F__) && defined(__AVX512BW__))
#define HOUCHU_AVX2 1
#include <immintrin.h>

#include <c10/util/BFloat16.h>

namespace houchu_cpu::simd {

inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }

inline __m256 load8(const c10::BFloat16* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

inline void store8(float* p, __m256 v) { _mm256_storeu_ps(p, v); }

// The 8 bfloat16 bit patterns of v (in 32-bit lanes, high halves zero): round to nearest
// even, NaN stays NaN (as c10::BFloat16's conversion).
inline __m256i bf16_bits8(__m256 v) {
  const __m256i u = _mm256_castps_si256(v);
  const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
  __m256i r = _mm256_add_epi32(u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF)));
  r = _mm256_srli_epi32(r, 16);
  const __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(v, v, _CMP_UNORD_Q));
  return _mm256_blendv_epi8(r, _mm256_set1_epi32(0x7FC0), nan);
}

// The 8 bfloat16 of v packed into 128 bits (lane order kept).
inline __m128i bf16_pack8(__m256 v) {
  const __m256i b = bf16_bits8(v);
  return _mm_packus_epi32(_mm256_castsi256_si128(b), _mm256_extracti128_si256(b, 1));
}

inline void store8(c10::BFloat16* p, __m256 v) {
  _mm_storeu_si128(reinterpret_cast<__m128i*>(p), bf16_pack8(v));
}

// Round every lane to T's precision and back to float32 (a no-op for float).
template <typename T>
inline __m256 round8(__m256 v);
template <>
inline __m256 round8<float>(__m256 v) {
  return v;
}
template <>
inline __m256 round8<c10::BFloat16>(__m256 v) {
  return _mm256_castsi256_ps(_mm256_slli_epi32(bf16_bits8(v), 16));
}

// Sum and maximum of the 8 lanes.
inline float hsum8(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

inline float hmax8(__m256 v) {
  __m128 s = _mm_max_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_max_ps(s, _mm_movehl_ps(s, s));
  s = _mm_max_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Lanes [0, n) set (n <= 8), as a maskload / maskstore mask.
inline __m256i lanes8(int64_t n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(static_cast<int>(n)),
                            _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

// exp(x), as vec.h's exp16 (relative error ~2e-7 on [-87, 88]): 2^n * p(r) with
// n = round(x / ln 2), r = x - n ln 2 (Cody-Waite split), p the degree-6 Taylor
// polynomial; below -87.3 the result flushes toward 0, above 88.7 it is inf.
inline __m256 exp8(__m256 x) {
  x = _mm256_max_ps(x, _mm256_set1_ps(-87.3f));
  x = _mm256_min_ps(x, _mm256_set1_ps(88.7f));
  const __m256 n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.4426950408889634f)),
                                   _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m256 r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693145751953125f), x);
  r = _mm256_fnmadd_ps(n, _mm256_set1_ps(1.428606765330187e-06f), r);
  __m256 p = _mm256_set1_ps(1.f / 720.f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 120.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 24.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f / 6.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(0.5f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.f));
  // 2^n as (n + 127) << 23, in two steps so n = 128 (x near 88.7) still gives inf * p
  const __m256i ni = _mm256_cvtps_epi32(n);
  const __m256i h = _mm256_srai_epi32(ni, 1);
  const __m256 a = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_add_epi32(h, _mm256_set1_epi32(127)), 23));
  const __m256 b = _mm256_castsi256_ps(
      _mm256_slli_epi32(_mm256_add_epi32(_mm256_sub_epi32(ni, h), _mm256_set1_epi32(127)), 23));
  return _mm256_mul_ps(_mm256_mul_ps(p, a), b);
}

}  // namespace houchu_cpu::simd
#endif
