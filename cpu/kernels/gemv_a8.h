// int4 weights x int8 activations (W4A8): the int4 GEMV/GEMM with integer dot products,
// as llama.cpp's Q4_1 x Q8 kernels compute (ggml-cpu's ggml_vec_dot_q4_1_q8_1).
//
// Each activation row is quantized per block of 16 inputs (a8_block; symmetric, scale =
// amax / 127, round half to even): x_k ~ xs_a * xq_k with xq_k in -127..127. Per weight
// group g and output feature f, with the int4 weight w_fk = s_fg q_fk + o_fg:
//   sum_k x_k w_fk ~ s_fg * sum_a xs_a * sum_(k in a) q_fk xq_k + o_fg * sum_k x_k,
// the integer sum exact (u8 x s8 products), the offset term over the sum of the
// quantized x (sum_a xs_a * sum_(k in a) xq_k, as ggml's q8_1 keeps d * sum(qs)): then the
// error is sum_k w_fk (x_k - xs_a xq_k), the least that quantizing x allows. (Over the
// exact sum of x it would be sum_k s_fg q_fk (...) with the unsigned codes q_fk in 0..15,
// about twice the error: SmolLM2's int4 x int8 top-1 agreement with the exact path was
// 0.937 that way.) The codes are int4_pack's blob as it is: in a chunk's 32-bit lane of feature i,
// masking the nibbles 0x0F0F0F0F gives the bytes of k = (0, 4, 1, 5) and shifting by 4
// first those of k = (2, 6, 3, 7) (see gemv.cpp's layout), so the quantized row is
// stored in that order per 8 inputs and one broadcast 32-bit word meets each.
//
// x86 with AVX2 (256-bit; at avx512_bf16 gemv_a8_zmm.h holds the same tile in zmm): vpmaddubsw
// (u8 x s8 pairs to int16; 2 * 15 * 127 per pair, so the 4 of one activation scale's 16
// inputs add up in int16 without saturating) then vpmaddwd to int32; with VNNI (AVX512-VNNI: the
// avx512_bf16 level; AVX-VNNI: the avx2_vnni level) one vpdpbusd does both.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HOUCHU_A8_X86 1
#if (defined(__AVX512VNNI__) && defined(__AVX512VL__)) || defined(__AVXVNNI__)
#define HOUCHU_A8_VNNI 1
#endif
#endif

// aarch64 NEON (the neon and neon_dotprod levels): with dotprod, SDOT (vdotq_s32: 4 s8 x
// s8 products per 32-bit lane; the codes 0..15 are valid s8) does vpdpbusd's work;
// without it, vmull_s8 / vmlal_s8 (the two nibble halves' products of a word, added in
// int16: at most 2 * 15 * 127) then vpadalq_s16 into int32.
#if defined(__ARM_NEON) && defined(__aarch64__)
#include <arm_neon.h>
#define HOUCHU_A8_NEON 1
#endif

namespace houchu_cpu {
namespace gemv {

constexpr int64_t kMaxTileA8 = 4;  // activation rows per pass over the weights
// stored position j of input 8c + kA8Order[j] in each chunk c of 8 inputs
constexpr int kA8Order[8] = {0, 4, 1, 5, 2, 6, 3, 7};

// Inputs per activation scale: 16 (8 where the weight group G is not a multiple of 16).
// One scale per 16 rather than per weight group of 32 halves the inputs an outlier
// coarsens: measured on SmolLM2's English quality text, int4 x int8 top-1 agreement
// with the exact path went from 0.948 (scales per 32) to 0.972 (per 16).
inline int64_t a8_block(int64_t G) { return G % 16 == 0 ? 16 : 8; }

// Quantizes row x [k] (k = ng * G): q [k] int8 in int4_pack's chunk order (kA8Order),
// per a8_block(G) inputs a symmetric scale xs [k / a8_block(G)] (amax / 127, round half
// to even), and gs [ng] the sums of the quantized x per weight group
// (sum_a xs_a * sum_(k in a) q_k, in float32).
inline void quantize_row_a8(const float* x, int64_t ng, int64_t G, int8_t* q, float* xs,
                            float* gs) {
  const int64_t A = a8_block(G), k = ng * G;
#ifdef HOUCHU_A8_X86
  const __m256 sign = _mm256_set1_ps(-0.f);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  float sum = 0.f;  // the group's sum so far, added in the order of the portable loop below
  for (int64_t a = 0; a < k / A; ++a) {
    const float* xa = x + a * A;
    __m256 vmax = _mm256_setzero_ps();
    for (int64_t j = 0; j < A; j += 8) vmax = _mm256_max_ps(vmax, _mm256_andnot_ps(sign, _mm256_loadu_ps(xa + j)));
    alignas(32) float mx[8];
    _mm256_store_ps(mx, vmax);
    float amax = 0.f;
    for (int i = 0; i < 8; ++i) amax = std::max(amax, mx[i]);
    xs[a] = amax / 127.f;
    const __m256 vinv = _mm256_set1_ps(amax > 0.f ? 127.f / amax : 0.f);
    __m256i vsum = _mm256_setzero_si256();  // |values| <= 127: the int8 sums, exactly
    for (int64_t j = 0; j < A; j += 8) {  // cvtps rounds half to even, as nearbyint
      const __m256i v = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(xa + j), vinv));
      vsum = _mm256_add_epi32(vsum, v);
      const __m256i p = _mm256_permutevar8x32_epi32(v, order);
      const __m128i w16 = _mm_packs_epi32(_mm256_castsi256_si128(p), _mm256_extracti128_si256(p, 1));
      _mm_storel_epi64(reinterpret_cast<__m128i*>(q + a * A + j), _mm_packs_epi16(w16, w16));
    }
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(vsum), _mm256_extracti128_si256(vsum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    sum += xs[a] * static_cast<float>(_mm_cvtsi128_si32(s4));
    if ((a + 1) * A % G == 0) {
      gs[(a + 1) * A / G - 1] = sum;
      sum = 0.f;
    }
  }
  return;
#elif defined(HOUCHU_A8_NEON)
  for (int64_t a = 0; a < k / A; ++a) {
    const float* xa = x + a * A;
    float32x4_t vmax = vdupq_n_f32(0.f);
    for (int64_t j = 0; j < A; j += 4) vmax = vmaxq_f32(vmax, vabsq_f32(vld1q_f32(xa + j)));
    const float amax = vmaxvq_f32(vmax);
    xs[a] = amax / 127.f;
    const float32x4_t vinv = vdupq_n_f32(amax > 0.f ? 127.f / amax : 0.f);
    for (int64_t j = 0; j < A; j += 8) {  // vcvtnq rounds half to even, as nearbyint
      const int16x4_t lo = vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(xa + j), vinv)));
      const int16x4_t hi = vqmovn_s32(vcvtnq_s32_f32(vmulq_f32(vld1q_f32(xa + j + 4), vinv)));
      const int16x4x2_t z = vzip_s16(lo, hi);  // inputs 0, 4, 1, 5, 2, 6, 3, 7: kA8Order
      vst1_s8(q + a * A + j, vqmovn_s16(vcombine_s16(z.val[0], z.val[1])));
    }
  }
#else
  for (int64_t a = 0; a < k / A; ++a) {
    const float* xa = x + a * A;
    float amax = 0.f;
    for (int64_t j = 0; j < A; ++j) amax = std::max(amax, std::abs(xa[j]));
    const float inv = amax > 0.f ? 127.f / amax : 0.f;
    xs[a] = amax / 127.f;
    for (int64_t c = 0; c < A / 8; ++c)
      for (int j = 0; j < 8; ++j)
        q[a * A + 8 * c + j] = static_cast<int8_t>(std::nearbyint(xa[8 * c + kA8Order[j]] * inv));
  }
#endif
  for (int64_t g = 0; g < ng; ++g) {
    float sum = 0.f;
    for (int64_t a = g * G / A; a < (g + 1) * G / A; ++a) {
      int32_t isum = 0;
      for (int64_t j = 0; j < A; ++j) isum += q[a * A + j];
      sum += xs[a] * static_cast<float>(isum);
    }
    gs[g] = sum;
  }
}

// Calls f(std::integral_constant<int, MT>) for MT in 1..4 (runtime mt).
template <typename F>
void with_rows4(int64_t mt, F&& f) {
  switch (mt) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    default: return f(std::integral_constant<int, 4>{});
  }
}

template <typename OutT>
inline void store_row8(OutT* p, const float* v, int64_t n) {
  for (int64_t i = 0; i < std::min<int64_t>(n, 8); ++i) p[i] = static_cast<OutT>(v[i]);
}

#ifdef HOUCHU_A8_X86

#ifdef HOUCHU_A8_VNNI
// acc + the 4-way u8 x s8 dot products of each 32-bit lane (vpdpbusd).
inline __m256i dpbusd(__m256i acc, __m256i u, __m256i s) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpbusd_epi32(acc, u, s);
#else
  return _mm256_dpbusd_avx_epi32(acc, u, s);
#endif
}
#endif

inline __m256i bcast_word(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// int4 x int8, MT rows (xq: [MT, ldq] quantized rows; xs: [MT, ldq / a8_block(G)] their
// scales; gs: [MT, ng] their group sums): row blocks [b0, b1) of a blob with H header
// bytes per group.
template <int MT, bool F32S, typename OutT>
void int4_tile_a8(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes, int64_t ng,
                  int64_t G, const int8_t* xq, int64_t ldq, const float* xs, const float* gs,
                  OutT* out, int64_t ldo, int64_t n) {
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  const __m256i hi16 = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
#ifndef HOUCHU_A8_VNNI
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  constexpr int64_t H = F32S ? 128 : 64;
  const int64_t gbytes = H + 8 * G, A = a8_block(G), per = A / 8;
  const int64_t na = G / A;  // activation scales per weight group
  const int64_t lds = ldq / A;  // scales per row
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = w + b * blk_bytes;
    const int64_t n0 = b * kBlock;
    for (int h = 0; h < 2 && n0 + 8 * h < n; ++h) {
      __m256 acc[MT];
      for (int m = 0; m < MT; ++m) acc[m] = _mm256_setzero_ps();
      for (int64_t g = 0; g < ng; ++g) {
        const uint8_t* hdr = blk + g * gbytes;
        __m256 s, o;
        if constexpr (F32S) {
          s = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr) + 8 * h);
          o = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr + 64) + 8 * h);
        } else {  // dword = offset bits << 16 | scale bits
          const __m256i so = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hdr) + h);
          s = _mm256_castsi256_ps(_mm256_slli_epi32(so, 16));
          o = _mm256_castsi256_ps(_mm256_and_si256(so, hi16));
        }
        const uint8_t* codes = hdr + H + 32 * h;
        const int8_t* xg = xq + g * G;
        // per activation scale (1 or 2 chunks): the int16 sums of vpmaddubsw stay exact
        // (the scale's index as a running product: a division here, once per 16 inputs,
        // cost the AVX2 build more than the dot products it feeds)
        for (int64_t a = 0; a < na; ++a) {
          const int64_t c0 = a * per, c1 = c0 + per;
          const float* xsc = xs + g * na + a;
          __m256i d[MT];
          for (int m = 0; m < MT; ++m) d[m] = _mm256_setzero_si256();
          for (int64_t c = c0; c < c1; ++c) {
            const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(codes + 64 * c));
            const __m256i ca = _mm256_and_si256(v, lo4);
            const __m256i cb = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
#pragma GCC unroll 4
            for (int m = 0; m < MT; ++m) {
              const int8_t* xc = xg + m * ldq + 8 * c;
#ifdef HOUCHU_A8_VNNI
              d[m] = dpbusd(d[m], ca, bcast_word(xc));
              d[m] = dpbusd(d[m], cb, bcast_word(xc + 4));
#else
              d[m] = _mm256_add_epi16(d[m], _mm256_maddubs_epi16(ca, bcast_word(xc)));
              d[m] = _mm256_add_epi16(d[m], _mm256_maddubs_epi16(cb, bcast_word(xc + 4)));
#endif
            }
          }
          for (int m = 0; m < MT; ++m) {
#ifdef HOUCHU_A8_VNNI
            const __m256 dot = _mm256_cvtepi32_ps(d[m]);
#else
            const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(d[m], ones));
#endif
            acc[m] = _mm256_fmadd_ps(_mm256_mul_ps(s, dot), _mm256_set1_ps(xsc[m * lds]), acc[m]);
          }
        }
        for (int m = 0; m < MT; ++m)
          acc[m] = _mm256_fmadd_ps(o, _mm256_set1_ps(gs[m * ng + g]), acc[m]);
      }
      for (int m = 0; m < MT; ++m) {
        if constexpr (std::is_same_v<OutT, float>) {
          if (n - n0 - 8 * h >= 8) {
            _mm256_storeu_ps(out + m * ldo + n0 + 8 * h, acc[m]);
            continue;
          }
        }
        alignas(32) float tmp[8];
        _mm256_store_ps(tmp, acc[m]);
        store_row8(out + m * ldo + n0 + 8 * h, tmp, n - n0 - 8 * h);
      }
    }
  }
}

#endif  // HOUCHU_A8_X86

#ifdef HOUCHU_A8_NEON

// int4 x int8, MT rows, as int4_tile_a8 (same inputs, same float32 steps: the exact
// integer dot of each activation scale, times s, times the scale, plus o times the group
// sum): row blocks [b0, b1), per 8-feature half two quarters of 4 features.
template <int MT, bool F32S, typename OutT>
void int4_tile_a8_neon(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes, int64_t ng,
                       int64_t G, const int8_t* xq, int64_t ldq, const float* xs,
                       const float* gs, OutT* out, int64_t ldo, int64_t n) {
  const uint8x16_t lo4 = vdupq_n_u8(0x0F);
  const uint32x4_t hi16 = vdupq_n_u32(0xFFFF0000u);
  constexpr int64_t H = F32S ? 128 : 64;
  const int64_t gbytes = H + 8 * G, A = a8_block(G), per = A / 8;
  const int64_t na = G / A;  // activation scales per weight group
  const int64_t lds = ldq / A;  // scales per row
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = w + b * blk_bytes;
    const int64_t n0 = b * kBlock;
    for (int h = 0; h < 2 && n0 + 8 * h < n; ++h) {
      float32x4_t acc[MT][2];
      for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = vdupq_n_f32(0.f);
      for (int64_t g = 0; g < ng; ++g) {
        const uint8_t* hdr = blk + g * gbytes;
        float32x4_t s[2], o[2];
        for (int qq = 0; qq < 2; ++qq) {
          if constexpr (F32S) {
            s[qq] = vld1q_f32(reinterpret_cast<const float*>(hdr) + 8 * h + 4 * qq);
            o[qq] = vld1q_f32(reinterpret_cast<const float*>(hdr + 64) + 8 * h + 4 * qq);
          } else {  // dword = offset bits << 16 | scale bits
            const uint32_t* sp = reinterpret_cast<const uint32_t*>(hdr) + 8 * h + 4 * qq;
            const uint32x4_t so = vld1q_u32(sp);
            s[qq] = vreinterpretq_f32_u32(vshlq_n_u32(so, 16));
            o[qq] = vreinterpretq_f32_u32(vandq_u32(so, hi16));
          }
        }
        const uint8_t* codes = hdr + H + 32 * h;
        const int8_t* xg = xq + g * G;
        // (the scale's index as a running product: a division here, once per 16 inputs,
        // cost the AVX2 build more than the dot products it feeds)
        for (int64_t a = 0; a < na; ++a) {
          const int64_t c0 = a * per, c1 = c0 + per;
          const float* xsc = xs + g * na + a;
          int32x4_t d[MT][2];
#ifndef __ARM_FEATURE_DOTPROD
          int32x4_t dp[MT][2];  // the pair sums of features (0, 0, 1, 1) / (2, 2, 3, 3)
#endif
          for (int m = 0; m < MT; ++m)
            for (int qq = 0; qq < 2; ++qq) {
              d[m][qq] = vdupq_n_s32(0);
#ifndef __ARM_FEATURE_DOTPROD
              dp[m][qq] = vdupq_n_s32(0);
#endif
            }
          for (int64_t c = c0; c < c1; ++c) {
            uint8x16_t ca[2], cb[2];
            for (int qq = 0; qq < 2; ++qq) {
              const uint8x16_t v = vld1q_u8(codes + 64 * c + 16 * qq);
              ca[qq] = vandq_u8(v, lo4);
              cb[qq] = vshrq_n_u8(v, 4);
            }
#pragma GCC unroll 4
            for (int m = 0; m < MT; ++m) {
              const int8_t* xc = xg + m * ldq + 8 * c;
              int32_t wa, wb;
              std::memcpy(&wa, xc, 4);
              std::memcpy(&wb, xc + 4, 4);
              const int8x16_t xa = vreinterpretq_s8_s32(vdupq_n_s32(wa));
              const int8x16_t xb = vreinterpretq_s8_s32(vdupq_n_s32(wb));
              for (int qq = 0; qq < 2; ++qq) {
#ifdef __ARM_FEATURE_DOTPROD
                // per 32-bit lane (a feature): 4 codes times the word's 4 inputs
                d[m][qq] = vdotq_s32(d[m][qq], vreinterpretq_s8_u8(ca[qq]), xa);
                d[m][qq] = vdotq_s32(d[m][qq], vreinterpretq_s8_u8(cb[qq]), xb);
#else
                const int8x16_t sa = vreinterpretq_s8_u8(ca[qq]), sb = vreinterpretq_s8_u8(cb[qq]);
                // features 0, 1 of the quarter (low 8 bytes), then 2, 3 (high 8 bytes)
                int16x8_t p0 = vmull_s8(vget_low_s8(sa), vget_low_s8(xa));
                p0 = vmlal_s8(p0, vget_low_s8(sb), vget_low_s8(xb));
                int16x8_t p1 = vmull_s8(vget_high_s8(sa), vget_high_s8(xa));
                p1 = vmlal_s8(p1, vget_high_s8(sb), vget_high_s8(xb));
                d[m][qq] = vpadalq_s16(d[m][qq], p0);
                dp[m][qq] = vpadalq_s16(dp[m][qq], p1);
#endif
              }
            }
          }
          for (int m = 0; m < MT; ++m)
            for (int qq = 0; qq < 2; ++qq) {
#ifdef __ARM_FEATURE_DOTPROD
              const float32x4_t dot = vcvtq_f32_s32(d[m][qq]);
#else
              const float32x4_t dot = vcvtq_f32_s32(vpaddq_s32(d[m][qq], dp[m][qq]));
#endif
              acc[m][qq] = vfmaq_f32(acc[m][qq], vmulq_f32(s[qq], dot), vdupq_n_f32(xsc[m * lds]));
            }
        }
        for (int m = 0; m < MT; ++m)
          for (int qq = 0; qq < 2; ++qq)
            acc[m][qq] = vfmaq_f32(acc[m][qq], o[qq], vdupq_n_f32(gs[m * ng + g]));
      }
      for (int m = 0; m < MT; ++m) {
        alignas(16) float tmp[8];
        vst1q_f32(tmp, acc[m][0]);
        vst1q_f32(tmp + 4, acc[m][1]);
        store_row8(out + m * ldo + n0 + 8 * h, tmp, n - n0 - 8 * h);
      }
    }
  }
}

#endif  // HOUCHU_A8_NEON

// The same sums without SIMD (builds for CPUs without AVX2).
template <typename OutT>
void int4_scalar_a8(const uint8_t* w, int64_t b0, int64_t b1, int64_t ng, int64_t G, int64_t H,
                    const int8_t* xq, int64_t ldq, const float* xs, const float* gs, int64_t m,
                    OutT* out, int64_t n) {
  const int64_t gbytes = H + 8 * G;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t i = 0; i < kBlock && b * kBlock + i < n; ++i)
      for (int64_t r = 0; r < m; ++r) {
        float acc = 0.f;
        for (int64_t g = 0; g < ng; ++g) {
          const uint8_t* hdr = w + (b * ng + g) * gbytes;
          float s, o;
          if (H == 128) {
            std::memcpy(&s, hdr + 4 * i, 4);
            std::memcpy(&o, hdr + 64 + 4 * i, 4);
          } else {
            uint32_t d;
            std::memcpy(&d, hdr + 4 * i, 4);
            const uint32_t sb = (d & 0xFFFFu) << 16, ob = d & 0xFFFF0000u;
            std::memcpy(&s, &sb, 4);
            std::memcpy(&o, &ob, 4);
          }
          const int64_t A = a8_block(G);
          for (int64_t c0 = 0; c0 < G / 8; c0 += A / 8) {
            int32_t dot = 0;
            for (int64_t c = c0; c < c0 + A / 8; ++c) {
              uint32_t lane;
              std::memcpy(&lane, hdr + H + 64 * c + 4 * i, 4);
              for (int j = 0; j < 8; ++j) {  // byte j of (lane & 0x0F0F0F0F), then of (lane >> 4)
                const int shift = j < 4 ? 8 * j : 8 * (j - 4) + 4;
                const int32_t code = static_cast<int32_t>((lane >> shift) & 15);
                dot += code * xq[r * ldq + g * G + 8 * c + j];
              }
            }
            acc += s * xs[r * (ldq / A) + (g * G + 8 * c0) / A] * static_cast<float>(dot);
          }
          acc += o * gs[r * ng + g];
        }
        out[r * n + b * kBlock + i] = static_cast<OutT>(acc);
      }
}

}  // namespace gemv
}  // namespace houchu_cpu
