// Kernels of houchu's weight-only int4 / int8 GEMV (gemv.cpp has the operators and the
// layouts' description; decode_layers.cpp calls these from inside its own threads).
#pragma once
#include "aten.h"
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "vec.h"

namespace houchu_cpu {
namespace gemv {

constexpr int64_t kBlock = 16;  // output features per block (one 512-bit lane each)
constexpr int64_t kMaxTile = 8;  // bfloat16 activation rows per pass over the weights

}  // namespace gemv
}  // namespace houchu_cpu

#include "gemv_a8.h"
#include "gemm_a8.h"
#include "gemv_a8_zmm.h"
#include "gemv_a16.h"

namespace houchu_cpu {
namespace gemv {

inline uint16_t bf16_bits(c10::BFloat16 v) {
  uint16_t b;
  std::memcpy(&b, &v, 2);
  return b;
}

inline float bits_bf16(uint16_t b) {
  const uint32_t u = static_cast<uint32_t>(b) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Round-to-nearest-even float32 -> bfloat16 bits (NaN stays NaN), as c10::BFloat16.
inline uint16_t to_bf16_bits(float f) { return bf16_bits(c10::BFloat16(f)); }

// From this many rows Acts quantizes int8 activations on torch's threads.
constexpr int64_t kParallelQuantRows = 32;

// The activations as the calling level's kernels read them, with the per-group sums of
// every row. The buffers are the calling thread's, reused from call to call (a heap
// allocation costs more than a small GEMV's arithmetic): kernels only read them, and the
// thread's next Acts overwrites them.
//   AVX-512: bfloat16 rows. x bfloat16 -> the same values, R = 1 row each; x float32 ->
//     R = 3 rows each (hi, mid, lo; hi + mid + lo == x exactly unless a term falls into
//     the denormal range); group sums over those rows.
//   AVX2: float32 rows, R = 1 (x widened exactly). For int4 (group > 0) element k is
//     stored times 2^-4t, t = (k % 8) / 2, so that a code masked in place at bit 4t of its
//     lane, converted to float32 (code * 2^4t), gives the exact product with x (see
//     int4_tile_avx2); the group sums are of x itself.
//   NEON: float32 rows, R = 1, as AVX2 but never scaled (int4_tile_neon shifts each code
//     down to its value instead; the FMAs' exact products are the same).
//   portable: x as float32 [M, k] (xf), group sums of the bfloat16 rows as AVX-512.
//   int8 activations (a8, int4 only; every build): quantized rows xq [M, ld] in
//     int4_pack's chunk order, their scales xs [M, ld / a8_block(G)] and exact group
//     sums gsum [M, ngroups] (gemv_a8.h).
//   int16 activations (a16, int8 weights on x86, every level): rows x16 [M, ld] and
//     their scales xs [M, a16_blocks(ld)] (gemv_a16.h).
struct Acts {
  int64_t rows = 0, R = 1, k = 0, ld = 0;  // rows = M * R, ld = row stride of bits / xf / xq
  bool a8 = false;                         // int8 activations (xq, xs, gsum)
  bool a16 = false;                        // int16 activations (x16, xs)
  const int16_t* x16 = nullptr;            // a16: [M, ld]
  const int8_t* xq = nullptr;              // a8: [M, ld]
  const float* xs = nullptr;               // a8: [M, ld / a8_block(G)] scales
  const uint16_t* bits = nullptr;          // AVX-512: [rows, ld] bfloat16 bits, zero past k
  const float* xf = nullptr;               // AVX2: [M, ld] (scaled for int4), zero past k;
                                           // portable: [M, k]
  const float* gsum = nullptr;             // [rows, ngroups] sum of each group's values

  // x: [m, k] float32 or bfloat16 at strides (s0, s1) elements; kpad >= k: the padded
  // row length the packed weight expects; group: int4 group size, or 0 (no group sums);
  // int8_acts: quantize x per group to int8 (int4 only: group > 0, k == kpad).
  template <typename T>
  Acts(const T* x, int64_t m, int64_t k_, int64_t s0, int64_t s1, int64_t kpad, int64_t group,
       bool int8_acts = false) {
    static_assert(std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>);
    thread_local std::vector<uint16_t> bits_buf;
    thread_local std::vector<float> float_buf;
    k = k_;
    ld = kpad;
    const int64_t ng = group > 0 ? kpad / group : 0;
    if (int8_acts && group > 0) {
      thread_local std::vector<int8_t> q_buf;
      a8 = true;
      rows = m;
      const int64_t ns = ld / a8_block(group);  // activation scales per row
      if (static_cast<int64_t>(q_buf.size()) < m * ld) q_buf.resize(m * ld);
      if (static_cast<int64_t>(float_buf.size()) < m * (ns + ng)) float_buf.resize(m * (ns + ng));
      float* scales = float_buf.data();
      float* sums = scales + m * ns;
      int8_t* qp = q_buf.data();
      auto quantize = [&](int64_t i0, int64_t i1) {
        thread_local std::vector<float> row_buf;  // the row in float32, zero past k
        if (static_cast<int64_t>(row_buf.size()) < ld) row_buf.resize(ld);
        float* row = row_buf.data();
        for (int64_t i = i0; i < i1; ++i) {
          const T* p = x + i * s0;
          if (s1 == 1)  // (vectorized)
            for (int64_t j = 0; j < k; ++j) row[j] = static_cast<float>(p[j]);
          else
            for (int64_t j = 0; j < k; ++j) row[j] = static_cast<float>(p[j * s1]);
          std::fill(row + k, row + ld, 0.f);
          quantize_row_a8(row, ng, group, qp + i * ld, scales + i * ns, sums + i * ng);
        }
      };
      // a prefill's rows on every thread (512 rows of 1536 inputs: 0.8 ms on one);
      // inside a parallel region (the fused decode layers) this runs inline
      if (m >= kParallelQuantRows)
        houchu_cpu::parallel_for(0, m, kParallelQuantRows / 2, quantize);
      else
        quantize(0, m);
      xq = q_buf.data();
      xs = scales;
      gsum = sums;
      return;
    }
#ifdef HOUCHU_A16_X86
    if (group == 0) {  // int8 weights
      thread_local std::vector<int16_t> q16_buf;
      a16 = true;
      rows = m;
      const int64_t ns = a16_blocks(ld);
      if (static_cast<int64_t>(q16_buf.size()) < m * ld) q16_buf.resize(m * ld);
      if (static_cast<int64_t>(float_buf.size()) < m * ns) float_buf.resize(m * ns);
      for (int64_t i = 0; i < m; ++i)
        quantize_row_a16(x + i * s0, k, s1, ld, q16_buf.data() + i * ld, float_buf.data() + i * ns);
      x16 = q16_buf.data();
      xs = float_buf.data();
      return;
    }
#endif
#if defined(HOUCHU_AVX2) || defined(HOUCHU_NEON)
    R = 1;
    rows = m;
    if (static_cast<int64_t>(float_buf.size()) < rows * (ld + ng)) float_buf.resize(rows * (ld + ng));
    float* f = float_buf.data();
    float* gs = f + rows * ld;
    for (int64_t i = 0; i < m; ++i) {
      const T* p = x + i * s0;
      float* row = f + i * ld;
      for (int64_t j = 0; j < k; ++j) row[j] = static_cast<float>(p[j * s1]);
      std::fill(row + k, row + ld, 0.f);
      for (int64_t g = 0; g < ng; ++g) {
        float sum = 0.f;
        for (int64_t j = g * group; j < (g + 1) * group; ++j) sum += row[j];
        gs[i * ng + g] = sum;
      }
#ifdef HOUCHU_AVX2
      if (group > 0) {
        constexpr float kScale[8] = {1.f, 1.f, 0x1p-4f, 0x1p-4f, 0x1p-8f, 0x1p-8f, 0x1p-12f, 0x1p-12f};
        for (int64_t j = 0; j < k; ++j) row[j] *= kScale[j % 8];
      }
#endif
    }
    xf = f;
    gsum = gs;
#else
    R = std::is_same_v<T, float> ? 3 : 1;
    rows = m * R;
#ifdef HOUCHU_AVX512
    const int64_t nxf = 0;
#else
    const int64_t nxf = m * k;
#endif
    if (static_cast<int64_t>(bits_buf.size()) < rows * ld) bits_buf.resize(rows * ld);
    if (static_cast<int64_t>(float_buf.size()) < nxf + rows * ng)
      float_buf.resize(nxf + rows * ng);
    uint16_t* b = bits_buf.data();
    float* f = float_buf.data();
    float* gs = f + nxf;
    for (int64_t i = 0; i < m; ++i) {
      uint16_t* row = b + i * R * ld;
      const T* p = x + i * s0;
      if constexpr (std::is_same_v<T, c10::BFloat16>) {
        if (s1 == 1)
          std::memcpy(row, p, 2 * k);
        else
          for (int64_t j = 0; j < k; ++j) row[j] = bf16_bits(p[j * s1]);
      } else {
        for (int64_t j = 0; j < k; ++j) {
          float r = p[j * s1];
          for (int64_t t = 0; t < 3; ++t) {  // r - bf16(r) is exact in float32
            const uint16_t h = to_bf16_bits(r);
            row[t * ld + j] = h;
            r -= bits_bf16(h);
          }
        }
      }
      if (nxf > 0)
        for (int64_t j = 0; j < k; ++j) f[i * k + j] = static_cast<float>(p[j * s1]);
    }
    for (int64_t r = 0; r < rows; ++r) {
      std::fill(b + r * ld + k, b + (r + 1) * ld, uint16_t{0});
      for (int64_t g = 0; g < ng; ++g) {
        float sum = 0.f;
        for (int64_t j = g * group; j < (g + 1) * group; ++j) sum += bits_bf16(b[r * ld + j]);
        gs[r * ng + g] = sum;
      }
    }
    bits = b;
    xf = f;
    gsum = gs;
#endif
  }
};

// Acts of a [M, K] float32 or bfloat16 tensor (any strides).
inline Acts acts_of(const at::Tensor& x, int64_t kpad, int64_t group, bool int8_acts = false) {
  if (x.scalar_type() == at::kBFloat16)
    return Acts(x.data_ptr<c10::BFloat16>(), x.size(0), x.size(1), x.stride(0), x.stride(1),
                kpad, group, int8_acts);
  return Acts(x.data_ptr<float>(), x.size(0), x.size(1), x.stride(0), x.stride(1), kpad, group,
              int8_acts);
}


// Split M activation rows into passes of at most kMaxTile bfloat16 rows (whole R-groups),
// as even as possible: calls f(first original row, original rows in the pass).
template <typename F>
void for_tiles(int64_t m, int64_t R, F&& f) {
  const int64_t per = kMaxTile / R;  // original rows per pass (8 or 2)
  const int64_t n = (m + per - 1) / per;
  int64_t r0 = 0;
  for (int64_t t = 0; t < n; ++t) {
    const int64_t len = (m - r0) / (n - t) + ((m - r0) % (n - t) ? 1 : 0);
    f(r0, len);
    r0 += len;
  }
}

// Contiguous ranges of at least ~32 KiB of weights per task: smaller ones cost more in
// thread wake-up than they save.
inline int64_t grain_for(int64_t block_bytes) {
  return std::max<int64_t>(1, (32 << 10) / std::max<int64_t>(1, block_bytes));
}

#ifdef HOUCHU_AVX512

inline __m512 dp_bf16(__m512 acc, __m512i w, __m512i x) {
#ifdef __AVX512BF16__
  return _mm512_dpbf16_ps(acc, (__m512bh)w, (__m512bh)x);
#else  // acc += w_even * x_even + w_odd * x_odd, both products exact in float32
  const __m512i hi = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  acc = _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_and_si512(w, hi)),
                        _mm512_castsi512_ps(_mm512_and_si512(x, hi)), acc);
  return _mm512_fmadd_ps(_mm512_castsi512_ps(_mm512_slli_epi32(w, 16)),
                         _mm512_castsi512_ps(_mm512_slli_epi32(x, 16)), acc);
#endif
}

inline __m512i bcast_pair(const uint16_t* p) {
  int32_t v;
  std::memcpy(&v, p, 4);
  return _mm512_set1_epi32(v);
}

template <typename OutT>
inline void store_out(OutT* p, __m512 v, __mmask16 mask) {
  if constexpr (std::is_same_v<OutT, float>) {
    _mm512_mask_storeu_ps(p, mask, v);
  } else {
    _mm256_mask_storeu_epi16(p, mask, vec::bf16_bits16(v));
  }
}

// Independent accumulator chains per activation row: enough to cover vdpbf16ps latency.
constexpr int chains_for(int mt) { return mt == 1 ? 8 : mt <= 2 ? 4 : (mt <= 4 ? 2 : 1); }

// Batch-invariant mode (PackedLinear::invariant): every tile size keeps this many chains
// per row, so a row's products are added in the same order whatever the rows beside it
// (chains_for's count depends on the tile's row count, and with it the order of a row's
// float32 sums). Two chains keep 8 rows x 2 accumulators within the 32 zmm registers.
constexpr int kInvariantChains = 2;

// int4: row blocks [b0, b1) for MT bfloat16 rows (R of them per output row); INV: the
// batch-invariant chain count (kInvariantChains) instead of chains_for(MT).
template <int MT, int R, bool F32S, typename OutT, bool INV = false>
void int4_tile(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes, int64_t ng,
               int64_t G, const uint16_t* xb, int64_t ldx, const float* gs, OutT* out,
               int64_t ldo, int64_t n) {
  constexpr int A = INV ? kInvariantChains : chains_for(MT);
  static_assert(MT % R == 0, "whole R-groups per tile");
  // word i -> bfloat16(i & 15): vpermw reads only the low 5 bits of each index word, so
  // a nibble's neighbour bit above it does not matter
  alignas(64) uint16_t tbl[32];
  for (int i = 0; i < 32; ++i) tbl[i] = to_bf16_bits(static_cast<float>(i & 15));
  const __m512i T = _mm512_load_si512(tbl);
  const __m512i hi16 = _mm512_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t chunks = G / 8;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* p = w + b * blk_bytes;
    __m512 acc[MT];
    for (int m = 0; m < MT; ++m) acc[m] = _mm512_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      __m512 s, o;
      if constexpr (F32S) {
        s = _mm512_loadu_ps(reinterpret_cast<const float*>(p));
        o = _mm512_loadu_ps(reinterpret_cast<const float*>(p + 64));
        p += 128;
      } else {  // dword = offset bits << 16 | scale bits
        const __m512i so = _mm512_loadu_si512(p);
        s = _mm512_castsi512_ps(_mm512_slli_epi32(so, 16));
        o = _mm512_castsi512_ps(_mm512_and_si512(so, hi16));
        p += 64;
      }
      __m512 d[MT][A];
      for (int m = 0; m < MT; ++m)
        for (int a = 0; a < A; ++a) d[m][a] = _mm512_setzero_ps();
      const uint16_t* xg = xb + g * G;
      auto chunk = [&](int64_t c, auto slot_) {
        constexpr int slot = decltype(slot_)::value;
        const __m512i v = _mm512_loadu_si512(p);
        p += 64;
        __m512i wt[4];
        wt[0] = _mm512_permutexvar_epi16(v, T);
        wt[1] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 4), T);
        wt[2] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 8), T);
        wt[3] = _mm512_permutexvar_epi16(_mm512_srli_epi16(v, 12), T);
        const uint16_t* xc = xg + c * 8;
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t)
#pragma GCC unroll 8
          for (int m = 0; m < MT; ++m) {
            const int a = (slot * 4 + t) % A;
            d[m][a] = dp_bf16(d[m][a], wt[t], bcast_pair(xc + m * ldx + 2 * t));
          }
      };
      int64_t c = 0;
      if constexpr (A > 4) {
        for (; c + 2 <= chunks; c += 2) {
          chunk(c, std::integral_constant<int, 0>{});
          chunk(c + 1, std::integral_constant<int, 1>{});
        }
      }
      for (; c < chunks; ++c) chunk(c, std::integral_constant<int, 0>{});
      for (int m = 0; m < MT; ++m) {
        __m512 dm = d[m][0];
        for (int a = 1; a < A; ++a) dm = _mm512_add_ps(dm, d[m][a]);
        acc[m] = _mm512_fmadd_ps(s, dm, acc[m]);
        acc[m] = _mm512_fmadd_ps(o, _mm512_set1_ps(gs[m * ng + g]), acc[m]);
      }
    }
    const int64_t n0 = b * kBlock;
    const __mmask16 mask =
        n - n0 >= kBlock ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - n0)) - 1);
    for (int r = 0; r < MT / R; ++r) {
      __m512 y = acc[r * R];
      for (int j = 1; j < R; ++j) y = _mm512_add_ps(y, acc[r * R + j]);
      store_out(out + r * ldo + n0, y, mask);
    }
  }
}

// Calls f(std::integral_constant<int, MT>) for MT in 1..8 (runtime mt).
template <typename F>
void with_mt(int64_t mt, F&& f) {
  switch (mt) {
    case 1: return f(std::integral_constant<int, 1>{});
    case 2: return f(std::integral_constant<int, 2>{});
    case 3: return f(std::integral_constant<int, 3>{});
    case 4: return f(std::integral_constant<int, 4>{});
    case 5: return f(std::integral_constant<int, 5>{});
    case 6: return f(std::integral_constant<int, 6>{});
    case 7: return f(std::integral_constant<int, 7>{});
    default: return f(std::integral_constant<int, 8>{});
  }
}

#endif  // HOUCHU_AVX512

#ifdef HOUCHU_AVX2

// AVX2 + FMA, float32 arithmetic: each 16-feature block is two 8-lane halves.
constexpr int64_t kMaxTile2 = 4;  // activation rows per pass over the weights

// Stores the 8 lanes [0, n) of v (n <= 8) at p.
template <typename OutT>
inline void store_out8(OutT* p, __m256 v, int64_t n) {
  if constexpr (std::is_same_v<OutT, float>) {
    if (n >= 8)
      _mm256_storeu_ps(p, v);
    else
      _mm256_maskstore_ps(p, simd::lanes8(n), v);
  } else {
    alignas(16) uint16_t b[8];
    _mm_store_si128(reinterpret_cast<__m128i*>(b), simd::bf16_pack8(v));
    std::memcpy(p, b, 2 * std::min<int64_t>(n, 8));
  }
}

// int4, MT activation rows (xs: Acts' scaled float32 rows, gs: their group sums): row
// blocks [b0, b1). Lane i of a chunk's half holds feature i's 8 codes: k = 2t at bits
// 4t, k = 2t + 1 at bits 16 + 4t. Masking a code in place and converting gives
// code * 2^4t, and xs holds x * 2^-4t, so each FMA adds the exact product code * x.
// INV (batch-invariant mode): two chains per (row, half) at every MT, the single-row
// kernel's order of sums, so a row's output does not depend on the rows beside it.
template <int MT, bool F32S, typename OutT, bool INV = false>
void int4_tile_avx2(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes, int64_t ng,
                    int64_t G, const float* xs, int64_t ldx, const float* gs, OutT* out,
                    int64_t ldo, int64_t n) {
  constexpr int A = MT == 1 || INV ? 2 : 1;  // accumulator chains per (row, half)
  const __m256i hi16 = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  const int64_t chunks = G / 8;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* p = w + b * blk_bytes;
    __m256 acc[MT][2];
    for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = _mm256_setzero_ps();
    for (int64_t g = 0; g < ng; ++g) {
      __m256 s[2], o[2];
      if constexpr (F32S) {
        for (int h = 0; h < 2; ++h) {
          s[h] = _mm256_loadu_ps(reinterpret_cast<const float*>(p) + 8 * h);
          o[h] = _mm256_loadu_ps(reinterpret_cast<const float*>(p + 64) + 8 * h);
        }
        p += 128;
      } else {  // dword = offset bits << 16 | scale bits
        for (int h = 0; h < 2; ++h) {
          const __m256i so = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + h);
          s[h] = _mm256_castsi256_ps(_mm256_slli_epi32(so, 16));
          o[h] = _mm256_castsi256_ps(_mm256_and_si256(so, hi16));
        }
        p += 64;
      }
      __m256 d[MT][2][A];
      for (int m = 0; m < MT; ++m)
        for (int h = 0; h < 2; ++h)
          for (int a = 0; a < A; ++a) d[m][h][a] = _mm256_setzero_ps();
      const float* xg = xs + g * G;
      for (int64_t c = 0; c < chunks; ++c, p += 64) {
        __m256i src[2][2];  // [half][k parity]
        for (int h = 0; h < 2; ++h) {
          src[h][0] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p) + h);
          src[h][1] = _mm256_srli_epi32(src[h][0], 16);
        }
        const float* xc = xg + c * 8;
#pragma GCC unroll 4
        for (int t = 0; t < 4; ++t) {
          const __m256i mask = _mm256_set1_epi32(15 << (4 * t));
#pragma GCC unroll 2
          for (int par = 0; par < 2; ++par) {
            const __m256 w0 = _mm256_cvtepi32_ps(_mm256_and_si256(src[0][par], mask));
            const __m256 w1 = _mm256_cvtepi32_ps(_mm256_and_si256(src[1][par], mask));
            constexpr int a = 0;
#pragma GCC unroll 4
            for (int m = 0; m < MT; ++m) {
              const __m256 xv = _mm256_broadcast_ss(xc + m * ldx + 2 * t + par);
              const int aa = A == 1 ? a : par;
              d[m][0][aa] = _mm256_fmadd_ps(w0, xv, d[m][0][aa]);
              d[m][1][aa] = _mm256_fmadd_ps(w1, xv, d[m][1][aa]);
            }
          }
        }
      }
      for (int m = 0; m < MT; ++m)
        for (int h = 0; h < 2; ++h) {
          __m256 dm = d[m][h][0];
          for (int a = 1; a < A; ++a) dm = _mm256_add_ps(dm, d[m][h][a]);
          acc[m][h] = _mm256_fmadd_ps(s[h], dm, acc[m][h]);
          acc[m][h] = _mm256_fmadd_ps(o[h], _mm256_set1_ps(gs[m * ng + g]), acc[m][h]);
        }
    }
    const int64_t n0 = b * kBlock;
    for (int m = 0; m < MT; ++m)
      for (int h = 0; h < 2; ++h)
        if (n0 + 8 * h < n) store_out8(out + m * ldo + n0 + 8 * h, acc[m][h], n - n0 - 8 * h);
  }
}

#endif  // HOUCHU_AVX2

#ifdef HOUCHU_NEON

// NEON, float32 arithmetic: int4_tile_avx2 in 8-lane f32x8 vectors (neon.h), with the
// same FMAs in the same order, so both levels give the same floats; int8 weights with
// float32 activations as they are (x86 quantizes them to int16 instead: gemv_a16.h).
constexpr int64_t kMaxTileNeon = 4;  // activation rows per pass over the weights

// Stores the 8 lanes [0, n) of v (n <= 8) at p.
template <typename OutT>
inline void store_out8(OutT* p, neon::f32x8 v, int64_t n) {
  if constexpr (std::is_same_v<OutT, float>) {
    if (n >= 8)
      neon::store8(p, v);
    else
      neon::store_part8(p, v, n);
  } else {
    alignas(16) uint16_t b[8];
    vst1q_u16(b, neon::bf16_pack8(v));
    std::memcpy(p, b, 2 * std::min<int64_t>(n, 8));
  }
}

// Feature lanes 8h .. 8h + 7 of a 64-byte chunk or header as two uint32x4.
inline void load_u32x8(const uint8_t* p, int h, uint32x4_t& lo, uint32x4_t& hi) {
  lo = vld1q_u32(reinterpret_cast<const uint32_t*>(p) + 8 * h);
  hi = vld1q_u32(reinterpret_cast<const uint32_t*>(p) + 8 * h + 4);
}

// The 4-bit code at bit `shift` of every lane, as float32 (vshrq_n takes 1..32 only).
template <int shift>
inline float32x4_t code4(uint32x4_t v) {
  if constexpr (shift > 0) v = vshrq_n_u32(v, shift);
  return vcvtq_f32_u32(vandq_u32(v, vdupq_n_u32(15)));
}

template <int shift>
inline neon::f32x8 code8(uint32x4_t lo, uint32x4_t hi) {
  return {code4<shift>(lo), code4<shift>(hi)};
}

// int4, MT activation rows (xf: Acts' float32 rows, gs: their group sums): row blocks
// [b0, b1), as int4_tile_avx2: lane i of a chunk's half holds feature i's 8 codes, k = 2t
// at bits 4t, k = 2t + 1 at bits 16 + 4t; each FMA adds code * x.
template <int MT, bool F32S, typename OutT, bool INV = false>
void int4_tile_neon(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes, int64_t ng,
                    int64_t G, const float* xf, int64_t ldx, const float* gs, OutT* out,
                    int64_t ldo, int64_t n) {
  using namespace neon;
  constexpr int A = MT == 1 || INV ? 2 : 1;  // accumulator chains per (row, half), as AVX2
  const int64_t chunks = G / 8;
  for (int64_t b = b0; b < b1; ++b) {
    const uint8_t* p = w + b * blk_bytes;
    f32x8 acc[MT][2];
    for (int m = 0; m < MT; ++m) acc[m][0] = acc[m][1] = zero8();
    for (int64_t g = 0; g < ng; ++g) {
      f32x8 s[2], o[2];
      if constexpr (F32S) {
        for (int h = 0; h < 2; ++h) {
          s[h] = load8(reinterpret_cast<const float*>(p) + 8 * h);
          o[h] = load8(reinterpret_cast<const float*>(p + 64) + 8 * h);
        }
        p += 128;
      } else {  // dword = offset bits << 16 | scale bits
        const uint32x4_t hi16 = vdupq_n_u32(0xFFFF0000u);
        for (int h = 0; h < 2; ++h) {
          uint32x4_t lo, hi;
          load_u32x8(p, h, lo, hi);
          s[h] = {vreinterpretq_f32_u32(vshlq_n_u32(lo, 16)),
                  vreinterpretq_f32_u32(vshlq_n_u32(hi, 16))};
          o[h] = {vreinterpretq_f32_u32(vandq_u32(lo, hi16)),
                  vreinterpretq_f32_u32(vandq_u32(hi, hi16))};
        }
        p += 64;
      }
      f32x8 d[MT][2][A];
      for (int m = 0; m < MT; ++m)
        for (int h = 0; h < 2; ++h)
          for (int a = 0; a < A; ++a) d[m][h][a] = zero8();
      const float* xg = xf + g * G;
      for (int64_t c = 0; c < chunks; ++c, p += 64) {
        uint32x4_t src[2][2];  // [half][lanes 0..3, 4..7]
        for (int h = 0; h < 2; ++h) load_u32x8(p, h, src[h][0], src[h][1]);
        const float* xc = xg + c * 8;
        // k = 2t + par at bit 16 par + 4t; the shift must be a constant
        auto step = [&](auto shift_, int kk, int aa) {
          constexpr int sh = decltype(shift_)::value;
          const f32x8 w0 = code8<sh>(src[0][0], src[0][1]);
          const f32x8 w1 = code8<sh>(src[1][0], src[1][1]);
#pragma GCC unroll 4
          for (int m = 0; m < MT; ++m) {
            const f32x8 xv = set8(xc[m * ldx + kk]);
            d[m][0][aa] = fma8(w0, xv, d[m][0][aa]);
            d[m][1][aa] = fma8(w1, xv, d[m][1][aa]);
          }
        };
        using std::integral_constant;
        step(integral_constant<int, 0>{}, 0, 0);
        step(integral_constant<int, 16>{}, 1, A - 1);
        step(integral_constant<int, 4>{}, 2, 0);
        step(integral_constant<int, 20>{}, 3, A - 1);
        step(integral_constant<int, 8>{}, 4, 0);
        step(integral_constant<int, 24>{}, 5, A - 1);
        step(integral_constant<int, 12>{}, 6, 0);
        step(integral_constant<int, 28>{}, 7, A - 1);
      }
      for (int m = 0; m < MT; ++m)
        for (int h = 0; h < 2; ++h) {
          f32x8 dm = d[m][h][0];
          for (int a = 1; a < A; ++a) dm = add8(dm, d[m][h][a]);
          acc[m][h] = fma8(s[h], dm, acc[m][h]);
          acc[m][h] = fma8(o[h], set8(gs[m * ng + g]), acc[m][h]);
        }
    }
    const int64_t n0 = b * kBlock;
    for (int m = 0; m < MT; ++m)
      for (int h = 0; h < 2; ++h)
        if (n0 + 8 * h < n) store_out8(out + m * ldo + n0 + 8 * h, acc[m][h], n - n0 - 8 * h);
  }
}

// int8, MT float32 activation rows: row blocks [b0, b1). A chunk's first 32 bytes hold
// (k = 4c, 4c + 1) for features 0..15 as pairs, the next 32 bytes (4c + 2, 4c + 3); 8
// bytes widened to float32 are 4 features' (k even, k odd) pairs, multiplied by the pair
// of x, and each feature's two lanes are added at the end (vpaddq).
template <int MT, typename OutT>
void int8_tile_neon(const int8_t* w, int64_t b0, int64_t b1, int64_t nchunks, const float* xf,
                    int64_t ldx, OutT* out, int64_t ldo, int64_t n) {
  using namespace neon;
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* hdr = w + b * (1 + nchunks) * 64;  // 16 float32 scales
    const int8_t* p = hdr + 64;
    f32x8 q[MT][4];  // [row][features 4j .. 4j + 3 as (k even, k odd) pairs]
    for (int m = 0; m < MT; ++m)
      for (int j = 0; j < 4; ++j) q[m][j] = zero8();
    for (int64_t c = 0; c < nchunks; ++c, p += 64) {
#pragma GCC unroll 2
      for (int half = 0; half < 2; ++half) {
        f32x8 wf[4];
        for (int j = 0; j < 4; ++j) {
          const int16x8_t v = vmovl_s8(vld1_s8(p + 32 * half + 8 * j));
          wf[j] = {vcvtq_f32_s32(vmovl_s16(vget_low_s16(v))),
                   vcvtq_f32_s32(vmovl_s16(vget_high_s16(v)))};
        }
#pragma GCC unroll 4
        for (int m = 0; m < MT; ++m) {
          const float* xp = xf + m * ldx + 4 * c + 2 * half;
          const float32x4_t x2 = vcombine_f32(vld1_f32(xp), vld1_f32(xp));
          const f32x8 xv = {x2, x2};
          for (int j = 0; j < 4; ++j) q[m][j] = fma8(wf[j], xv, q[m][j]);
        }
      }
    }
    const int64_t n0 = b * kBlock;
    const float* sc = reinterpret_cast<const float*>(hdr);
    for (int m = 0; m < MT; ++m)
      for (int h = 0; h < 2; ++h) {
        const f32x8 y = {vpaddq_f32(q[m][2 * h].lo, q[m][2 * h].hi),
                         vpaddq_f32(q[m][2 * h + 1].lo, q[m][2 * h + 1].hi)};
        if (n0 + 8 * h < n)
          store_out8(out + m * ldo + n0 + 8 * h, mul8(y, load8(sc + 8 * h)), n - n0 - 8 * h);
      }
  }
}

#endif  // HOUCHU_NEON

// Byte and shift of code (feature i in its block, k % 8 = kk) inside a 64-byte chunk:
// 16-bit word 2i + (kk & 1) holds k pairs t = kk / 2 = 0..3 in bits 4t..4t+3.
inline int64_t int4_byte(int64_t i, int64_t kk) { return 4 * i + 2 * (kk & 1) + ((kk >> 1) >> 1); }
inline int int4_shift(int64_t kk) { return 4 * ((kk >> 1) & 1); }

template <typename OutT>
void int4_scalar(const uint8_t* w, int64_t b0, int64_t b1, int64_t ng, int64_t G, int64_t H,
                 const Acts& xa, int64_t m, OutT* out, int64_t n) {
  const int64_t gbytes = H + 8 * G, k = ng * G;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t i = 0; i < kBlock && b * kBlock + i < n; ++i)
      for (int64_t r = 0; r < m; ++r) {
        const float* x = xa.xf + r * k;
        float acc = 0.f;
        for (int64_t g = 0; g < ng; ++g) {
          const uint8_t* h = w + (b * ng + g) * gbytes;
          float s, o;
          if (H == 128) {
            std::memcpy(&s, h + 4 * i, 4);
            std::memcpy(&o, h + 64 + 4 * i, 4);
          } else {
            uint32_t d;
            std::memcpy(&d, h + 4 * i, 4);
            s = bits_bf16(static_cast<uint16_t>(d & 0xFFFF));
            o = bits_bf16(static_cast<uint16_t>(d >> 16));
          }
          float dq = 0.f, xs = 0.f;
          for (int64_t kk = 0; kk < G; ++kk) {
            const uint8_t byte = h[H + 64 * (kk / 8) + int4_byte(i, kk % 8)];
            const float xv = x[g * G + kk];
            dq += xv * static_cast<float>((byte >> int4_shift(kk % 8)) & 15);
            xs += xv;
          }
          acc += s * dq + o * xs;
        }
        out[r * n + b * kBlock + i] = static_cast<OutT>(acc);
      }
}

template <typename OutT>
void int8_scalar(const int8_t* w, int64_t b0, int64_t b1, int64_t nc, const Acts& xa, int64_t m,
                 OutT* out, int64_t n) {
  const int64_t k = xa.k;
  for (int64_t b = b0; b < b1; ++b)
    for (int64_t i = 0; i < kBlock && b * kBlock + i < n; ++i) {
      const int8_t* blk = w + b * (1 + nc) * 64;
      float scale;
      std::memcpy(&scale, blk + 4 * i, 4);
      for (int64_t r = 0; r < m; ++r) {
        const float* x = xa.xf + r * k;
        float acc = 0.f;
        for (int64_t kk = 0; kk < k; ++kk)
          acc += x[kk] *
                 static_cast<float>(blk[64 * (1 + kk / 4) + 32 * ((kk % 4) / 2) + 2 * i + kk % 2]);
        out[r * n + b * kBlock + i] = static_cast<OutT>(acc * scale);
      }
    }
}

// A packed weight as the kernels read it: int4_pack's uint8 blob [ceil(N/16), K/G, H + 8G]
// or int8_pack's int8 blob [ceil(N/16), 1 + ceil(K/4), 64]. Checked once (`of`), then
// `run_blocks` computes any range of its 16-feature blocks on the calling thread.
struct PackedLinear {
  bool int4 = true;
  const uint8_t* w = nullptr;
  int64_t nb = 0, n = 0;     // blocks of 16 output features; output features
  int64_t kpad = 0;          // activation row length the layout holds (int8: 4-aligned)
  int64_t G = 0, ng = 0;     // int4: group size and groups per row
  int64_t H = 0;             // int4: header bytes per group (64 bfloat16, 128 float32)
  int64_t nc = 0;            // int8: 4-column chunks per row
  int64_t blk_bytes = 0;     // bytes per block
  bool a8 = false;           // int4: its inputs are quantized to int8 (gemv_a8.h)
  // int4, float activations: batch-invariant sums (a row's output bit for bit the same
  // whatever the other rows of the call; the tiles' INV chain counts)
  bool invariant = false;

  // Whether x's width k fits this layout.
  bool fits(int64_t k) const { return int4 ? k == kpad : k > kpad - 4 && k <= kpad; }

  // Raises c10::Error (a RuntimeError in Python) naming `who` on a malformed blob.
  static PackedLinear of(const at::Tensor& blob, int64_t group_size, int64_t out_features,
                         const char* who) {
    PackedLinear p;
    TORCH_CHECK(blob.dim() == 3 && blob.is_contiguous() &&
                    (blob.scalar_type() == at::kByte || blob.scalar_type() == at::kChar),
                who, ": packed must be int4_pack's contiguous uint8 [N/16, K/G, H + 8G] or ",
                "int8_pack's contiguous int8 [N/16, 1 + K/4, 64] blob");
    p.int4 = blob.scalar_type() == at::kByte;
    p.w = reinterpret_cast<const uint8_t*>(blob.data_ptr());
    p.nb = blob.size(0);
    p.n = out_features;
    if (p.int4) {
      p.G = group_size;
      TORCH_CHECK(p.G > 0 && p.G % 8 == 0, who,
                  ": group_size must be a positive multiple of 8, got ", p.G);
      p.ng = blob.size(1);
      p.H = blob.size(2) - 8 * p.G;
      TORCH_CHECK(p.H == 64 || p.H == 128, who, ": packed has ", blob.size(2),
                  " bytes per group, not 64 or 128 + 8 * group_size (", p.G,
                  "): wrong group_size?");
      p.kpad = p.ng * p.G;
      p.blk_bytes = p.ng * blob.size(2);
    } else {
      TORCH_CHECK(blob.size(1) >= 2 && blob.size(2) == 64, who,
                  ": packed must be int8_pack's contiguous int8 [N/16, 1 + K/4, 64]");
      p.nc = blob.size(1) - 1;
      p.kpad = p.nc * 4;
      p.blk_bytes = (1 + p.nc) * 64;
    }
    TORCH_CHECK(p.n > (p.nb - 1) * kBlock && p.n <= p.nb * kBlock, who, ": out_features ", p.n,
                " does not match the packed weight's ", p.nb, " blocks of 16 features");
    return p;
  }
};

// Calls f(std::bool_constant<a>, std::bool_constant<b>) for runtime flags a and b.
template <typename F>
void with_flags(bool a, bool b, F&& f) {
  using T = std::true_type;
  using U = std::false_type;
  if (a)
    b ? f(T{}, T{}) : f(T{}, U{});
  else
    b ? f(U{}, T{}) : f(U{}, U{});
}

// out[r, 16 b0 .. 16 b1) = x[r] @ W[16 b0 .. 16 b1).T for the m rows of xa (built with
// kpad = p.kpad and, for int4, group = p.G); out is [m, p.n] row-major.
template <typename OutT>
void run_blocks(const PackedLinear& p, const Acts& xa, int64_t m, OutT* out, int64_t b0,
                int64_t b1) {
  if (b0 >= b1) return;
  const int64_t n = p.n;
#ifdef HOUCHU_A16_X86
  if (xa.a16) {  // int8 weights, int16 activations (gemv_a16.h)
    int8_rows_a16(reinterpret_cast<const int8_t*>(p.w), b0, b1, p.nc, xa.x16, xa.ld, xa.xs,
                  a16_blocks(xa.ld), m, out, n);
    return;
  }
#endif
  if (xa.a8) {
#ifdef HOUCHU_A8_X86
    if (m >= kGemmA8MinRows) {  // the same results, tiled for many rows (gemm_a8.h)
      if (p.H == 128)
        int4_gemm_a8<true>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xa.xq, xa.ld, xa.xs, xa.gsum, m,
                           out, n, n);
      else
        int4_gemm_a8<false>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xa.xq, xa.ld, xa.xs, xa.gsum, m,
                            out, n, n);
      return;
    }
#endif
    for (int64_t r0 = 0; r0 < m; r0 += kMaxTileA8) {
      const int64_t mt = std::min(kMaxTileA8, m - r0);
      const int8_t* xq = xa.xq + r0 * xa.ld;
      const float* xs = xa.xs + r0 * (xa.ld / a8_block(p.G));
      const float* gs = xa.gsum + r0 * p.ng;
      OutT* o = out + r0 * n;
#ifdef HOUCHU_A8_ZMM  // the same results in 512-bit registers (gemv_a8_zmm.h)
      with_rows4(mt, [&](auto MT_) {
        constexpr int MT = decltype(MT_)::value;
        if (p.H == 128)
          int4_tile_a8_zmm<MT, true>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xq, xa.ld, xs, gs, o,
                                     n, n);
        else
          int4_tile_a8_zmm<MT, false>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xq, xa.ld, xs, gs, o,
                                      n, n);
      });
#elif defined(HOUCHU_A8_X86)
      with_rows4(mt, [&](auto MT_) {
        constexpr int MT = decltype(MT_)::value;
        if (p.H == 128)
          int4_tile_a8<MT, true>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xq, xa.ld, xs, gs, o, n, n);
        else
          int4_tile_a8<MT, false>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xq, xa.ld, xs, gs, o, n, n);
      });
#elif defined(HOUCHU_A8_NEON)
      with_rows4(mt, [&](auto MT_) {
        constexpr int MT = decltype(MT_)::value;
        if (p.H == 128)
          int4_tile_a8_neon<MT, true>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xq, xa.ld, xs, gs, o,
                                      n, n);
        else
          int4_tile_a8_neon<MT, false>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xq, xa.ld, xs, gs, o,
                                       n, n);
      });
#else
      int4_scalar_a8(p.w, b0, b1, p.ng, p.G, p.H, xq, xa.ld, xs, gs, mt, o, n);
#endif
    }
    return;
  }
#ifdef HOUCHU_AVX512
  for_tiles(m, xa.R, [&](int64_t r0, int64_t len) {
    const int64_t mt = len * xa.R;
    const uint16_t* xb = xa.bits + r0 * xa.R * xa.ld;
    OutT* o = out + r0 * n;
    with_mt(mt, [&](auto MT_) {
      constexpr int MT = decltype(MT_)::value;
      if (p.int4) {
        const float* gs = xa.gsum + r0 * xa.R * p.ng;
        with_flags(p.H == 128, p.invariant, [&](auto f32s_, auto inv_) {
          constexpr bool F32S = decltype(f32s_)::value, INV = decltype(inv_)::value;
          if constexpr (MT % 3 == 0) {
            if (xa.R == 3) {
              int4_tile<MT, 3, F32S, OutT, INV>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xb, xa.ld, gs,
                                                 o, n, n);
              return;
            }
          }
          int4_tile<MT, 1, F32S, OutT, INV>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xb, xa.ld, gs, o,
                                             n, n);
        });
      }  // int8 weights took the a16 path above
    });
  });
#elif defined(HOUCHU_AVX2)
  for (int64_t r0 = 0; r0 < m; r0 += kMaxTile2) {
    const int64_t mt = std::min(kMaxTile2, m - r0);
    const float* xs = xa.xf + r0 * xa.ld;
    OutT* o = out + r0 * n;
    with_rows4(mt, [&](auto MT_) {
      constexpr int MT = decltype(MT_)::value;
      if (p.int4) {
        const float* gs = xa.gsum + r0 * p.ng;
        with_flags(p.H == 128, p.invariant, [&](auto f32s_, auto inv_) {
          constexpr bool F32S = decltype(f32s_)::value, INV = decltype(inv_)::value;
          int4_tile_avx2<MT, F32S, OutT, INV>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xs, xa.ld, gs,
                                              o, n, n);
        });
      }  // int8 weights took the a16 path above
    });
  }
#elif defined(HOUCHU_NEON)
  for (int64_t r0 = 0; r0 < m; r0 += kMaxTileNeon) {
    const int64_t mt = std::min(kMaxTileNeon, m - r0);
    const float* xf = xa.xf + r0 * xa.ld;
    OutT* o = out + r0 * n;
    with_rows4(mt, [&](auto MT_) {
      constexpr int MT = decltype(MT_)::value;
      if (p.int4) {
        const float* gs = xa.gsum + r0 * p.ng;
        with_flags(p.H == 128, p.invariant, [&](auto f32s_, auto inv_) {
          constexpr bool F32S = decltype(f32s_)::value, INV = decltype(inv_)::value;
          int4_tile_neon<MT, F32S, OutT, INV>(p.w, b0, b1, p.blk_bytes, p.ng, p.G, xf, xa.ld, gs,
                                              o, n, n);
        });
      } else {
        int8_tile_neon<MT>(reinterpret_cast<const int8_t*>(p.w), b0, b1, p.nc, xf, xa.ld, o, n, n);
      }
    });
  }
#else
  if (p.int4)
    int4_scalar(p.w, b0, b1, p.ng, p.G, p.H, xa, m, out, n);
  else
    int8_scalar(reinterpret_cast<const int8_t*>(p.w), b0, b1, p.nc, xa, m, out, n);
#endif
}

}  // namespace gemv
}  // namespace houchu_cpu
