// int4 weights x int8 activations for many rows (prefill): the W4A8 GEMM on x86 (AVX2,
// with AVX-VNNI / AVX512-VNNI vpdpbusd where the level has it).
//
// Same inputs and the same float32 steps as gemv_a8.h's int4_tile_a8 (the quantized rows
// xq in int4_pack's chunk order, their per-16-input scales xs and group sums gs), so the
// results are bit for bit those of int4_tile_a8 at any row count: per (row, feature) and
// in the same order, for each weight group g and activation scale a of it,
//   acc = fma(s_fg * float(dot_a), xs_a, acc), then after the group acc = fma(o_fg, gs_g, acc)
// with dot_a the exact integer sum over a's inputs (integer sums have no order).
//
// What differs is the tiling. int4_tile_a8 holds at most 4 rows' float accumulators in
// registers and passes over the weights once per 4 rows, re-decoding every nibble and
// re-broadcasting every activation word per 8-feature half. Here, per row block of
// rows_per_block() rows (their quantized activations stay in L1), per 16-feature weight
// block and per activation scale, the codes of both halves are decoded once into 8
// registers (2 chunks x low / high nibbles x 2 halves) and every row of the block passes
// over them: 4 broadcast words per row serve 8 vpmaddubsw (or vpdpbusd), and the row's
// 16 float accumulators live in a small L1 tile (acc) that each scale's step loads,
// updates and stores. Per row, 16 features and 16 inputs (256 products): 8 vpmaddubsw,
// 6 vpaddw, 2 vpmaddwd, 2 vcvtdq2ps, 2 vmulps, 2 vfmadd231ps (VNNI: 8 vpdpbusd and the
// float steps), against int4_tile_a8's extra nibble decoding per 4 rows and spills.
#pragma once
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>

#include "gemv_a8.h"

namespace houchu_cpu {
namespace gemv {

// From this many rows run_blocks takes int4_gemm_a8 instead of int4_tile_a8 (the same
// results; below it the acc tile's loads and stores cost more than the decoding saved).
constexpr int64_t kGemmA8MinRows = 8;

// Rows per block: their quantized activations (ldq bytes each) within ~16 KiB of L1,
// 8..64 rows.
inline int64_t rows_per_block(int64_t ldq) {
  return std::clamp<int64_t>((16 << 10) / std::max<int64_t>(ldq, 1), 8, 64);
}

#ifdef HOUCHU_A8_X86

// The dot products of one activation scale (PER chunks of 8 inputs; PER = 1 or 2) for
// rows [0, rows) of a row block and both 8-feature halves of one weight block, added to
// acc [rows, 16] as int4_tile_a8 adds them; LAST: then the group's offset term.
template <int PER, bool LAST>
inline void a8_scale_step(const __m256i (&ca)[2][2], const __m256i (&cb)[2][2], const __m256 (&s)[2],
                          const __m256 (&o)[2], const int8_t* xq, int64_t ldq, const float* xs,
                          int64_t lds, const float* gs, int64_t ng, int64_t rows, float* acc) {
#ifndef HOUCHU_A8_VNNI
  const __m256i ones = _mm256_set1_epi16(1);
#endif
  for (int64_t r = 0; r < rows; ++r) {
    const int8_t* xr = xq + r * ldq;
    __m256i d[2];
#pragma GCC unroll 2
    for (int c = 0; c < PER; ++c) {
      const __m256i xa = bcast_word(xr + 8 * c), xb = bcast_word(xr + 8 * c + 4);
#pragma GCC unroll 2
      for (int h = 0; h < 2; ++h) {
#ifdef HOUCHU_A8_VNNI
        const __m256i z = c == 0 ? _mm256_setzero_si256() : d[h];
        d[h] = dpbusd(dpbusd(z, ca[h][c], xa), cb[h][c], xb);
#else
        const __m256i p = _mm256_add_epi16(_mm256_maddubs_epi16(ca[h][c], xa),
                                           _mm256_maddubs_epi16(cb[h][c], xb));
        d[h] = c == 0 ? p : _mm256_add_epi16(d[h], p);
#endif
      }
    }
    const __m256 xsr = _mm256_set1_ps(xs[r * lds]);
#pragma GCC unroll 2
    for (int h = 0; h < 2; ++h) {
#ifdef HOUCHU_A8_VNNI
      const __m256 dot = _mm256_cvtepi32_ps(d[h]);
#else
      const __m256 dot = _mm256_cvtepi32_ps(_mm256_madd_epi16(d[h], ones));
#endif
      float* ar = acc + r * kBlock + 8 * h;
      __m256 a = _mm256_fmadd_ps(_mm256_mul_ps(s[h], dot), xsr, _mm256_load_ps(ar));
      if constexpr (LAST) a = _mm256_fmadd_ps(o[h], _mm256_set1_ps(gs[r * ng]), a);
      _mm256_store_ps(ar, a);
    }
  }
}

// int4 x int8 for m rows (xq [m, ldq], xs [m, ldq / a8_block(G)], gs [m, ng], as
// int4_tile_a8): row blocks [b0, b1) of a blob with F32S ? 128 : 64 header bytes per
// group; out [m, ldo] from column 16 b0.
template <bool F32S, typename OutT>
void int4_gemm_a8(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes, int64_t ng,
                  int64_t G, const int8_t* xq, int64_t ldq, const float* xs, const float* gs,
                  int64_t m, OutT* out, int64_t ldo, int64_t n) {
  const __m256i lo4 = _mm256_set1_epi8(0x0F);
  const __m256i hi16 = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  constexpr int64_t H = F32S ? 128 : 64;
  const int64_t gbytes = H + 8 * G, A = a8_block(G), per = A / 8, na = G / A;
  const int64_t lds = ldq / A, rb = rows_per_block(ldq);
  alignas(64) float acc[64 * kBlock];
  for (int64_t r0 = 0; r0 < m; r0 += rb) {
    const int64_t rows = std::min(rb, m - r0);
    const int8_t* xqb = xq + r0 * ldq;
    const float* xsb = xs + r0 * lds;
    const float* gsb = gs + r0 * ng;
    for (int64_t b = b0; b < b1; ++b) {
      const uint8_t* blk = w + b * blk_bytes;
      std::fill(acc, acc + rows * kBlock, 0.f);
      for (int64_t g = 0; g < ng; ++g) {
        const uint8_t* hdr = blk + g * gbytes;
        __m256 s[2], o[2];
        for (int h = 0; h < 2; ++h) {
          if constexpr (F32S) {
            s[h] = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr) + 8 * h);
            o[h] = _mm256_loadu_ps(reinterpret_cast<const float*>(hdr + 64) + 8 * h);
          } else {  // dword = offset bits << 16 | scale bits
            const __m256i so = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(hdr) + h);
            s[h] = _mm256_castsi256_ps(_mm256_slli_epi32(so, 16));
            o[h] = _mm256_castsi256_ps(_mm256_and_si256(so, hi16));
          }
        }
        for (int64_t a = 0; a < na; ++a) {
          __m256i ca[2][2], cb[2][2];  // [half][chunk of the scale]
          for (int c = 0; c < per; ++c)
            for (int h = 0; h < 2; ++h) {
              const __m256i v = _mm256_loadu_si256(
                  reinterpret_cast<const __m256i*>(hdr + H + 64 * (a * per + c) + 32 * h));
              ca[h][c] = _mm256_and_si256(v, lo4);
              cb[h][c] = _mm256_and_si256(_mm256_srli_epi16(v, 4), lo4);
            }
          const int8_t* xa = xqb + g * G + a * A;
          const float* xsa = xsb + g * na + a;
          const float* gsa = gsb + g;
          const bool last = a == na - 1;
          if (per == 2) {
            if (last)
              a8_scale_step<2, true>(ca, cb, s, o, xa, ldq, xsa, lds, gsa, ng, rows, acc);
            else
              a8_scale_step<2, false>(ca, cb, s, o, xa, ldq, xsa, lds, gsa, ng, rows, acc);
          } else if (last) {
            a8_scale_step<1, true>(ca, cb, s, o, xa, ldq, xsa, lds, gsa, ng, rows, acc);
          } else {
            a8_scale_step<1, false>(ca, cb, s, o, xa, ldq, xsa, lds, gsa, ng, rows, acc);
          }
        }
      }
      const int64_t n0 = b * kBlock, nn = std::min<int64_t>(kBlock, n - n0);
      for (int64_t r = 0; r < rows; ++r) {
        OutT* orow = out + (r0 + r) * ldo + n0;
        const float* ar = acc + r * kBlock;
        if constexpr (std::is_same_v<OutT, float>) {
          if (nn == kBlock) {
            std::memcpy(orow, ar, sizeof(float) * kBlock);
            continue;
          }
        }
        for (int64_t i = 0; i < nn; ++i) orow[i] = static_cast<OutT>(ar[i]);
      }
    }
  }
}

#endif  // HOUCHU_A8_X86

}  // namespace gemv
}  // namespace houchu_cpu
