// Greedy sampling's argmax over float32 logits rows, with torch.argmax's semantics: the
// first index of the maximum, and a NaN counts as the maximum (the first NaN's index).
//
// torch's CPU argmax over one 49,152-wide row takes ~45 us (a scalar compare loop); two
// AVX-512 (AVX2, NEON) passes over the row (the maximum, then its first index) take a
// few us. This is the row kernel; argmax.cpp has the operator.
#pragma once
#include <cmath>
#include <cstdint>

#include "vec.h"

namespace houchu_cpu {

// argmax of row x[0, n), n >= 1.
inline int64_t argmax_row(const float* x, int64_t n) {
#ifdef HOUCHU_AVX512
  const int64_t n16 = n / 16 * 16;
  __m512 mx = _mm512_set1_ps(-INFINITY);
  __mmask16 nan = 0;
  for (int64_t i = 0; i < n16; i += 16) {
    const __m512 v = _mm512_loadu_ps(x + i);
    nan |= _mm512_cmp_ps_mask(v, v, _CMP_UNORD_Q);
    mx = _mm512_max_ps(mx, v);
  }
  float best = _mm512_reduce_max_ps(mx);
  for (int64_t i = n16; i < n; ++i) {
    if (std::isnan(x[i])) nan = 1;
    best = x[i] > best ? x[i] : best;
  }
  if (nan == 0) {
    const __m512 b = _mm512_set1_ps(best);
    for (int64_t i = 0; i < n16; i += 16) {
      const __mmask16 eq = _mm512_cmp_ps_mask(_mm512_loadu_ps(x + i), b, _CMP_EQ_OQ);
      if (eq) return i + __builtin_ctz(eq);
    }
    for (int64_t i = n16; i < n; ++i)
      if (x[i] == best) return i;
  }
#elif defined(HOUCHU_AVX2)
  // the same two passes, 8 lanes at a time
  const int64_t n8 = n / 8 * 8;
  __m256 mx = _mm256_set1_ps(-INFINITY);
  __m256 nan = _mm256_setzero_ps();  // lanes that saw a NaN: all ones
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256 v = _mm256_loadu_ps(x + i);
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(v, v, _CMP_UNORD_Q));
    mx = _mm256_max_ps(mx, v);
  }
  bool any_nan = _mm256_movemask_ps(nan) != 0;
  float best = simd::hmax8(mx);
  for (int64_t i = n8; i < n; ++i) {
    if (std::isnan(x[i])) any_nan = true;
    best = x[i] > best ? x[i] : best;
  }
  if (!any_nan) {
    const __m256 b = _mm256_set1_ps(best);
    for (int64_t i = 0; i < n8; i += 8) {
      const int eq = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_loadu_ps(x + i), b, _CMP_EQ_OQ));
      if (eq) return i + __builtin_ctz(eq);
    }
    for (int64_t i = n8; i < n; ++i)
      if (x[i] == best) return i;
  }
#elif defined(HOUCHU_NEON)
  // the same two passes, 4 lanes at a time
  const int64_t n4 = n / 4 * 4;
  float32x4_t mx = vdupq_n_f32(-INFINITY);
  uint32x4_t ordered = vdupq_n_u32(0xFFFFFFFFu);  // lanes that saw no NaN: all ones
  for (int64_t i = 0; i < n4; i += 4) {
    const float32x4_t v = vld1q_f32(x + i);
    ordered = vandq_u32(ordered, vceqq_f32(v, v));
    mx = vmaxq_f32(mx, v);
  }
  bool any_nan = vminvq_u32(ordered) == 0;
  float best = vmaxvq_f32(mx);
  for (int64_t i = n4; i < n; ++i) {
    if (std::isnan(x[i])) any_nan = true;
    best = x[i] > best ? x[i] : best;
  }
  if (!any_nan) {
    const float32x4_t b = vdupq_n_f32(best);
    for (int64_t i = 0; i < n4; i += 4)
      if (vmaxvq_u32(vceqq_f32(vld1q_f32(x + i), b)) != 0)
        for (int64_t j = i;; ++j)
          if (x[j] == best) return j;
    for (int64_t i = n4; i < n; ++i)
      if (x[i] == best) return i;
  }
#endif
  int64_t arg = 0;  // portable path, and the first NaN
  for (int64_t i = 0; i < n; ++i) {
    if (std::isnan(x[i])) return i;
    if (x[i] > x[arg]) arg = i;
  }
  return arg;
}

}  // namespace houchu_cpu
