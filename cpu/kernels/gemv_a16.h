// int8 weights x int16 activations in integer arithmetic (W8A16) on x86: the int8 GEMV's
// path for float32 activations (AVX2 and AVX-512 levels) and bfloat16 ones (AVX2), the LM
// head's above all.
//
// The float path it replaces widens every int8 weight to float32 once per pass of 4
// (AVX2) rows, or splits each float32 activation into three bfloat16 terms (AVX-512:
// three times the dot products), and sums in float32 FMAs. Here the activations are
// quantized once per call, symmetric per block of kA16Block inputs: q = rint(x * 16383 /
// amax) (round half to even), scale amax / 16383 (float32), so |x - q * scale| <= scale / 2
// (2^-15 of the block's largest |x|: finer than bfloat16's 2^-9 of each value for every
// input within 64x of the block's largest). A weight chunk (4 inputs x 16 features) is
// widened to int16 once (vpmovsxbw) for every row of the pass, and each row's products
// are summed exactly in int32 by vpmaddwd (vpdpwssd with AVX-VNNI / AVX512-VNNI): per
// block, |sum| <= 64 * 128 * 16383 < 2^31. Per row and feature, in order over the blocks,
//   acc = fma(float(isum_block), scale_block, acc);   y = acc * w_scale
// (integer sums have no order), so a row's output is bit for bit the same at any row
// count and position (batch invariance) and at either register width.
//
// Layout read: int8_pack's blob [ceil(N/16), 1 + ceil(K/4), 64], a block's header of 16
// float32 scales, then chunks of 64 bytes: (k = 4c, 4c + 1) for features 0..15 as byte
// pairs, then (4c + 2, 4c + 3) likewise (gemv.cpp).
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>

#include <c10/util/BFloat16.h>

#if defined(__AVX2__) && defined(__FMA__)
#include <immintrin.h>
#define HOUCHU_A16_X86 1
#if defined(__AVX512F__) && defined(__AVX512BW__)
#define HOUCHU_A16_ZMM 1
#endif
#endif

namespace houchu_cpu {
namespace gemv {

constexpr int64_t kA16Block = 64;    // inputs per activation scale (16 chunks of 4)
constexpr float kA16Max = 16383.f;  // the largest |code|

// Activation scales per row of ld inputs.
inline int64_t a16_blocks(int64_t ld) { return (ld + kA16Block - 1) / kA16Block; }

// Quantizes row x [k] (element j at x[j * s1]; zero from k to ld) into q [ld] int16 and
// per kA16Block inputs a scale s [a16_blocks(ld)] (0 for an all-zero block; NaN where
// the block holds a NaN or an infinity, so the outputs it feeds are NaN).
template <typename T>
inline void quantize_row_a16(const T* x, int64_t k, int64_t s1, int64_t ld, int16_t* q,
                             float* s) {
  for (int64_t b = 0; b < a16_blocks(ld); ++b) {
    const int64_t j0 = b * kA16Block, j1 = std::min(ld, j0 + kA16Block);
    const int64_t je = std::min(k, j1);
    float amax = 0.f;
    bool finite = true;
    for (int64_t j = j0; j < je; ++j) {
      const float v = static_cast<float>(x[j * s1]);
      finite = finite && std::isfinite(v);
      amax = std::max(amax, std::fabs(v));
    }
    std::fill(q + je, q + j1, int16_t{0});
    if (!finite || amax == 0.f) {
      s[b] = finite ? 0.f : std::numeric_limits<float>::quiet_NaN();
      std::fill(q + j0, q + je, int16_t{0});
      continue;
    }
    const float inv = kA16Max / amax;
    s[b] = amax / kA16Max;
    for (int64_t j = j0; j < je; ++j)
      q[j] = static_cast<int16_t>(std::nearbyint(static_cast<float>(x[j * s1]) * inv));
  }
}

// Stores y [16] (features n0 .. n0 + 15 of a row, those below n) at p[n0 ..].
template <typename OutT>
inline void store_a16(OutT* p, const float* y, int64_t n0, int64_t n) {
  const int64_t e = std::min<int64_t>(16, n - n0);
  for (int64_t i = 0; i < e; ++i) p[n0 + i] = static_cast<OutT>(y[i]);
}

#ifdef HOUCHU_A16_X86

inline __m256i bcast_pair16(const int16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm256_set1_epi32(v);
}

// acc + the pairwise int16 products of each 32-bit lane.
inline __m256i dpwssd(__m256i acc, __m256i w, __m256i x) {
#if defined(__AVX512VNNI__) && defined(__AVX512VL__)
  return _mm256_dpwssd_epi32(acc, w, x);
#elif defined(__AVXVNNI__)
  return _mm256_dpwssd_avx_epi32(acc, w, x);
#else
  return _mm256_add_epi32(acc, _mm256_madd_epi16(w, x));
#endif
}

// MT rows (xq [MT, ldq] int16, xs [MT, lds] their scales): row blocks [b0, b1) of an
// int8_pack blob with nc chunks; out [MT, ldo], features below n.
template <int MT, typename OutT>
void int8_tile_a16(const int8_t* w, int64_t b0, int64_t b1, int64_t nc, const int16_t* xq,
                   int64_t ldq, const float* xs, int64_t lds, OutT* out, int64_t ldo, int64_t n) {
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* hdr = w + b * (1 + nc) * 64;  // 16 float32 scales
    const int8_t* p = hdr + 64;
    __m256 acc[MT][2];  // [row][features 0-7, 8-15]
    for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t c0 = 0, blk = 0; c0 < nc; c0 += kA16Block / 4, ++blk) {
      const int64_t c1 = std::min(nc, c0 + kA16Block / 4);
      __m256i is[MT][2];
      for (int m = 0; m < MT; ++m) is[m][0] = is[m][1] = _mm256_setzero_si256();
      for (int64_t c = c0; c < c1; ++c) {
        const __m128i* q = reinterpret_cast<const __m128i*>(p + c * 64);
        const __m256i w0 = _mm256_cvtepi8_epi16(_mm_loadu_si128(q));      // f 0-7, k 0-1
        const __m256i w1 = _mm256_cvtepi8_epi16(_mm_loadu_si128(q + 1));  // f 8-15, k 0-1
        const __m256i w2 = _mm256_cvtepi8_epi16(_mm_loadu_si128(q + 2));  // f 0-7, k 2-3
        const __m256i w3 = _mm256_cvtepi8_epi16(_mm_loadu_si128(q + 3));  // f 8-15, k 2-3
#pragma GCC unroll 4
        for (int m = 0; m < MT; ++m) {
          const __m256i xa = bcast_pair16(xq + m * ldq + 4 * c);
          const __m256i xb = bcast_pair16(xq + m * ldq + 4 * c + 2);
          is[m][0] = dpwssd(dpwssd(is[m][0], w0, xa), w2, xb);
          is[m][1] = dpwssd(dpwssd(is[m][1], w1, xa), w3, xb);
        }
      }
      for (int m = 0; m < MT; ++m) {
        const __m256 sc = _mm256_set1_ps(xs[m * lds + blk]);
        for (int h = 0; h < 2; ++h)
          acc[m][h] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(is[m][h]), sc, acc[m][h]);
      }
    }
    const float* ws = reinterpret_cast<const float*>(hdr);
    for (int m = 0; m < MT; ++m) {
      alignas(32) float y[16];
      for (int h = 0; h < 2; ++h)
        _mm256_store_ps(y + 8 * h, _mm256_mul_ps(acc[m][h], _mm256_loadu_ps(ws + 8 * h)));
      store_a16(out + m * ldo, y, b * 16, n);
    }
  }
}

#ifdef HOUCHU_A16_ZMM

inline __m512i dpwssd512(__m512i acc, __m512i w, __m512i x) {
#ifdef __AVX512VNNI__
  return _mm512_dpwssd_epi32(acc, w, x);
#else
  return _mm512_add_epi32(acc, _mm512_madd_epi16(w, x));
#endif
}

// int8_tile_a16 with a block's 16 features in one 512-bit register per row (the same
// integer sums and float32 steps, so the same results).
template <int MT, typename OutT>
void int8_tile_a16_zmm(const int8_t* w, int64_t b0, int64_t b1, int64_t nc, const int16_t* xq,
                       int64_t ldq, const float* xs, int64_t lds, OutT* out, int64_t ldo,
                       int64_t n) {
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* hdr = w + b * (1 + nc) * 64;
    const int8_t* p = hdr + 64;
    __m512 acc[MT];
    for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t c0 = 0, blk = 0; c0 < nc; c0 += kA16Block / 4, ++blk) {
      const int64_t c1 = std::min(nc, c0 + kA16Block / 4);
      __m512i is[MT];
      for (int m = 0; m < MT; ++m) is[m] = _mm512_setzero_si512();
      for (int64_t c = c0; c < c1; ++c) {
        const __m256i* q = reinterpret_cast<const __m256i*>(p + c * 64);
        const __m512i w0 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(q));      // k 0-1
        const __m512i w1 = _mm512_cvtepi8_epi16(_mm256_loadu_si256(q + 1));  // k 2-3
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m) {
          int32_t a, bb;
          std::memcpy(&a, xq + m * ldq + 4 * c, 4);
          std::memcpy(&bb, xq + m * ldq + 4 * c + 2, 4);
          is[m] = dpwssd512(dpwssd512(is[m], w0, _mm512_set1_epi32(a)), w1, _mm512_set1_epi32(bb));
        }
      }
      for (int m = 0; m < MT; ++m)
        acc[m] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(is[m]), _mm512_set1_ps(xs[m * lds + blk]),
                                 acc[m]);
    }
    const __m512 ws = _mm512_loadu_ps(reinterpret_cast<const float*>(hdr));
    for (int m = 0; m < MT; ++m) {
      alignas(64) float y[16];
      _mm512_store_ps(y, _mm512_mul_ps(acc[m], ws));
      store_a16(out + m * ldo, y, b * 16, n);
    }
  }
}

#endif  // HOUCHU_A16_ZMM

// Rows per pass over the weights: their int32 sums (and the widened chunk) stay in
// registers (AVX2: 2 per row of 16; AVX-512: 1 of 32).
#ifdef HOUCHU_A16_ZMM
constexpr int64_t kMaxTileA16 = 8;
#else
constexpr int64_t kMaxTileA16 = 4;
#endif

// Calls f(std::integral_constant<int, mt>) for 1 <= mt <= kMaxTileA16.
template <typename F>
void with_rows_a16(int64_t mt, F&& f) {
  switch (mt) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
#ifdef HOUCHU_A16_ZMM
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
#else
    default: return f(std::integral_constant<int, 4>{});
#endif
  }
}

// out[r, 16 b0 .. 16 b1) for the m rows of xq [m, ldq] / xs [m, lds]; out [m, n]. Each
// weight block is read from memory once: every pass of rows over it follows while it is
// in L1 (an LM head's block: 9 KiB at 576 inputs).
template <typename OutT>
void int8_rows_a16(const int8_t* w, int64_t b0, int64_t b1, int64_t nc, const int16_t* xq,
                   int64_t ldq, const float* xs, int64_t lds, int64_t m, OutT* out, int64_t n) {
  const int64_t step = m <= kMaxTileA16 ? b1 - b0 : 1;  // blocks per call of the tile
  for (int64_t b = b0; b < b1; b += step) {
    for (int64_t r0 = 0; r0 < m; r0 += kMaxTileA16) {
      const int64_t mt = std::min(kMaxTileA16, m - r0);
      with_rows_a16(mt, [&](auto MT_) {
        constexpr int MT = decltype(MT_)::value;
#ifdef HOUCHU_A16_ZMM
        int8_tile_a16_zmm<MT>(w, b, b + step, nc, xq + r0 * ldq, ldq, xs + r0 * lds, lds,
                              out + r0 * n, n, n);
#else
        int8_tile_a16<MT>(w, b, b + step, nc, xq + r0 * ldq, ldq, xs + r0 * lds, lds,
                          out + r0 * n, n, n);
#endif
      });
    }
  }
}

#endif  // HOUCHU_A16_X86

}  // namespace gemv
}  // namespace houchu_cpu
