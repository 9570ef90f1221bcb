// The W4A8 few-row tile (gemv_a8.h's int4_tile_a8) in 512-bit registers, for the builds
// with AVX512F + AVX512BW + AVX512-VNNI (the avx512_bf16 level; the avx512 level has no
// VNNI and keeps the 256-bit tile).
//
// int4_pack's chunk of 8 inputs is 64 contiguous bytes, dword i the 8 codes of feature i
// of the block, and a group header's 16 scales / offsets fill one zmm: per 16-feature
// block one pass does what int4_tile_a8 does in two 8-feature halves. Per chunk and row:
// one load, and, shift + and (shared by the rows), two 512-bit vpdpbusd with the row's
// two activation words broadcast (the 256-bit tile: twice that, per half). The chunks
// per activation scale (1 or 2) are a template parameter, so that loop is unrolled.
//
// Results are bit for bit int4_tile_a8's: the integer dot products are exact, and each
// lane's float32 steps are the same in the same order, per weight group g and activation
// scale a: acc = fma(s * float(dot_a), xs_a, acc), then acc = fma(o, gs_g, acc). The
// last block's features past n (zero codes, scales and offsets in the blob) are computed
// and not stored (masked stores); bfloat16 outputs round as c10::BFloat16 (vec.h).
#pragma once
#include <cstdint>
#include <cstring>

#include <c10/util/BFloat16.h>

#include "gemv_a8.h"
#include "vec.h"

#if defined(HOUCHU_A8_X86) && defined(HOUCHU_AVX512) && defined(__AVX512VNNI__)
#define HOUCHU_A8_ZMM 1

namespace houchu_cpu {
namespace gemv {

inline __m512i bcast_word16(const int8_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

// Lanes [0, nn) of v (nn >= 1; all 16 from nn = 16) to p [0, nn), as p's type.
inline void store_lanes16(float* p, __m512 v, int64_t nn) {
  if (nn >= kBlock)
    _mm512_storeu_ps(p, v);
  else
    _mm512_mask_storeu_ps(p, static_cast<__mmask16>((1u << nn) - 1), v);
}

inline void store_lanes16(c10::BFloat16* p, __m512 v, int64_t nn) {
  const __m256i bits = vec::bf16_bits16(v);
  if (nn >= kBlock)
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), bits);
  else
    _mm256_mask_storeu_epi16(p, static_cast<__mmask16>((1u << nn) - 1), bits);
}

// int4_tile_a8_zmm with PER = a8_block(G) / 8 chunks of 8 inputs per activation scale.
template <int MT, int PER, bool F32S, typename OutT>
void int4_tile_a8_zmm_per(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes,
                          int64_t ng, int64_t G, const int8_t* xq, int64_t ldq, const float* xs,
                          const float* gs, OutT* out, int64_t ldo, int64_t n) {
  const __m512i lo4 = _mm512_set1_epi8(0x0F);
  const __m512i hi16 = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  constexpr int64_t H = F32S ? 128 : 64, A = 8 * PER;
  const int64_t gbytes = H + 8 * G;
  const int64_t na = G / A;  // activation scales per weight group
  const int64_t lds = ldq / A;  // scales per row
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* blk = w + b * blk_bytes;
    const int64_t n0 = b * kBlock;
    __m512 acc[MT];
    for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      const uint8_t* hdr = blk + g * gbytes;
      __m512 s, o;
      if constexpr (F32S) {
        s = _mm512_loadu_ps(hdr);
        o = _mm512_loadu_ps(hdr + 64);
      } else {  // dword = offset bits << 16 | scale bits
        const __m512i so = _mm512_loadu_si512(hdr);
        s = _mm512_castsi512_ps(_mm512_slli_epi32(so, 16));
        o = _mm512_castsi512_ps(_mm512_and_si512(so, hi16));
      }
      const uint8_t* codes = hdr + H;
      const int8_t* xg = xq + g * G;
      for (int64_t a = 0; a < na; ++a) {
        const float* xsc = xs + g * na + a;
        __m512i d[MT];
        for (int m = 0; m < MT; ++m) d[m] = _mm512_setzero_si512();
        for (int j = 0; j < PER; ++j) {
          const int64_t c = a * PER + j;
          const __m512i v = _mm512_loadu_si512(codes + 64 * c);
          const __m512i ca = _mm512_and_si512(v, lo4);
          const __m512i cb = _mm512_and_si512(_mm512_srli_epi16(v, 4), lo4);
#pragma GCC unroll 4
          for (int m = 0; m < MT; ++m) {
            const int8_t* xc = xg + m * ldq + 8 * c;
            d[m] = _mm512_dpbusd_epi32(d[m], ca, bcast_word16(xc));
            d[m] = _mm512_dpbusd_epi32(d[m], cb, bcast_word16(xc + 4));
          }
        }
        for (int m = 0; m < MT; ++m) {
          const __m512 dot = _mm512_cvtepi32_ps(d[m]);
          acc[m] = _mm512_fmadd_ps(_mm512_mul_ps(s, dot), _mm512_set1_ps(xsc[m * lds]), acc[m]);
        }
      }
      for (int m = 0; m < MT; ++m)
        acc[m] = _mm512_fmadd_ps(o, _mm512_set1_ps(gs[m * ng + g]), acc[m]);
    }
    for (int m = 0; m < MT; ++m) store_lanes16(out + m * ldo + n0, acc[m], n - n0);
  }
}

// int4 x int8, MT rows: int4_tile_a8's inputs and results (xq: [MT, ldq] quantized rows;
// xs: [MT, ldq / a8_block(G)] their scales; gs: [MT, ng] their group sums; row blocks
// [b0, b1) of a blob with F32S ? 128 : 64 header bytes per group; out [MT, ldo]).
template <int MT, bool F32S, typename OutT>
void int4_tile_a8_zmm(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes, int64_t ng,
                      int64_t G, const int8_t* xq, int64_t ldq, const float* xs, const float* gs,
                      OutT* out, int64_t ldo, int64_t n) {
  if (a8_block(G) == 16)
    int4_tile_a8_zmm_per<MT, 2, F32S>(w, b0, b1, blk_bytes, ng, G, xq, ldq, xs, gs, out, ldo, n);
  else
    int4_tile_a8_zmm_per<MT, 1, F32S>(w, b0, b1, blk_bytes, ng, G, xq, ldq, xs, gs, out, ldo, n);
}

}  // namespace gemv
}  // namespace houchu_cpu

#endif  // HOUCHU_A8_X86 && HOUCHU_AVX512 && __AVX512VNNI__
