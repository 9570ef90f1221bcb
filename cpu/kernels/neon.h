// Small NEON helpers shared by houchu's CPU kernels on aarch64 (the neon and neon_dotprod
// levels' builds): an 8-lane float32 vector as two 128-bit NEON registers (f32x8), so the
// kernels follow the AVX2 ones (simd.h) step for step and round alike: the same lane
// layout, the same FMAs (vfmaq_f32 is fused as vfmadd231ps), the same reduction trees
// (hsum8, hmax8), bfloat16 rounding in integer shifts (the optional aarch64 BF16
// instructions are not used) and the same exp polynomial. Compiled only where the
// compiler targets aarch64 NEON.
#pragma once

#if defined(__ARM_NEON) && defined(__aarch64__)
#define HOUCHU_NEON 1
#include <arm_neon.h>

#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>

namespace houchu_cpu::neon {

// Lanes 0..3 in lo, 4..7 in hi (as an AVX2 __m256's lanes).
struct f32x8 {
  float32x4_t lo, hi;
};

inline f32x8 set8(float v) { return {vdupq_n_f32(v), vdupq_n_f32(v)}; }
inline f32x8 zero8() { return set8(0.f); }
inline f32x8 add8(f32x8 a, f32x8 b) { return {vaddq_f32(a.lo, b.lo), vaddq_f32(a.hi, b.hi)}; }
inline f32x8 sub8(f32x8 a, f32x8 b) { return {vsubq_f32(a.lo, b.lo), vsubq_f32(a.hi, b.hi)}; }
inline f32x8 mul8(f32x8 a, f32x8 b) { return {vmulq_f32(a.lo, b.lo), vmulq_f32(a.hi, b.hi)}; }
inline f32x8 div8(f32x8 a, f32x8 b) { return {vdivq_f32(a.lo, b.lo), vdivq_f32(a.hi, b.hi)}; }
inline f32x8 max8(f32x8 a, f32x8 b) { return {vmaxq_f32(a.lo, b.lo), vmaxq_f32(a.hi, b.hi)}; }
// a * b + c, fused (as _mm256_fmadd_ps)
inline f32x8 fma8(f32x8 a, f32x8 b, f32x8 c) {
  return {vfmaq_f32(c.lo, a.lo, b.lo), vfmaq_f32(c.hi, a.hi, b.hi)};
}

inline f32x8 load8(const float* p) { return {vld1q_f32(p), vld1q_f32(p + 4)}; }

inline f32x8 load8(const c10::BFloat16* p) {
  const uint16x8_t h = vld1q_u16(reinterpret_cast<const uint16_t*>(p));
  return {vreinterpretq_f32_u32(vshll_n_u16(vget_low_u16(h), 16)),
          vreinterpretq_f32_u32(vshll_n_u16(vget_high_u16(h), 16))};
}

inline void store8(float* p, f32x8 v) {
  vst1q_f32(p, v.lo);
  vst1q_f32(p + 4, v.hi);
}

// The bfloat16 bit patterns of 4 lanes (in 32-bit lanes, high halves zero): round to
// nearest even, NaN stays NaN (as c10::BFloat16's conversion and simd.h's bf16_bits8).
inline uint32x4_t bf16_bits4(float32x4_t v) {
  const uint32x4_t u = vreinterpretq_u32_f32(v);
  const uint32x4_t lsb = vandq_u32(vshrq_n_u32(u, 16), vdupq_n_u32(1));
  const uint32x4_t r = vshrq_n_u32(vaddq_u32(u, vaddq_u32(lsb, vdupq_n_u32(0x7FFF))), 16);
  const uint32x4_t ordered = vceqq_f32(v, v);  // all ones where v is not NaN
  return vbslq_u32(ordered, r, vdupq_n_u32(0x7FC0));
}

// The 8 bfloat16 of v packed into 128 bits (lane order kept).
inline uint16x8_t bf16_pack8(f32x8 v) {
  return vcombine_u16(vmovn_u32(bf16_bits4(v.lo)), vmovn_u32(bf16_bits4(v.hi)));
}

inline void store8(c10::BFloat16* p, f32x8 v) {
  vst1q_u16(reinterpret_cast<uint16_t*>(p), bf16_pack8(v));
}

// Round every lane to T's precision and back to float32 (a no-op for float).
template <typename T>
inline f32x8 round8(f32x8 v);
template <>
inline f32x8 round8<float>(f32x8 v) {
  return v;
}
template <>
inline f32x8 round8<c10::BFloat16>(f32x8 v) {
  return {vreinterpretq_f32_u32(vshlq_n_u32(bf16_bits4(v.lo), 16)),
          vreinterpretq_f32_u32(vshlq_n_u32(bf16_bits4(v.hi), 16))};
}

// Sum and maximum of the 8 lanes, in simd.h's order: (lane i + lane i + 4), then
// (0 + 2, 1 + 3), then the two.
inline float hsum8(f32x8 v) {
  const float32x4_t s = vaddq_f32(v.lo, v.hi);
  const float32x2_t t = vadd_f32(vget_low_f32(s), vget_high_f32(s));
  return vget_lane_f32(t, 0) + vget_lane_f32(t, 1);
}

inline float hmax8(f32x8 v) {
  const float32x4_t s = vmaxq_f32(v.lo, v.hi);
  const float32x2_t t = vmax_f32(vget_low_f32(s), vget_high_f32(s));
  return std::max(vget_lane_f32(t, 0), vget_lane_f32(t, 1));
}

// Lanes [0, n) of v kept, the others set to `fill`.
inline f32x8 keep8(f32x8 v, int64_t n, float fill) {
  alignas(16) static constexpr int32_t idx[8] = {0, 1, 2, 3, 4, 5, 6, 7};
  const int32x4_t nn = vdupq_n_s32(static_cast<int32_t>(n));
  const uint32x4_t mlo = vcltq_s32(vld1q_s32(idx), nn), mhi = vcltq_s32(vld1q_s32(idx + 4), nn);
  const float32x4_t f = vdupq_n_f32(fill);
  return {vbslq_f32(mlo, v.lo, f), vbslq_f32(mhi, v.hi, f)};
}

// The first n (< 8) floats at p, the others 0; and v's first n lanes stored at p.
inline f32x8 load_part8(const float* p, int64_t n) {
  alignas(16) float t[8] = {};
  for (int64_t i = 0; i < n; ++i) t[i] = p[i];
  return load8(t);
}
inline void store_part8(float* p, f32x8 v, int64_t n) {
  alignas(16) float t[8];
  store8(t, v);
  for (int64_t i = 0; i < n; ++i) p[i] = t[i];
}

// exp(x) of 4 lanes, as simd.h's exp8 (relative error ~2e-7 on [-87, 88]): 2^n * p(r)
// with n = round(x / ln 2) (to nearest even, as _mm256_round_ps), r = x - n ln 2
// (Cody-Waite split), p the degree-6 Taylor polynomial; below -87.3 the result flushes
// toward 0, above 88.7 it is inf.
inline float32x4_t exp4(float32x4_t x) {
  x = vmaxq_f32(x, vdupq_n_f32(-87.3f));
  x = vminq_f32(x, vdupq_n_f32(88.7f));
  const float32x4_t n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.4426950408889634f)));
  float32x4_t r = vfmsq_f32(x, n, vdupq_n_f32(0.693145751953125f));
  r = vfmsq_f32(r, n, vdupq_n_f32(1.428606765330187e-06f));
  float32x4_t p = vdupq_n_f32(1.f / 720.f);
  p = vfmaq_f32(vdupq_n_f32(1.f / 120.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 24.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f / 6.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(0.5f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  p = vfmaq_f32(vdupq_n_f32(1.f), p, r);
  // 2^n as (n + 127) << 23, in two steps so n = 128 (x near 88.7) still gives inf * p
  const int32x4_t ni = vcvtnq_s32_f32(n);
  const int32x4_t h = vshrq_n_s32(ni, 1);
  const float32x4_t a = vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(h, vdupq_n_s32(127)), 23));
  const float32x4_t b =
      vreinterpretq_f32_s32(vshlq_n_s32(vaddq_s32(vsubq_s32(ni, h), vdupq_n_s32(127)), 23));
  return vmulq_f32(vmulq_f32(p, a), b);
}

inline f32x8 exp8(f32x8 x) { return {exp4(x.lo), exp4(x.hi)}; }

}  // namespace houchu_cpu::neon
#endif
