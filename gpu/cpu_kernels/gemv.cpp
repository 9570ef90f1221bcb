// Weight-only int4 / int8 GEMV for the CPU (decode: M = 1..8 activation rows), with
// exact activations: x is used as it is (bfloat16 exactly; float32 split into three
// bfloat16 terms hi + mid + lo that sum to it exactly), products are exact and sums are
// float32, so results equal x.float() @ w.float().T up to float32 summation order, where
// w is the dense weight built in float32 from the stored codes, scales and offsets.
//
// Operators (torch.ops.houchu_cpu.*):
//   int4_pack(q, scale, offset, group_size) -> packed     once, at model load
//   int4_gemv(x, packed, group_size, out_features) -> y
//   int8_pack(q, scale) -> packed                         once, at model load
//   int8_gemv(x, packed, out_features) -> y
// Each packed weight is one tensor (a Tensor[] argument costs ~0.5 us more per call).
//
// Both weight layouts group output features in blocks of 16 (one AVX-512 lane per
// feature) and are contiguous per block, so each thread streams one contiguous range.
// The inner product uses vdpbf16ps (AVX512_BF16: 16 lanes x 2 products per instruction,
// exact products, float32 accumulation): an int4 code or an int8 value is exact in
// bfloat16. int4 codes become bfloat16 with one vpermw table lookup per 32 codes;
// per group g, sum_k x_k (q_k s + o) = s * sum_k x_k q_k + o * sum_k x_k, with sum_k x_k
// computed once per call. Without AVX512_BF16 the dot product is emulated with two FMAs;
// without AVX-512 a scalar path decodes the same layouts.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

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

// The activations as bfloat16 rows: x bfloat16 -> the same values, R = 1 row each;
// x float32 -> R = 3 rows each (hi, mid, lo; hi + mid + lo == x exactly unless a term
// falls into the denormal range). Also the per-group sums of every row. The buffers are
// the calling thread's, reused from call to call (a heap allocation costs more than a
// small GEMV's arithmetic); kernels only read them.
struct Acts {
  int64_t rows = 0, R = 1, k = 0, ld = 0;  // rows = M * R, ld = row stride of bits
  const uint16_t* bits = nullptr;          // [rows, ld] bfloat16 bit patterns, zero past k
  const float* xf = nullptr;               // [M, k] x as float32 (scalar path only)
  const float* gsum = nullptr;             // [rows, ngroups] sum of each group's values

  Acts(const at::Tensor& x, int64_t kpad, int64_t group) {
    thread_local std::vector<uint16_t> bits_buf;
    thread_local std::vector<float> float_buf;
    const int64_t m = x.size(0);
    k = x.size(1);
    ld = kpad;
    R = x.scalar_type() == at::kFloat ? 3 : 1;
    rows = m * R;
    const int64_t ng = group > 0 ? kpad / group : 0;
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
    const int64_t s0 = x.stride(0), s1 = x.stride(1);
    for (int64_t i = 0; i < m; ++i) {
      uint16_t* row = b + i * R * ld;
      if (x.scalar_type() == at::kBFloat16) {
        const c10::BFloat16* p = x.data_ptr<c10::BFloat16>() + i * s0;
        if (s1 == 1)
          std::memcpy(row, p, 2 * k);
        else
          for (int64_t j = 0; j < k; ++j) row[j] = bf16_bits(p[j * s1]);
      } else {
        const float* p = x.data_ptr<float>() + i * s0;
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
        for (int64_t j = 0; j < k; ++j)
          f[i * k + j] = x.scalar_type() == at::kBFloat16
                             ? static_cast<float>(x.data_ptr<c10::BFloat16>()[i * s0 + j * s1])
                             : x.data_ptr<float>()[i * s0 + j * s1];
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
  }
};

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

// int4: row blocks [b0, b1) for MT bfloat16 rows (R of them per output row).
template <int MT, int R, bool F32S, typename OutT>
void int4_tile(const uint8_t* w, int64_t b0, int64_t b1, int64_t blk_bytes, int64_t ng,
               int64_t G, const uint16_t* xb, int64_t ldx, const float* gs, OutT* out,
               int64_t ldo, int64_t n) {
  constexpr int A = chains_for(MT);
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

// int8: row blocks [b0, b1); after a block's scales, chunk c holds k = 4c..4c+3.
template <int MT, int R, typename OutT>
void int8_tile(const int8_t* w, int64_t b0, int64_t b1, int64_t nchunks, const uint16_t* xb,
               int64_t ldx, OutT* out, int64_t ldo, int64_t n) {
  constexpr int A = MT == 1 ? 4 : (MT <= 2 ? 2 : 1);  // chunks in flight (2 chains each)
  for (int64_t b = b0; b < b1; ++b) {
    const int8_t* hdr = w + b * (1 + nchunks) * 64;  // 16 float32 scales
    const int8_t* p = hdr + 64;
    __m512 d[MT][2 * A];
    for (int m = 0; m < MT; ++m)
      for (int a = 0; a < 2 * A; ++a) d[m][a] = _mm512_setzero_ps();
    auto chunk = [&](int64_t c, auto slot_) {
      constexpr int slot = decltype(slot_)::value;
      const int8_t* q = p + c * 64;
      __m512 f[4];
      for (int j = 0; j < 4; ++j)
        f[j] = _mm512_cvtepi32_ps(
            _mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(q + 16 * j))));
      __m512i wt[2];
#ifdef __AVX512BF16__
      wt[0] = (__m512i)_mm512_cvtne2ps_pbh(f[1], f[0]);
      wt[1] = (__m512i)_mm512_cvtne2ps_pbh(f[3], f[2]);
#else  // int8 values are exact in bfloat16: keep the high halves of the float32 lanes
      const __m512i sel = _mm512_set_epi16(63, 61, 59, 57, 55, 53, 51, 49, 47, 45, 43, 41, 39,
                                           37, 35, 33, 31, 29, 27, 25, 23, 21, 19, 17, 15, 13,
                                           11, 9, 7, 5, 3, 1);
      wt[0] = _mm512_permutex2var_epi16(_mm512_castps_si512(f[0]), sel, _mm512_castps_si512(f[1]));
      wt[1] = _mm512_permutex2var_epi16(_mm512_castps_si512(f[2]), sel, _mm512_castps_si512(f[3]));
#endif
      const uint16_t* xc = xb + c * 4;
#pragma GCC unroll 2
      for (int t = 0; t < 2; ++t)
#pragma GCC unroll 8
        for (int m = 0; m < MT; ++m)
          d[m][slot * 2 + t] = dp_bf16(d[m][slot * 2 + t], wt[t], bcast_pair(xc + m * ldx + 2 * t));
    };
    int64_t c = 0;
    for (; c + A <= nchunks; c += A) {
      chunk(c, std::integral_constant<int, 0>{});
      if constexpr (A > 1) chunk(c + 1, std::integral_constant<int, 1 % A>{});
      if constexpr (A > 2) chunk(c + 2, std::integral_constant<int, 2 % A>{});
      if constexpr (A > 3) chunk(c + 3, std::integral_constant<int, 3 % A>{});
    }
    for (; c < nchunks; ++c) chunk(c, std::integral_constant<int, 0>{});
    const int64_t n0 = b * kBlock;
    const __mmask16 mask =
        n - n0 >= kBlock ? static_cast<__mmask16>(0xFFFF) : static_cast<__mmask16>((1u << (n - n0)) - 1);
    const __m512 sc = _mm512_loadu_ps(reinterpret_cast<const float*>(hdr));
    for (int r = 0; r < MT / R; ++r) {
      __m512 y = _mm512_setzero_ps();
      for (int j = 0; j < R; ++j)
        for (int a = 0; a < 2 * A; ++a) y = _mm512_add_ps(y, d[r * R + j][a]);
      store_out(out + r * ldo + n0, _mm512_mul_ps(y, sc), mask);
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

// Calls f(OutT{}) with OutT = c10::BFloat16 or float, x's dtype (checked before).
template <typename F>
void with_out_type(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kBFloat16)
    f(c10::BFloat16{});
  else
    f(float{});
}

// ---- int4 -------------------------------------------------------------------------

// Byte and shift of code (feature i in its block, k % 8 = kk) inside a 64-byte chunk:
// 16-bit word 2i + (kk & 1) holds k pairs t = kk / 2 = 0..3 in bits 4t..4t+3.
inline int64_t int4_byte(int64_t i, int64_t kk) { return 4 * i + 2 * (kk & 1) + ((kk >> 1) >> 1); }
inline int int4_shift(int64_t kk) { return 4 * ((kk >> 1) & 1); }

// q: [N, K] uint8 codes 0..15; scale, offset: [N, K/G] bfloat16 or float32 (same dtype);
// group_size G: K % G == 0, G % 8 == 0 -> blob, uint8 [ceil(N/16), K/G, H + 8G]:
// per block of 16 features and per group, an H-byte header then G/8 chunks of 64 bytes.
//   header, bfloat16 scales (H = 64): dword i = offset[f] bits << 16 | scale[f] bits;
//   header, float32 scales (H = 128): 16 float32 scales, then 16 float32 offsets;
//   chunk c (k = g*G + 8c + kk, kk = 0..7): 16-bit word 2i + (kk & 1) holds, in bits
//   4t..4t+3 with t = kk / 2, the code of feature 16*block + i (little endian).
// Features past N (the last block's padding) have zero codes, scales and offsets.
at::Tensor int4_pack(const at::Tensor& q, const at::Tensor& scale,
                                  const at::Tensor& offset, int64_t group_size) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte,
              "int4_pack: q must be a [N, K] uint8 tensor of codes, got ", q.scalar_type(), " ",
              q.sizes());
  const int64_t n = q.size(0), k = q.size(1), G = group_size;
  TORCH_CHECK(n > 0 && k > 0, "int4_pack: empty weight ", q.sizes());
  TORCH_CHECK(G > 0 && G % 8 == 0 && k % G == 0, "int4_pack: group_size must be a positive ",
              "multiple of 8 dividing K = ", k, ", got ", G);
  const int64_t ng = k / G;
  TORCH_CHECK(scale.dim() == 2 && scale.size(0) == n && scale.size(1) == ng,
              "int4_pack: scale must be [N, K/G] = [", n, ", ", ng, "], got ", scale.sizes());
  TORCH_CHECK(offset.sizes() == scale.sizes(), "int4_pack: offset must be [N, K/G] = [", n,
              ", ", ng, "], got ", offset.sizes());
  TORCH_CHECK(scale.scalar_type() == offset.scalar_type() &&
                  (scale.scalar_type() == at::kBFloat16 || scale.scalar_type() == at::kFloat),
              "int4_pack: scale and offset must both be bfloat16 or both float32, got ",
              scale.scalar_type(), " and ", offset.scalar_type());
  TORCH_CHECK(q.max().item<uint8_t>() <= 15, "int4_pack: codes must be in 0..15");
  const bool f32 = scale.scalar_type() == at::kFloat;
  const int64_t H = f32 ? 128 : 64, gbytes = H + 8 * G, nb = (n + kBlock - 1) / kBlock;
  auto qc = q.contiguous();
  auto sc = scale.contiguous(), oc = offset.contiguous();
  auto blob = at::zeros({nb, ng, gbytes}, q.options());
  const uint8_t* qp = qc.data_ptr<uint8_t>();
  uint8_t* bp = blob.data_ptr<uint8_t>();
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = 0; i < kBlock && b * kBlock + i < n; ++i) {
        const int64_t f = b * kBlock + i;
        for (int64_t g = 0; g < ng; ++g) {
          uint8_t* h = bp + (b * ng + g) * gbytes;
          if (f32) {
            const float s = sc.data_ptr<float>()[f * ng + g], o = oc.data_ptr<float>()[f * ng + g];
            std::memcpy(h + 4 * i, &s, 4);
            std::memcpy(h + 64 + 4 * i, &o, 4);
          } else {
            const uint32_t d =
                static_cast<uint32_t>(bf16_bits(oc.data_ptr<c10::BFloat16>()[f * ng + g])) << 16 |
                bf16_bits(sc.data_ptr<c10::BFloat16>()[f * ng + g]);
            std::memcpy(h + 4 * i, &d, 4);
          }
          for (int64_t kk = 0; kk < G; ++kk) {
            const uint8_t code = qp[f * k + g * G + kk];
            h[H + 64 * (kk / 8) + int4_byte(i, kk % 8)] |=
                static_cast<uint8_t>(code << int4_shift(kk % 8));
          }
        }
      }
  });
  return blob;
}

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

// x: [M, K] bfloat16 or float32 (any strides); packed: int4_pack's blob;
// group_size: the G given to int4_pack; out_features: N -> [M, N] in x's dtype,
// y = x @ (q * scale + offset).T with float32 accumulation.
at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& blob, int64_t group_size,
                     int64_t out_features) {
  const int64_t G = group_size;
  TORCH_CHECK(blob.dim() == 3 && blob.scalar_type() == at::kByte && blob.is_contiguous(),
              "int4_gemv: packed must be int4_pack's contiguous uint8 [N/16, K/G, H + 8G]");
  TORCH_CHECK(G > 0 && G % 8 == 0, "int4_gemv: group_size must be a positive multiple of 8, got ",
              G);
  const int64_t nb = blob.size(0), ng = blob.size(1), H = blob.size(2) - 8 * G, k = ng * G;
  TORCH_CHECK(H == 64 || H == 128, "int4_gemv: packed has ", blob.size(2),
              " bytes per group, not 64 or 128 + 8 * group_size (", G,
              "): wrong group_size?");
  const int64_t n = out_features;
  TORCH_CHECK(n > (nb - 1) * kBlock && n <= nb * kBlock, "int4_gemv: out_features ", n,
              " does not match the packed weight's ", nb, " blocks of 16 features");
  TORCH_CHECK(x.dim() == 2 && x.size(1) == k, "int4_gemv: x must be [M, K] with K = ", k,
              ", got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "int4_gemv: x must be bfloat16 or float32, got ", x.scalar_type());
  const int64_t m = x.size(0);
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const Acts xa(x, k, G);
  const uint8_t* w = blob.data_ptr<uint8_t>();
  const int64_t blk_bytes = ng * blob.size(2);
  with_out_type(x, [&](auto out_t) {
    using scalar_t = decltype(out_t);
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, nb, grain_for(blk_bytes), [&](int64_t b0, int64_t b1) {
#ifdef HOUCHU_AVX512
      for_tiles(m, xa.R, [&](int64_t r0, int64_t len) {
        const int64_t mt = len * xa.R;
        const uint16_t* xb = xa.bits + r0 * xa.R * xa.ld;
        const float* gs = xa.gsum + r0 * xa.R * ng;
        with_mt(mt, [&](auto MT_) {
          constexpr int MT = decltype(MT_)::value;
          if constexpr (MT % 3 == 0) {
            if (xa.R == 3) {
              if (H == 128)
                int4_tile<MT, 3, true>(w, b0, b1, blk_bytes, ng, G, xb, xa.ld, gs, op + r0 * n,
                                       n, n);
              else
                int4_tile<MT, 3, false>(w, b0, b1, blk_bytes, ng, G, xb, xa.ld, gs, op + r0 * n,
                                        n, n);
              return;
            }
          }
          if (H == 128)
            int4_tile<MT, 1, true>(w, b0, b1, blk_bytes, ng, G, xb, xa.ld, gs, op + r0 * n, n, n);
          else
            int4_tile<MT, 1, false>(w, b0, b1, blk_bytes, ng, G, xb, xa.ld, gs, op + r0 * n, n,
                                    n);
        });
      });
#else
      int4_scalar(w, b0, b1, ng, G, H, xa, m, op, n);
#endif
    });
  });
  return out;
}

// ---- int8 -------------------------------------------------------------------------

// q: [N, K] int8; scale: [N] bfloat16 or float32 -> packed, int8
// [ceil(N/16), 1 + ceil(K/4), 64]: per block b of 16 features, a 64-byte header of 16
// float32 scales (zero past N), then chunks c = 0.. of 64 bytes holding, at byte
// 32t + 2i + h (t, h in 0..1, i in 0..15), q[16b + i, 4c + 2t + h] (zero past N and K).
at::Tensor int8_pack(const at::Tensor& q, const at::Tensor& scale) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar,
              "int8_pack: q must be a [N, K] int8 tensor, got ", q.scalar_type(), " ", q.sizes());
  const int64_t n = q.size(0), k = q.size(1);
  TORCH_CHECK(n > 0 && k > 0, "int8_pack: empty weight ", q.sizes());
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == n, "int8_pack: scale must be [N] = [", n,
              "], got ", scale.sizes());
  TORCH_CHECK(scale.scalar_type() == at::kBFloat16 || scale.scalar_type() == at::kFloat,
              "int8_pack: scale must be bfloat16 or float32, got ", scale.scalar_type());
  const int64_t nb = (n + kBlock - 1) / kBlock, nc = (k + 3) / 4;
  auto qc = q.contiguous();
  auto s32 = scale.to(at::kFloat).contiguous();
  auto blob = at::zeros({nb, 1 + nc, 64}, q.options());
  const int8_t* qp = qc.data_ptr<int8_t>();
  const float* sp = s32.data_ptr<float>();
  int8_t* bp = blob.data_ptr<int8_t>();
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = 0; i < kBlock && b * kBlock + i < n; ++i) {
        int8_t* blk = bp + b * (1 + nc) * 64;
        std::memcpy(blk + 4 * i, sp + b * kBlock + i, 4);
        for (int64_t kk = 0; kk < k; ++kk) {
          const int64_t c = kk / 4, t = (kk % 4) / 2, h = kk % 2;
          blk[64 * (1 + c) + 32 * t + 2 * i + h] = qp[(b * kBlock + i) * k + kk];
        }
      }
  });
  return blob;
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

// x: [M, K] bfloat16 or float32 (any strides); packed: int8_pack's blob; out_features:
// N -> [M, N] in x's dtype, y = (x @ q.T) * scale with float32 accumulation.
at::Tensor int8_gemv(const at::Tensor& x, const at::Tensor& blob, int64_t out_features) {
  TORCH_CHECK(blob.dim() == 3 && blob.size(1) >= 2 && blob.size(2) == 64 &&
                  blob.scalar_type() == at::kChar && blob.is_contiguous(),
              "int8_gemv: packed must be int8_pack's contiguous int8 [N/16, 1 + K/4, 64]");
  const int64_t nb = blob.size(0), nc = blob.size(1) - 1, n = out_features;
  TORCH_CHECK(n > (nb - 1) * kBlock && n <= nb * kBlock, "int8_gemv: out_features ", n,
              " does not match the packed weight's ", nb, " blocks of 16 features");
  TORCH_CHECK(x.dim() == 2 && x.size(1) > (nc - 1) * 4 && x.size(1) <= nc * 4,
              "int8_gemv: x must be [M, K] with K matching the packed weight's ", nc * 4,
              " (padded) columns, got ", x.sizes());
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat,
              "int8_gemv: x must be bfloat16 or float32, got ", x.scalar_type());
  const int64_t m = x.size(0);
  auto out = at::empty({m, n}, x.options());
  if (m == 0) return out;
  const Acts xa(x, nc * 4, 0);
  const int8_t* w = blob.data_ptr<int8_t>();
  with_out_type(x, [&](auto out_t) {
    using scalar_t = decltype(out_t);
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, nb, grain_for((1 + nc) * 64), [&](int64_t b0, int64_t b1) {
#ifdef HOUCHU_AVX512
      for_tiles(m, xa.R, [&](int64_t r0, int64_t len) {
        const int64_t mt = len * xa.R;
        const uint16_t* xb = xa.bits + r0 * xa.R * xa.ld;
        with_mt(mt, [&](auto MT_) {
          constexpr int MT = decltype(MT_)::value;
          if constexpr (MT % 3 == 0) {
            if (xa.R == 3) {
              int8_tile<MT, 3>(w, b0, b1, nc, xb, xa.ld, op + r0 * n, n, n);
              return;
            }
          }
          int8_tile<MT, 1>(w, b0, b1, nc, xb, xa.ld, op + r0 * n, n, n);
        });
      });
#else
      int8_scalar(w, b0, b1, nc, xa, m, op, n);
#endif
    });
  });
  return out;
}

}  // namespace gemv
}  // namespace houchu_cpu

TORCH_LIBRARY_FRAGMENT(houchu_cpu, m) {
  m.def("int4_pack(Tensor q, Tensor scale, Tensor offset, int group_size) -> Tensor");
  m.def("int4_gemv(Tensor x, Tensor packed, int group_size, int out_features) -> Tensor");
  m.def("int8_pack(Tensor q, Tensor scale) -> Tensor");
  m.def("int8_gemv(Tensor x, Tensor packed, int out_features) -> Tensor");
}

TORCH_LIBRARY_IMPL(houchu_cpu, CPU, m) {
  m.impl("int4_pack", &houchu_cpu::gemv::int4_pack);
  m.impl("int4_gemv", &houchu_cpu::gemv::int4_gemv);
  m.impl("int8_pack", &houchu_cpu::gemv::int8_pack);
  m.impl("int8_gemv", &houchu_cpu::gemv::int8_gemv);
}
