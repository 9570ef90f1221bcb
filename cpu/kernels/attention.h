// Kernels of paged decode attention (attention.cpp has the operator; decode_layers.cpp
// calls these from inside its own threads). Softmax attention (Vaswani et al. 2017) of
// one new query token over its KV positions, read in place from the page pool; grouped
// KV heads (Ainslie et al. 2023). Scores, softmax and the weighted sum are float32.
#pragma once
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "vec.h"

namespace houchu_cpu {
namespace attn {

// A sliding window (houchu.model.attention.window): the kernels below attend positions
// [start, len) of the pages they are given (start = 0: all). The first row of page p
// read is start - p * page_size on the page holding start, else 0.
inline int64_t first_row(int64_t p, int64_t start, int64_t ps) {
  return p == start / ps ? start - p * ps : 0;
}

#ifdef HOUCHU_AVX512
constexpr int64_t kMaxGroup = 16, kMaxDv = 16;  // query heads per KV head; D / 16

// The 16 horizontal sums of v[0..15] as one vector: lane j = v[j][0] + ... + v[j][15]
// (a transposing add tree: 46 instructions instead of 16 separate reductions).
inline __m512 sum16x16(const __m512 v[16]) {
  __m512 u[8], w[4];
  for (int j = 0; j < 8; ++j)  // 128-bit lanes: v[j] halves | v[j + 8] halves
    u[j] = _mm512_add_ps(_mm512_shuffle_f32x4(v[j], v[j + 8], 0x44),
                         _mm512_shuffle_f32x4(v[j], v[j + 8], 0xEE));
  for (int j = 0; j < 4; ++j)  // lanes: v[j], v[j + 8], v[j + 4], v[j + 12] (4 floats each)
    w[j] = _mm512_add_ps(_mm512_shuffle_f32x4(u[j], u[j + 4], 0x88),
                         _mm512_shuffle_f32x4(u[j], u[j + 4], 0xDD));
  const __m512 x = _mm512_add_ps(_mm512_unpacklo_ps(w[0], w[1]), _mm512_unpackhi_ps(w[0], w[1]));
  const __m512 y = _mm512_add_ps(_mm512_unpacklo_ps(w[2], w[3]), _mm512_unpackhi_ps(w[2], w[3]));
  const __m512d xd = _mm512_castps_pd(x), yd = _mm512_castps_pd(y);
  const __m512 z = _mm512_add_ps(_mm512_castpd_ps(_mm512_unpacklo_pd(xd, yd)),
                                 _mm512_castpd_ps(_mm512_unpackhi_pd(xd, yd)));
  return _mm512_shuffle_f32x4(z, z, 0xD8);  // lanes 0, 2, 1, 3: sums of v[0..15] in order
}

#ifdef __AVX512BF16__
// Scores of G bfloat16 query heads against one KV head's keys, 16 keys at a time: each
// q·k is DV / 2 bfloat16 pair dot products (vdpbf16ps, the products exact in float32)
// straight from the bfloat16 rows, the 16 keys' partial sums reduced together
// (sum16x16), then scaled. scores: [G, len] (written); mx: [G] (each head's maximum).
template <int DV>
void scores_bf16(const c10::BFloat16* q, int64_t q_stride, const c10::BFloat16* kc,
                 const int64_t* pages, int64_t len, int64_t ps, int64_t hkv, int64_t kvh,
                 int64_t group, float scale, float* scores, float* mx, int64_t start) {
  constexpr int64_t d = DV * 16, pairs = DV / 2;  // zmm of 32 bfloat16 per row
  const int64_t n_pages = (len + ps - 1) / ps, stride = hkv * d;
  const __m512 sc = _mm512_set1_ps(scale);
  for (int64_t g = 0; g < group; ++g) {
    __m512i qb[pairs];
    for (int i = 0; i < pairs; ++i) qb[i] = _mm512_loadu_si512(q + g * q_stride + i * 32);
    __m512 best = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
    for (int64_t p = start / ps; p < n_pages; ++p) {
      const int64_t n = std::min(ps, len - p * ps);
      const c10::BFloat16* k = kc + (pages[p] * ps * hkv + kvh) * d;
      for (int64_t r0 = first_row(p, start, ps); r0 < n; r0 += 16) {
        const int64_t m = std::min<int64_t>(16, n - r0);
        __m512 dots[16];
        auto dot = [&](int64_t j) {
          const c10::BFloat16* kr = k + (r0 + j) * stride;
          __m512 acc = _mm512_setzero_ps();
          for (int i = 0; i < pairs; ++i)
            acc = _mm512_dpbf16_ps(acc, (__m512bh)_mm512_loadu_si512(kr + i * 32),
                                   (__m512bh)qb[i]);
          return acc;
        };
        if (m == 16) {
#pragma GCC unroll 16
          for (int j = 0; j < 16; ++j) dots[j] = dot(j);
        } else {
          for (int j = 0; j < 16; ++j) dots[j] = j < m ? dot(j) : _mm512_setzero_ps();
        }
        const __mmask16 mask = static_cast<__mmask16>((1u << m) - 1);
        const __m512 s = _mm512_mul_ps(sum16x16(dots), sc);
        _mm512_mask_storeu_ps(scores + g * len + p * ps + r0, mask, s);
        best = _mm512_mask_max_ps(best, mask, best, s);
      }
    }
    mx[g] = _mm512_reduce_max_ps(best);
  }
}
#endif

// One K or V row [16 DV] as float32: a T row widened, or an int8 row dequantized with its
// float16 scale and rounded to T (as rows_to_float and dequantize_kv do).
template <typename T, typename C, int DV>
inline void load_row(const C* x, const c10::Half* scale, __m512 out[DV]) {
  if constexpr (std::is_same_v<C, int8_t>) {
    const __m512 s = _mm512_set1_ps(static_cast<float>(*scale));
    for (int i = 0; i < DV; ++i) {
      const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(x + i * 16));
      out[i] = vec::round16<T>(_mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(b)), s));
    }
  } else {
    for (int i = 0; i < DV; ++i) out[i] = vec::load16(x + i * 16);
  }
}

// All G query heads of one KV head of one sequence, AVX-512: each K/V row is loaded and
// widened to float32 once for the G heads (bfloat16 keys: see scores_bf16). C: the
// cache's element type, T or int8_t (then ks, vs: the pool's [P, page_size, Hkv] float16
// scales, which the rows are dequantized with). q: G rows at stride q_stride; out: [G, D]
// contiguous. Scratch: scores [G, len].
template <typename T, int DV, typename C = T>
void attend_group_avx512(const T* q, int64_t q_stride, const C* kc, const C* vc,
                         const int64_t* pages, int64_t len, int64_t ps, int64_t hkv,
                         int64_t kvh, int64_t group, float scale, T* out, float* scores,
                         const c10::Half* ks = nullptr, const c10::Half* vs = nullptr,
                         int64_t start = 0) {
  using namespace vec;
  constexpr int64_t d = DV * 16;
  __m512 qv[kMaxGroup][DV];
  for (int64_t g = 0; g < group; ++g) {
    for (int i = 0; i < DV; ++i) {
      qv[g][i] = _mm512_mul_ps(load16(q + g * q_stride + i * 16), _mm512_set1_ps(scale));
    }
  }
  const int64_t n_pages = (len + ps - 1) / ps, stride = hkv * d;
  float mx[kMaxGroup];
#ifdef __AVX512BF16__
  if constexpr (std::is_same_v<T, c10::BFloat16> && std::is_same_v<C, T>) {
    scores_bf16<DV>(q, q_stride, kc, pages, len, ps, hkv, kvh, group, scale, scores, mx, start);
  } else
#endif
  {
    for (int64_t g = 0; g < group; ++g) mx[g] = -std::numeric_limits<float>::infinity();
    for (int64_t p = start / ps; p < n_pages; ++p) {
      const int64_t n = std::min(ps, len - p * ps);
      const int64_t first = pages[p] * ps * hkv + kvh;  // (slot, head) row of the page's first
      const int64_t r_lo = first_row(p, start, ps);
      const C* k = kc + (first + r_lo * hkv) * d;
      for (int64_t r = r_lo; r < n; ++r, k += stride) {
        __m512 kv[DV];
        load_row<T, C, DV>(k, ks ? ks + first + r * hkv : nullptr, kv);
        for (int64_t g = 0; g < group; ++g) {
          __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
          for (int i = 1; i < DV; ++i) acc = _mm512_fmadd_ps(qv[g][i], kv[i], acc);
          const float s = _mm512_reduce_add_ps(acc);
          scores[g * len + p * ps + r] = s;
          mx[g] = std::max(mx[g], s);
        }
      }
    }
  }
  float inv[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * len;
    __m512 sum = _mm512_setzero_ps();
    const __m512 m = _mm512_set1_ps(mx[g]);
    int64_t t = start;
    for (; t + 16 <= len; t += 16) {
      const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(sg + t), m));
      _mm512_storeu_ps(sg + t, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (t < len) {
      const __mmask16 tail = static_cast<__mmask16>((1u << (len - t)) - 1);
      const __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, sg + t), m));
      _mm512_mask_storeu_ps(sg + t, tail, e);
      sum = _mm512_add_ps(sum, _mm512_maskz_mov_ps(tail, e));
    }
    inv[g] = 1.f / _mm512_reduce_add_ps(sum);
  }
  __m512 acc[kMaxGroup][DV];
  for (int64_t g = 0; g < group; ++g) {
    for (int i = 0; i < DV; ++i) acc[g][i] = _mm512_setzero_ps();
  }
  for (int64_t p = start / ps; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps);
    const int64_t first = pages[p] * ps * hkv + kvh;
    const int64_t r_lo = first_row(p, start, ps);
    const C* v = vc + (first + r_lo * hkv) * d;
    for (int64_t r = r_lo; r < n; ++r, v += stride) {
      __m512 vv[DV];
      load_row<T, C, DV>(v, vs ? vs + first + r * hkv : nullptr, vv);
      for (int64_t g = 0; g < group; ++g) {
        const __m512 pr = _mm512_set1_ps(scores[g * len + p * ps + r]);
        for (int i = 0; i < DV; ++i) acc[g][i] = _mm512_fmadd_ps(pr, vv[i], acc[g][i]);
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const __m512 s = _mm512_set1_ps(inv[g]);
    for (int i = 0; i < DV; ++i) store16(out + g * d + i * 16, _mm512_mul_ps(acc[g][i], s));
  }
}
#endif  // HOUCHU_AVX512

#ifdef HOUCHU_AVX2
constexpr int64_t kMaxGroup = 16;  // query heads per KV head, as the AVX-512 kernel takes
constexpr int64_t kTileRows = 16;  // K/V rows widened at a time (scores: 8 at a time)

// The 8 horizontal sums of v[0..7] as one vector: lane j = v[j][0] + ... + v[j][7]
// (two rounds of pairwise adds within each 128-bit half, then the halves added: 9
// instructions instead of 8 separate reductions).
inline __m256 sum8x8(const __m256 v[8]) {
  // per 128-bit half h: pair sums of v[0] | v[1] (of lanes 4h..4h+3), likewise below
  const __m256 a = _mm256_hadd_ps(v[0], v[1]), b = _mm256_hadd_ps(v[2], v[3]);
  const __m256 c = _mm256_hadd_ps(v[4], v[5]), e = _mm256_hadd_ps(v[6], v[7]);
  // half h: the sums of v[0..3]'s (v[4..7]'s) lanes 4h..4h+3
  const __m256 lo = _mm256_hadd_ps(a, b), hi = _mm256_hadd_ps(c, e);
  return _mm256_add_ps(_mm256_permute2f128_ps(lo, hi, 0x20), _mm256_permute2f128_ps(lo, hi, 0x31));
}

// Rows [0, m) (m <= kTileRows) of a page's K or V at stride `stride` as float32 row
// pointers rows[0, m): a float32 pool's rows in place; bfloat16 rows widened, int8 rows
// dequantized with their float16 scales (scale[r * scale_stride]) and rounded to T (as
// load_row and rows_to_float do), both into tile [m, 8 DV].
template <typename T, typename C, int DV>
inline void tile_rows(const C* x, int64_t stride, const c10::Half* scale, int64_t scale_stride,
                      int64_t m, float* tile, const float** rows) {
  constexpr int64_t d = DV * 8;
  for (int64_t r = 0; r < m; ++r) {
    const C* xr = x + r * stride;
    if constexpr (std::is_same_v<C, float>) {
      rows[r] = xr;
    } else {
      float* o = tile + r * d;
      if constexpr (std::is_same_v<C, int8_t>) {
        const __m256 s = _mm256_set1_ps(static_cast<float>(scale[r * scale_stride]));
        for (int i = 0; i < DV; ++i) {
          const __m128i b = _mm_loadl_epi64(reinterpret_cast<const __m128i*>(xr + i * 8));
          __m256 f = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(b)), s);
          if constexpr (std::is_same_v<T, c10::BFloat16>) {
            // round to nearest even bfloat16 as round8, less its NaN case: an int8 times
            // a finite float16 scale is finite
            const __m256i u = _mm256_castps_si256(f);
            const __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));
            const __m256i up = _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7FFF));
            f = _mm256_castsi256_ps(
                _mm256_and_si256(_mm256_add_epi32(u, up), _mm256_set1_epi32(-65536)));
          }
          _mm256_store_ps(o + i * 8, f);
        }
      } else {
        for (int i = 0; i < DV; ++i) simd::store8(o + i * 8, simd::load8(xr + i * 8));
      }
      rows[r] = o;
    }
  }
}

// All G query heads of one KV head of one sequence, AVX2 + FMA: attend_group_avx512's
// computation in 8-lane vectors (the same rounding points: q * scale, scores, softmax and
// the weighted sum in float32, int8 rows dequantized and rounded to T, the output rounded
// to T once). Each block of K/V rows is widened to float32 once for the G heads (tile_rows);
// a head's scores are 8 keys at a time, its 8 dot products reduced together (sum8x8); its
// output accumulates 8 vectors (64 dimensions) at a time over a block's rows, so the
// accumulators stay in the 16 ymm registers. A head's result does not depend on the other
// heads of the call (the fused decode layers pass chunks of a group). C: the cache's
// element type, T or int8_t (then ks, vs: the pool's [P, page_size, Hkv] float16 scales).
// q: G rows at stride q_stride; out: [G, D] contiguous. Scratch: scores [G, len].
template <typename T, int DV, typename C = T>
void attend_group_avx2(const T* q, int64_t q_stride, const C* kc, const C* vc,
                       const int64_t* pages, int64_t len, int64_t ps, int64_t hkv, int64_t kvh,
                       int64_t group, float scale, T* out, float* scores,
                       const c10::Half* ks = nullptr, const c10::Half* vs = nullptr,
                       int64_t start = 0) {
  using namespace simd;
  constexpr int64_t d = DV * 8;
  constexpr int CW = DV < 8 ? DV : 8;  // output vectors per accumulation pass
  static_assert(DV % CW == 0);
  alignas(32) float qf[kMaxGroup][d];  // q * scale
  alignas(32) float acc[kMaxGroup][d];  // the unnormalized weighted sums
  alignas(32) float tile[kTileRows][d];
  const float* rows[kTileRows];
  const __m256 sc = _mm256_set1_ps(scale);
  for (int64_t g = 0; g < group; ++g) {
    for (int i = 0; i < DV; ++i)
      store8(qf[g] + i * 8, _mm256_mul_ps(load8(q + g * q_stride + i * 8), sc));
  }
  const int64_t n_pages = (len + ps - 1) / ps, stride = hkv * d;
  const __m256 ninf = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 best[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) best[g] = ninf;
  for (int64_t p = start / ps; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps);
    const int64_t first = pages[p] * ps * hkv + kvh;  // (slot, head) row of the page's first
    for (int64_t r0 = first_row(p, start, ps); r0 < n; r0 += kTileRows) {
      const int64_t m = std::min(kTileRows, n - r0);
      tile_rows<T, C, DV>(kc + (first + r0 * hkv) * d, stride,
                          ks ? ks + first + r0 * hkv : nullptr, hkv, m, tile[0], rows);
      for (int64_t j0 = 0; j0 < m; j0 += 8) {
        const int64_t m8 = std::min<int64_t>(8, m - j0);
        const float* kr[8];  // lanes past m8 repeat the first row; their scores are dropped
        for (int j = 0; j < 8; ++j) kr[j] = rows[j0 + (j < m8 ? j : 0)];
        for (int64_t g = 0; g < group; ++g) {
          __m256 dots[8];
          const __m256 q0 = _mm256_load_ps(qf[g]);
          for (int j = 0; j < 8; ++j) dots[j] = _mm256_mul_ps(q0, _mm256_loadu_ps(kr[j]));
          for (int i = 1; i < DV; ++i) {
            const __m256 qi = _mm256_load_ps(qf[g] + i * 8);
            for (int j = 0; j < 8; ++j)
              dots[j] = _mm256_fmadd_ps(qi, _mm256_loadu_ps(kr[j] + i * 8), dots[j]);
          }
          const __m256 s = sum8x8(dots);
          float* dst = scores + g * len + p * ps + r0 + j0;
          if (m8 == 8) {
            _mm256_storeu_ps(dst, s);
            best[g] = _mm256_max_ps(best[g], s);
          } else {
            const __m256i keep = lanes8(m8);
            _mm256_maskstore_ps(dst, keep, s);
            best[g] = _mm256_max_ps(best[g], _mm256_blendv_ps(ninf, s, _mm256_castsi256_ps(keep)));
          }
        }
      }
    }
  }
  float inv[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * len;
    __m256 sum = _mm256_setzero_ps();
    const __m256 mx = _mm256_set1_ps(hmax8(best[g]));
    int64_t t = start;
    for (; t + 8 <= len; t += 8) {
      const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(sg + t), mx));
      _mm256_storeu_ps(sg + t, e);
      sum = _mm256_add_ps(sum, e);
    }
    if (t < len) {
      const __m256i tail = lanes8(len - t);
      const __m256 e = exp8(_mm256_sub_ps(_mm256_maskload_ps(sg + t, tail), mx));
      _mm256_maskstore_ps(sg + t, tail, e);
      sum = _mm256_add_ps(sum, _mm256_and_ps(e, _mm256_castsi256_ps(tail)));
    }
    inv[g] = 1.f / hsum8(sum);
    std::fill(acc[g], acc[g] + d, 0.f);
  }
  for (int64_t p = start / ps; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps);
    const int64_t first = pages[p] * ps * hkv + kvh;
    for (int64_t r0 = first_row(p, start, ps); r0 < n; r0 += kTileRows) {
      const int64_t m = std::min(kTileRows, n - r0);
      tile_rows<T, C, DV>(vc + (first + r0 * hkv) * d, stride,
                          vs ? vs + first + r0 * hkv : nullptr, hkv, m, tile[0], rows);
      for (int64_t g = 0; g < group; ++g) {
        const float* pr = scores + g * len + p * ps + r0;
        for (int c0 = 0; c0 < DV; c0 += CW) {
          __m256 a[CW];
          for (int c = 0; c < CW; ++c) a[c] = _mm256_load_ps(acc[g] + (c0 + c) * 8);
          for (int64_t j = 0; j < m; ++j) {
            const __m256 w = _mm256_broadcast_ss(pr + j);
            for (int c = 0; c < CW; ++c)
              a[c] = _mm256_fmadd_ps(w, _mm256_loadu_ps(rows[j] + (c0 + c) * 8), a[c]);
          }
          for (int c = 0; c < CW; ++c) _mm256_store_ps(acc[g] + (c0 + c) * 8, a[c]);
        }
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const __m256 s = _mm256_set1_ps(inv[g]);
    for (int i = 0; i < DV; ++i)
      store8(out + g * d + i * 8, _mm256_mul_ps(_mm256_load_ps(acc[g] + i * 8), s));
  }
}
#endif  // HOUCHU_AVX2

#ifdef HOUCHU_NEON
constexpr int64_t kMaxGroup = 16;  // query heads per KV head, as the AVX2 kernel takes
constexpr int64_t kTileRows = 16;  // K/V rows widened at a time (scores: 8 at a time)

// The 8 horizontal sums of v[0..7] as one vector: lane j = v[j][0] + ... + v[j][7], in
// simd.h's sum8x8 order (pairs, then pairs of pairs within each 4-lane half, then the
// halves added).
inline neon::f32x8 sum8x8(const neon::f32x8 v[8]) {
  float32x4_t half[2][2];  // [lanes 0..3 / 4..7 of v][v[0..3] / v[4..7]]
  for (int q = 0; q < 2; ++q) {
    const float32x4_t* x[8];
    for (int j = 0; j < 8; ++j) x[j] = q == 0 ? &v[j].lo : &v[j].hi;
    half[q][0] = vpaddq_f32(vpaddq_f32(*x[0], *x[1]), vpaddq_f32(*x[2], *x[3]));
    half[q][1] = vpaddq_f32(vpaddq_f32(*x[4], *x[5]), vpaddq_f32(*x[6], *x[7]));
  }
  return {vaddq_f32(half[0][0], half[1][0]), vaddq_f32(half[0][1], half[1][1])};
}

// tile_rows of the AVX2 kernel (float32 rows in place, bfloat16 widened, int8
// dequantized with their float16 scales and rounded to T), into tile [m, 8 DV].
template <typename T, typename C, int DV>
inline void tile_rows(const C* x, int64_t stride, const c10::Half* scale, int64_t scale_stride,
                      int64_t m, float* tile, const float** rows) {
  using namespace neon;
  constexpr int64_t d = DV * 8;
  for (int64_t r = 0; r < m; ++r) {
    const C* xr = x + r * stride;
    if constexpr (std::is_same_v<C, float>) {
      rows[r] = xr;
    } else {
      float* o = tile + r * d;
      if constexpr (std::is_same_v<C, int8_t>) {
        const f32x8 s = set8(static_cast<float>(scale[r * scale_stride]));
        for (int i = 0; i < DV; ++i) {
          const int16x8_t b = vmovl_s8(vld1_s8(xr + i * 8));
          const f32x8 f = {vcvtq_f32_s32(vmovl_s16(vget_low_s16(b))),
                           vcvtq_f32_s32(vmovl_s16(vget_high_s16(b)))};
          store8(o + i * 8, round8<T>(mul8(f, s)));  // finite: no NaN case
        }
      } else {
        for (int i = 0; i < DV; ++i) store8(o + i * 8, load8(xr + i * 8));
      }
      rows[r] = o;
    }
  }
}

// All G query heads of one KV head of one sequence, NEON: attend_group_avx2's steps in
// f32x8 vectors (neon.h), with the same rounding points and reduction orders, so both
// levels compute the same floats. Arguments as attend_group_avx2's.
template <typename T, int DV, typename C = T>
void attend_group_neon(const T* q, int64_t q_stride, const C* kc, const C* vc,
                       const int64_t* pages, int64_t len, int64_t ps, int64_t hkv, int64_t kvh,
                       int64_t group, float scale, T* out, float* scores,
                       const c10::Half* ks = nullptr, const c10::Half* vs = nullptr,
                       int64_t start = 0) {
  using namespace neon;
  constexpr int64_t d = DV * 8;
  constexpr int CW = DV < 8 ? DV : 8;  // output vectors per accumulation pass
  static_assert(DV % CW == 0);
  alignas(16) float qf[kMaxGroup][d];   // q * scale
  alignas(16) float acc[kMaxGroup][d];  // the unnormalized weighted sums
  alignas(16) float tile[kTileRows][d];
  const float* rows[kTileRows];
  const f32x8 sc = set8(scale);
  for (int64_t g = 0; g < group; ++g)
    for (int i = 0; i < DV; ++i) store8(qf[g] + i * 8, mul8(load8(q + g * q_stride + i * 8), sc));
  const int64_t n_pages = (len + ps - 1) / ps, stride = hkv * d;
  const float ninf = -std::numeric_limits<float>::infinity();
  f32x8 best[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) best[g] = set8(ninf);
  for (int64_t p = start / ps; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps);
    const int64_t first = pages[p] * ps * hkv + kvh;  // (slot, head) row of the page's first
    for (int64_t r0 = first_row(p, start, ps); r0 < n; r0 += kTileRows) {
      const int64_t m = std::min(kTileRows, n - r0);
      tile_rows<T, C, DV>(kc + (first + r0 * hkv) * d, stride,
                          ks ? ks + first + r0 * hkv : nullptr, hkv, m, tile[0], rows);
      for (int64_t j0 = 0; j0 < m; j0 += 8) {
        const int64_t m8 = std::min<int64_t>(8, m - j0);
        const float* kr[8];  // lanes past m8 repeat the first row; their scores are dropped
        for (int j = 0; j < 8; ++j) kr[j] = rows[j0 + (j < m8 ? j : 0)];
        for (int64_t g = 0; g < group; ++g) {
          f32x8 dots[8];
          const f32x8 q0 = load8(qf[g]);
          for (int j = 0; j < 8; ++j) dots[j] = mul8(q0, load8(kr[j]));
          for (int i = 1; i < DV; ++i) {
            const f32x8 qi = load8(qf[g] + i * 8);
            for (int j = 0; j < 8; ++j) dots[j] = fma8(qi, load8(kr[j] + i * 8), dots[j]);
          }
          const f32x8 sv = sum8x8(dots);
          float* dst = scores + g * len + p * ps + r0 + j0;
          if (m8 == 8) {
            store8(dst, sv);
            best[g] = max8(best[g], sv);
          } else {
            store_part8(dst, sv, m8);
            best[g] = max8(best[g], keep8(sv, m8, ninf));
          }
        }
      }
    }
  }
  float inv[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * len;
    f32x8 sum = zero8();
    const f32x8 mx = set8(hmax8(best[g]));
    int64_t t = start;
    for (; t + 8 <= len; t += 8) {
      const f32x8 e = exp8(sub8(load8(sg + t), mx));
      store8(sg + t, e);
      sum = add8(sum, e);
    }
    if (t < len) {
      const f32x8 e = exp8(sub8(load_part8(sg + t, len - t), mx));
      store_part8(sg + t, e, len - t);
      sum = add8(sum, keep8(e, len - t, 0.f));
    }
    inv[g] = 1.f / hsum8(sum);
    std::fill(acc[g], acc[g] + d, 0.f);
  }
  for (int64_t p = start / ps; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps);
    const int64_t first = pages[p] * ps * hkv + kvh;
    for (int64_t r0 = first_row(p, start, ps); r0 < n; r0 += kTileRows) {
      const int64_t m = std::min(kTileRows, n - r0);
      tile_rows<T, C, DV>(vc + (first + r0 * hkv) * d, stride,
                          vs ? vs + first + r0 * hkv : nullptr, hkv, m, tile[0], rows);
      for (int64_t g = 0; g < group; ++g) {
        const float* pr = scores + g * len + p * ps + r0;
        for (int c0 = 0; c0 < DV; c0 += CW) {
          f32x8 a[CW];
          for (int c = 0; c < CW; ++c) a[c] = load8(acc[g] + (c0 + c) * 8);
          for (int64_t j = 0; j < m; ++j) {
            const f32x8 wj = set8(pr[j]);
            for (int c = 0; c < CW; ++c) a[c] = fma8(wj, load8(rows[j] + (c0 + c) * 8), a[c]);
          }
          for (int c = 0; c < CW; ++c) store8(acc[g] + (c0 + c) * 8, a[c]);
        }
      }
    }
  }
  for (int64_t g = 0; g < group; ++g) {
    const f32x8 s = set8(inv[g]);
    for (int i = 0; i < DV; ++i) store8(out + g * d + i * 8, mul8(load8(acc[g] + i * 8), s));
  }
}
#endif  // HOUCHU_NEON

#if defined(HOUCHU_AVX512) || defined(HOUCHU_AVX2) || defined(HOUCHU_NEON)
// The group kernel of this build, for D = 64 or 128 and G <= kMaxGroup: AVX-512's
// (16-lane vectors, DV = D / 16), else AVX2's or NEON's (8 lanes, DV = D / 8). The per-op operator
// and the fused decode layers both call this, so both paths compute alike.
template <typename T, typename C>
inline void attend_group(const T* q, int64_t q_stride, const C* kc, const C* vc,
                         const int64_t* pages, int64_t len, int64_t ps, int64_t hkv,
                         int64_t kvh, int64_t group, int64_t d, float scale, T* out,
                         float* scores, const c10::Half* ks, const c10::Half* vs,
                         int64_t start = 0) {
#ifdef HOUCHU_AVX512
  if (d == 64)
    attend_group_avx512<T, 4, C>(q, q_stride, kc, vc, pages, len, ps, hkv, kvh, group, scale,
                                 out, scores, ks, vs, start);
  else
    attend_group_avx512<T, 8, C>(q, q_stride, kc, vc, pages, len, ps, hkv, kvh, group, scale,
                                 out, scores, ks, vs, start);
#elif defined(HOUCHU_NEON)
  if (d == 64)
    attend_group_neon<T, 8, C>(q, q_stride, kc, vc, pages, len, ps, hkv, kvh, group, scale,
                               out, scores, ks, vs, start);
  else
    attend_group_neon<T, 16, C>(q, q_stride, kc, vc, pages, len, ps, hkv, kvh, group, scale,
                                out, scores, ks, vs, start);
#else
  if (d == 64)
    attend_group_avx2<T, 8, C>(q, q_stride, kc, vc, pages, len, ps, hkv, kvh, group, scale,
                               out, scores, ks, vs, start);
  else
    attend_group_avx2<T, 16, C>(q, q_stride, kc, vc, pages, len, ps, hkv, kvh, group, scale,
                                out, scores, ks, vs, start);
#endif
}
#endif

// Rows [n, D] of one page (stride `stride` elements) to float32 `out` [n, D]; int8 rows
// are dequantized with their float16 scales and rounded to T, as dequantize_kv does.
template <typename T, typename C>
inline void rows_to_float(const C* src, int64_t stride, const c10::Half* scale,
                          int64_t scale_stride, int64_t n, int64_t d, float* out) {
  for (int64_t r = 0; r < n; ++r) {
    const C* x = src + r * stride;
    float* o = out + r * d;
    if (scale != nullptr) {
      const float s = static_cast<float>(scale[r * scale_stride]);
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) {
        o[j] = static_cast<float>(static_cast<T>(static_cast<float>(x[j]) * s));
      }
    } else {
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) o[j] = static_cast<float>(x[j]);
    }
  }
}

// One query head of one sequence, page by page. q: [D]; out: [D]. Scratch: scores
// [len], acc [D], qf [D], tile [page_size, D] floats.
template <typename T, typename C>
void attend_one(const T* q, const C* kc, const C* vc, const c10::Half* ks, const c10::Half* vs,
                const int64_t* pages, int64_t len, int64_t ps, int64_t hkv, int64_t kvh,
                int64_t d, float scale, T* out, float* scores, float* acc, float* qf,
                float* tile, int64_t start = 0) {
  for (int64_t j = 0; j < d; ++j) qf[j] = static_cast<float>(q[j]) * scale;
  const int64_t n_pages = (len + ps - 1) / ps, stride = hkv * d;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t p = start / ps; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps), first = pages[p] * ps * hkv + kvh;
    rows_to_float<T, C>(kc + first * d, stride, ks ? ks + first : nullptr, hkv, n, d, tile);
    for (int64_t r = first_row(p, start, ps); r < n; ++r) {
      const float* k = tile + r * d;
      float dot = 0.f;
#pragma omp simd reduction(+ : dot)
      for (int64_t j = 0; j < d; ++j) dot += qf[j] * k[j];
      scores[p * ps + r] = dot;
      mx = std::max(mx, dot);
    }
  }
  float denom = 0.f;
#pragma omp simd reduction(+ : denom)
  for (int64_t t = start; t < len; ++t) {
    scores[t] = std::exp(scores[t] - mx);
    denom += scores[t];
  }
  std::fill(acc, acc + d, 0.f);
  for (int64_t p = start / ps; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps), first = pages[p] * ps * hkv + kvh;
    rows_to_float<T, C>(vc + first * d, stride, vs ? vs + first : nullptr, hkv, n, d, tile);
    for (int64_t r = first_row(p, start, ps); r < n; ++r) {
      const float pr = scores[p * ps + r];
      const float* v = tile + r * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) acc[j] += pr * v[j];
    }
  }
  const float inv = 1.f / denom;
  for (int64_t j = 0; j < d; ++j) out[j] = static_cast<T>(acc[j] * inv);
}

}  // namespace attn
}  // namespace houchu_cpu
