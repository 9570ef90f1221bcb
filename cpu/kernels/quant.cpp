// The float work around W8A8's int8 GEMM on the CPU, fused: per-column absmax (to pick
// LLM.int8()'s outlier features, Dettmers et al. 2022), dynamic per-token int8
// quantization that sets the outlier features aside, and the epilogue that scales the
// int32 products back and adds the outlier features' product with their int8 weight
// columns, computed in the same pass (AVX-512 or AVX2 tiles where the CPU has them).
//
// Numerics follow houchu.model.quant.functions.quantize_rows_int8 and W8A8Linear._int8_gemm:
// scale = max(absmax / 127, 1e-10), q = clamp(round_half_even(x / scale), -127, 127);
// y = (acc * x_scale + x[:, cols] · w_q[:, cols]^T) * w_scale.
#include "aten.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include "library.h"

#include "norm_rope.h"
#include "simd.h"
#include "vec.h"

#include <algorithm>
#include <cstring>
#include <cmath>
#include <tuple>
#include <type_traits>
#include <vector>

namespace houchu_cpu {

namespace {

// f(float{}) or f(c10::BFloat16{}) by t (callers have checked it is one of the two).
template <typename F>
void dispatch_acts(at::ScalarType t, F&& f) {
  if (t == at::kFloat) {
    f(float{});
  } else {
    f(c10::BFloat16{});
  }
}

void check_acts(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), name, ": x must be a contiguous [M, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name,
              ": float32 or bfloat16 only, got ", x.scalar_type());
}

// Per-thread partial maxima over row blocks, combined at the end (rows are contiguous;
// a thread walks whole rows, 16 columns at a time).
template <typename T>
void col_absmax_impl(const T* xp, int64_t m, int64_t k, float* o) {
  const int nt = std::max(1, std::min<int>(at::get_num_threads(), static_cast<int>(m)));
  std::vector<float> part(nt * k, 0.f);
  at::parallel_for(0, nt, 1, [&](int64_t t0, int64_t t1) {
    for (int64_t t = t0; t < t1; ++t) {
      float* acc = part.data() + t * k;
      for (int64_t r = t * m / nt; r < (t + 1) * m / nt; ++r) {
        const T* row = xp + r * k;
        int64_t c = 0;
#ifdef HOUCHU_AVX512
        for (; c + 16 <= k; c += 16)
          _mm512_storeu_ps(acc + c, _mm512_max_ps(_mm512_loadu_ps(acc + c),
                                                  _mm512_abs_ps(vec::load16(row + c))));
#endif
        for (; c < k; ++c) acc[c] = std::max(acc[c], std::abs(static_cast<float>(row[c])));
      }
    }
  });
  for (int64_t t = 0; t < nt; ++t)
    for (int64_t c = 0; c < k; ++c) o[c] = std::max(o[c], part[t * k + c]);
}

template <typename T>
void quantize_rows_impl(const T* xp, int64_t m, int64_t k, const uint8_t* mask,
                        const int64_t* cp, int64_t c, int8_t* qp, float* sp, T* op) {
#ifdef HOUCHU_AVX2
  std::vector<int32_t> keep8(k);  // per column: all ones where it is not an outlier
  for (int64_t i = 0; i < k; ++i) keep8[i] = mask[i] ? 0 : -1;
#endif
#ifdef HOUCHU_AVX512
  std::vector<__mmask16> keep((k + 15) / 16);  // per 16 columns: which are not outliers
  for (int64_t b = 0; b * 16 < k; ++b) {
    uint32_t bits = 0;
    for (int64_t i = b * 16; i < std::min(k, b * 16 + 16); ++i)
      bits |= static_cast<uint32_t>(!mask[i]) << (i - b * 16);
    keep[b] = static_cast<__mmask16>(bits);
  }
#endif
  at::parallel_for(0, m, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = xp + r * k;
      int8_t* qr = qp + r * k;
      float amax = 0.f;
      int64_t i = 0;
#ifdef HOUCHU_AVX512
      __m512 mx = _mm512_setzero_ps();
      for (; i + 16 <= k; i += 16)
        mx = _mm512_max_ps(mx, _mm512_maskz_mov_ps(keep[i / 16], _mm512_abs_ps(vec::load16(row + i))));
      amax = _mm512_reduce_max_ps(mx);
#elif defined(HOUCHU_AVX2)
      const __m256 sign = _mm256_set1_ps(-0.f);
      __m256 mx = _mm256_setzero_ps();
      for (; i + 8 <= k; i += 8) {
        const __m256 kv = _mm256_castsi256_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keep8.data() + i)));
        mx = _mm256_max_ps(mx, _mm256_and_ps(kv, _mm256_andnot_ps(sign, simd::load8(row + i))));
      }
      amax = simd::hmax8(mx);
#endif
      for (; i < k; ++i) amax = std::max(amax, mask[i] ? 0.f : std::abs(static_cast<float>(row[i])));
      const float s = std::max(amax / 127.f, 1e-10f);
      sp[r] = s;
      i = 0;
#ifdef HOUCHU_AVX512
      const __m512 sv = _mm512_set1_ps(s);
      const __m512i lo = _mm512_set1_epi32(-127), hi = _mm512_set1_epi32(127);
      for (; i + 16 <= k; i += 16) {  // x / s rounded half to even (MXCSR's default)
        const __m512 v = _mm512_maskz_div_ps(keep[i / 16], vec::load16(row + i), sv);
        const __m512i q = _mm512_min_epi32(_mm512_max_epi32(_mm512_cvtps_epi32(v), lo), hi);
        _mm_storeu_si128(reinterpret_cast<__m128i*>(qr + i), _mm512_cvtepi32_epi8(q));
      }
#elif defined(HOUCHU_AVX2)
      const __m256 sv = _mm256_set1_ps(s);
      const __m256i lo = _mm256_set1_epi32(-127), hi = _mm256_set1_epi32(127);
      for (; i + 8 <= k; i += 8) {  // as the AVX-512 loop: outliers 0, x / s rounded to even
        const __m256 kv = _mm256_castsi256_ps(
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(keep8.data() + i)));
        const __m256 v = _mm256_and_ps(kv, _mm256_div_ps(simd::load8(row + i), sv));
        const __m256i q = _mm256_min_epi32(_mm256_max_epi32(_mm256_cvtps_epi32(v), lo), hi);
        const __m128i q16 =
            _mm_packs_epi32(_mm256_castsi256_si128(q), _mm256_extracti128_si256(q, 1));
        _mm_storel_epi64(reinterpret_cast<__m128i*>(qr + i), _mm_packs_epi16(q16, q16));
      }
#endif
      for (; i < k; ++i) {
        const float v = mask[i] ? 0.f : static_cast<float>(row[i]) / s;
        qr[i] = static_cast<int8_t>(std::clamp(std::nearbyint(v), -127.f, 127.f));
      }
      for (int64_t j = 0; j < c; ++j) op[r * c + j] = row[cp[j]];
    }
  });
}

// The outlier features' weights, gathered from the int8 weight's columns: w: [N, K]
// int8 -> float32 [C][N], or for bfloat16 activations [ceil(C/2)][N][2] bfloat16 (pairs
// along C, vdpbf16ps's operand layout; an odd C's last pair padded with 0). int8 values
// are exact in both. Returns the calling thread's buffer (valid until its next call).
template <typename T>
const T* gather_outlier_weights(const int8_t* w, int64_t n, int64_t k, const int64_t* cp,
                               int64_t c) {
  constexpr int64_t pw = std::is_same_v<T, float> ? 1 : 2;  // elements per slot
  const int64_t slots = (c + pw - 1) / pw;
  // the calling thread's buffer, kept between calls: a fresh allocation of this size is
  // an mmap whose page faults cost as much as the gather
  thread_local std::vector<T> buffer;
  buffer.resize(std::max<size_t>(buffer.size(), slots * n * pw));
  T* out = buffer.data();  // (a lambda naming `buffer` would get each worker's own)
  at::parallel_for(0, n, 256, [&](int64_t n0, int64_t n1) {
    for (int64_t i = n0; i < n1; ++i) {
      const int8_t* wi = w + i * k;
      if constexpr (std::is_same_v<T, float>) {
        for (int64_t j = 0; j < c; ++j) out[j * n + i] = wi[cp[j]];
      } else {  // a pair as one 32-bit store; an int8's bfloat16 is its float's top half
        uint32_t* o32 = reinterpret_cast<uint32_t*>(out);
        for (int64_t s = 0; s < slots; ++s) {
          const float lo = wi[cp[2 * s]], hi = 2 * s + 1 < c ? wi[cp[2 * s + 1]] : 0.f;
          uint32_t lb, hb;
          std::memcpy(&lb, &lo, 4);
          std::memcpy(&hb, &hi, 4);
          o32[s * n + i] = (lb >> 16) | (hb & 0xFFFF0000u);
        }
      }
    }
  });
  return out;
}

#ifdef HOUCHU_AVX512
// NR rows x 64 columns from column i: out = (acc * xs + outliers · w_out) * ws. xrow: the
// NR rows' outliers, each padded to `slots` whole slots. NR x 4 independent accumulators
// keep the dot-product units busy (one chain per accumulator would wait on its latency).
template <typename T, int NR>
inline void epilogue_tile(const int32_t* a, const float* xs, const float* ws, const T* xrow,
                          const T* w_out, int64_t slots, int64_t n, int64_t i, T* o,
                          int64_t o_stride) {
  constexpr int64_t pw = std::is_same_v<T, float> ? 1 : 2;
  __m512 acc[NR][4];
  for (int r = 0; r < NR; ++r) {
    const __m512 sv = _mm512_set1_ps(xs[r]);
    for (int b = 0; b < 4; ++b)
      acc[r][b] = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(a + r * n + i + b * 16)), sv);
  }
  for (int64_t j = 0; j < slots; ++j) {
    const T* wj = w_out + (j * n + i) * pw;
    if constexpr (std::is_same_v<T, float>) {
      __m512 wv[4];
      for (int b = 0; b < 4; ++b) wv[b] = _mm512_loadu_ps(wj + b * 16);
      for (int r = 0; r < NR; ++r) {
        const __m512 xb = _mm512_set1_ps(xrow[r * slots + j]);
        for (int b = 0; b < 4; ++b) acc[r][b] = _mm512_fmadd_ps(xb, wv[b], acc[r][b]);
      }
    } else {
#ifdef __AVX512BF16__
      __m512i wv[4];
      for (int b = 0; b < 4; ++b) wv[b] = _mm512_loadu_si512(wj + b * 32);
      for (int r = 0; r < NR; ++r) {
        int32_t pair;
        std::memcpy(&pair, xrow + (r * slots + j) * 2, 4);
        const __m512bh xb = (__m512bh)_mm512_set1_epi32(pair);
        for (int b = 0; b < 4; ++b) acc[r][b] = _mm512_dpbf16_ps(acc[r][b], xb, (__m512bh)wv[b]);
      }
#endif
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < 4; ++b)
      vec::store16(o + r * o_stride + b * 16, _mm512_mul_ps(acc[r][b], _mm512_loadu_ps(ws + i + b * 16)));
}
#endif

#ifdef HOUCHU_AVX2
// epilogue_tile's AVX2 form: NR rows x 32 columns (4 x 8 lanes) from column i, the same
// arithmetic (one fma per outlier product; a bfloat16 pair's odd element first, as
// vdpbf16ps adds them), so every level gives epilogue_one's bits. Without it the avx2_vnni
// level, whose int8 GEMM runs (AVX-VNNI), spent 5.4 ms of a 6.1 ms 128 x 576 -> 1536
// W8A8 layer in the scalar epilogue.
template <typename T, int NR>
inline void epilogue_tile(const int32_t* a, const float* xs, const float* ws, const T* xrow,
                          const T* w_out, int64_t slots, int64_t n, int64_t i, T* o,
                          int64_t o_stride) {
  constexpr int64_t pw = std::is_same_v<T, float> ? 1 : 2;
  __m256 acc[NR][4];
  for (int r = 0; r < NR; ++r) {
    const __m256 sv = _mm256_set1_ps(xs[r]);
    for (int b = 0; b < 4; ++b) {
      const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(a + r * n + i + b * 8));
      acc[r][b] = _mm256_mul_ps(_mm256_cvtepi32_ps(v), sv);
    }
  }
  for (int64_t j = 0; j < slots; ++j) {
    const T* wj = w_out + (j * n + i) * pw;
    if constexpr (std::is_same_v<T, float>) {
      __m256 wv[4];
      for (int b = 0; b < 4; ++b) wv[b] = _mm256_loadu_ps(wj + b * 8);
      for (int r = 0; r < NR; ++r) {
        const __m256 xb = _mm256_set1_ps(xrow[r * slots + j]);
        for (int b = 0; b < 4; ++b) acc[r][b] = _mm256_fmadd_ps(xb, wv[b], acc[r][b]);
      }
    } else {  // 8 columns' (even, odd) pairs per 256 bits: a bfloat16 is a float's top half
      __m256 w0[4], w1[4];
      for (int b = 0; b < 4; ++b) {
        const __m256i p = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(wj + b * 16));
        w0[b] = _mm256_castsi256_ps(_mm256_slli_epi32(p, 16));
        w1[b] = _mm256_castsi256_ps(_mm256_and_si256(p, _mm256_set1_epi32(0xFFFF0000u)));
      }
      for (int r = 0; r < NR; ++r) {
        const T* xq = xrow + (r * slots + j) * 2;
        const __m256 x0 = _mm256_set1_ps(static_cast<float>(xq[0]));
        const __m256 x1 = _mm256_set1_ps(static_cast<float>(xq[1]));
        for (int b = 0; b < 4; ++b) {
          acc[r][b] = _mm256_fmadd_ps(x1, w1[b], acc[r][b]);
          acc[r][b] = _mm256_fmadd_ps(x0, w0[b], acc[r][b]);
        }
      }
    }
  }
  for (int r = 0; r < NR; ++r)
    for (int b = 0; b < 4; ++b)
      simd::store8(o + r * o_stride + b * 8, _mm256_mul_ps(acc[r][b], _mm256_loadu_ps(ws + i + b * 8)));
}
#endif

// One row's column i of (acc * xs + outliers · w_out) * ws, rounded to T (the portable
// path; xq: the row's padded outliers). Bit-equal to epilogue_tile: one rounding per
// product added (fma; a bfloat16 product is exact in float32), a pair's odd element
// first, as vdpbf16ps adds them.
template <typename T>
inline T epilogue_one(const int32_t* a, float xs, const float* ws, const T* xq,
                      const T* w_out, int64_t c, int64_t n, int64_t i) {
  float v = static_cast<float>(a[i]) * xs;
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t j = 0; j < c; ++j) v = std::fma(xq[j], w_out[j * n + i], v);
  } else {
    for (int64_t j = 0; j < (c + 1) / 2; ++j) {
      const T* w = w_out + (j * n + i) * 2;
      v = std::fma(static_cast<float>(xq[2 * j + 1]), static_cast<float>(w[1]), v);
      v = std::fma(static_cast<float>(xq[2 * j]), static_cast<float>(w[0]), v);
    }
  }
  return static_cast<T>(v * ws[i]);
}

// Rows [r0, r1) of out = (acc * xs + outliers · w_out) * ws, rounded to T; with silu_mul,
// out[:, j] = silu(y[:, j]) * y[:, j + N/2] instead: NR rows of the gate half, then of the
// up half (each pass walks the columns in order, as the prefetchers like), each rounded
// to T, then silu_mul_span over each whole row: the same values as the two ops one after
// the other. outliers: [M, C] in T; w_out: gather_outlier_weights's layout.
template <typename T>
void epilogue_rows(const int32_t* ap, const float* xs, const float* ws, const T* xo,
                   const T* w_out, int64_t c, int64_t n, bool silu_mul, int64_t r0, int64_t r1,
                   T* op) {
  constexpr int64_t pw = std::is_same_v<T, float> ? 1 : 2;
  constexpr int NR = 4;
  const int64_t slots = (c + pw - 1) / pw;
  const int64_t cols = silu_mul ? n / 2 : n;  // output columns
  std::vector<T> xrow(NR * slots * pw, T(0));  // NR rows' outliers, padded to whole slots
  std::vector<T> gate, up;                     // silu_mul: NR rows of each half
  if (silu_mul) {
    gate.resize(NR * cols);
    up.resize(NR * cols);
  }
  bool vectorized = false;
#ifdef HOUCHU_AVX512
  constexpr int64_t kTile = 64;  // columns per epilogue_tile
  vectorized = std::is_same_v<T, float>;
#ifdef __AVX512BF16__
  vectorized = true;
#endif
#elif defined(HOUCHU_AVX2)
  constexpr int64_t kTile = 32;
  vectorized = true;
#else
  constexpr int64_t kTile = 64;
#endif
  const int64_t c64 = vectorized ? cols / kTile * kTile : 0;  // the tiles' columns
  for (int64_t r = r0; r < r1; r += NR) {
    const int64_t nr = std::min<int64_t>(NR, r1 - r);
    for (int64_t q = 0; q < nr; ++q)
      std::copy(xo + (r + q) * c, xo + (r + q + 1) * c, xrow.begin() + q * slots * pw);
    // columns [from, from + cols) of y for rows r.. into dst (row stride cols)
    auto half = [&](int64_t from, T* dst) {
#if defined(HOUCHU_AVX512) || defined(HOUCHU_AVX2)
      for (int64_t i = 0; i < c64; i += kTile) {
        if (nr == NR) {
          epilogue_tile<T, NR>(ap + r * n, xs + r, ws, xrow.data(), w_out, slots, n, from + i,
                               dst + i, cols);
        } else {
          for (int64_t q = 0; q < nr; ++q)
            epilogue_tile<T, 1>(ap + (r + q) * n, xs + r + q, ws, xrow.data() + q * slots * pw,
                                w_out, slots, n, from + i, dst + q * cols + i, cols);
        }
      }
#endif
      for (int64_t q = 0; q < nr; ++q)
        for (int64_t i = c64; i < cols; ++i)
          dst[q * cols + i] = epilogue_one<T>(ap + (r + q) * n, xs[r + q], ws,
                                              xrow.data() + q * slots * pw, w_out, c, n, from + i);
    };
    if (!silu_mul) {
      half(0, op + r * cols);
      continue;
    }
    half(0, gate.data());
    half(cols, up.data());
    for (int64_t q = 0; q < nr; ++q)
      silu_mul_span<T>(gate.data() + q * cols, up.data() + q * cols, op + (r + q) * cols, 0, cols);
  }
}

}  // namespace

// x: [M, K] float32/bfloat16 -> [K] float32: max over rows of |x|.
at::Tensor col_absmax(const at::Tensor& x) {
  check_acts(x, "col_absmax");
  const int64_t m = x.size(0), k = x.size(1);
  auto out = at::zeros({k}, x.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  dispatch_acts(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    col_absmax_impl<scalar_t>(x.data_ptr<scalar_t>(), m, k, o);
  });
  return out;
}

// x: [M, K] float32/bfloat16; cols: [C] int64 distinct feature indices (the outliers)
// -> (q [M, K] int8 with the outlier columns 0, scale [M, 1] float32 over the other
// columns, outliers [M, C] = x[:, cols] in x's dtype).
std::tuple<at::Tensor, at::Tensor, at::Tensor> quantize_rows_int8(const at::Tensor& x,
                                                                  const at::Tensor& cols) {
  check_acts(x, "quantize_rows_int8");
  TORCH_CHECK(cols.dim() == 1 && cols.scalar_type() == at::kLong && cols.is_contiguous(),
              "quantize_rows_int8: cols must be a contiguous [C] int64");
  const int64_t m = x.size(0), k = x.size(1), c = cols.size(0);
  const int64_t* cp = cols.data_ptr<int64_t>();
  std::vector<uint8_t> is_outlier(k, 0);
  for (int64_t j = 0; j < c; ++j) {
    TORCH_CHECK(cp[j] >= 0 && cp[j] < k, "quantize_rows_int8: column ", cp[j], " outside [0, ",
                k, ")");
    is_outlier[cp[j]] = 1;
  }
  auto q = at::empty({m, k}, x.options().dtype(at::kChar));
  auto scale = at::empty({m, 1}, x.options().dtype(at::kFloat));
  auto outl = at::empty({m, c}, x.options());
  int8_t* qp = q.data_ptr<int8_t>();
  float* sp = scale.data_ptr<float>();
  const uint8_t* mask = is_outlier.data();
  dispatch_acts(x.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    quantize_rows_impl<scalar_t>(x.data_ptr<scalar_t>(), m, k, mask, cp, c, qp, sp,
                                 outl.data_ptr<scalar_t>());
  });
  return {q, scale, outl};
}

// acc: [M, N] int32 (x_q @ w_q^T, the outlier features zero in x_q); x_scale: [M, 1]
// float32; w_scale: [N] float32; outliers: [M, C] (x[:, cols], in x's dtype: float32 or
// bfloat16); w: [N, K] int8 (the weight); cols: [C] int64 (the outlier features)
// -> [M, N] in outliers' dtype: y = (acc * x_scale + outliers · w[:, cols]^T) * w_scale;
// with silu_mul (N even: the gate and up projections side by side), [M, N/2]:
// silu(y[:, :N/2]) * y[:, N/2:], each half rounded to the dtype first.
// The outliers' products are exact (int8 weights are exact in bfloat16; vdpbf16ps sums
// in float32), computed beside the int32 tile instead of as a separate float GEMM.
at::Tensor int8_epilogue(const at::Tensor& acc, const at::Tensor& x_scale,
                         const at::Tensor& w_scale, const at::Tensor& outliers,
                         const at::Tensor& w, const at::Tensor& cols, bool silu_mul) {
  TORCH_CHECK(acc.dim() == 2 && acc.is_contiguous() && acc.scalar_type() == at::kInt,
              "int8_epilogue: acc must be a contiguous [M, N] int32");
  const int64_t m = acc.size(0), n = acc.size(1);
  TORCH_CHECK(x_scale.numel() == m && x_scale.scalar_type() == at::kFloat &&
                  x_scale.is_contiguous(),
              "int8_epilogue: x_scale must be [M, 1] float32");
  TORCH_CHECK(w_scale.numel() == n && w_scale.scalar_type() == at::kFloat &&
                  w_scale.is_contiguous(),
              "int8_epilogue: w_scale must be [N] float32");
  TORCH_CHECK(w.dim() == 2 && w.size(0) == n && w.is_contiguous() && w.scalar_type() == at::kChar,
              "int8_epilogue: w must be the contiguous [N, K] int8 weight");
  const int64_t k = w.size(1);
  TORCH_CHECK(cols.dim() == 1 && cols.scalar_type() == at::kLong && cols.is_contiguous(),
              "int8_epilogue: cols must be a contiguous [C] int64");
  const int64_t c = cols.size(0);
  TORCH_CHECK(outliers.dim() == 2 && outliers.size(0) == m && outliers.size(1) == c &&
                  outliers.is_contiguous(),
              "int8_epilogue: outliers must be a contiguous [M, C] (C = len(cols))");
  TORCH_CHECK(outliers.scalar_type() == at::kFloat || outliers.scalar_type() == at::kBFloat16,
              "int8_epilogue: float32 or bfloat16 outliers only");
  const int64_t* cp = cols.data_ptr<int64_t>();
  for (int64_t j = 0; j < c; ++j)
    TORCH_CHECK(cp[j] >= 0 && cp[j] < k, "int8_epilogue: column ", cp[j], " outside [0, ", k, ")");
  TORCH_CHECK(!silu_mul || n % 2 == 0, "int8_epilogue: silu_mul needs an even N, got ", n);
  auto out = at::empty({m, silu_mul ? n / 2 : n}, acc.options().dtype(outliers.scalar_type()));
  const int32_t* ap = acc.data_ptr<int32_t>();
  const float* xs = x_scale.data_ptr<float>();
  const float* ws = w_scale.data_ptr<float>();
  dispatch_acts(outliers.scalar_type(), [&](auto tag) {
    using scalar_t = decltype(tag);
    const scalar_t* w_out = gather_outlier_weights<scalar_t>(w.data_ptr<int8_t>(), n, k, cp, c);
    const scalar_t* xo = outliers.data_ptr<scalar_t>();
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, m, 4, [&](int64_t r0, int64_t r1) {
      epilogue_rows<scalar_t>(ap, xs, ws, xo, w_out, c, n, silu_mul, r0, r1, op);
    });
  });
  return out;
}

}  // namespace houchu_cpu

HOUCHU_FRAGMENT(m) {
  m.def("col_absmax(Tensor x) -> Tensor");
  m.def("quantize_rows_int8(Tensor x, Tensor cols) -> (Tensor, Tensor, Tensor)");
  m.def(
      "int8_epilogue(Tensor acc, Tensor x_scale, Tensor w_scale, Tensor outliers, Tensor w, "
      "Tensor cols, bool silu_mul=False) -> Tensor");
}

HOUCHU_IMPL(m) {
  m.impl("col_absmax", &houchu_cpu::col_absmax);
  m.impl("quantize_rows_int8", &houchu_cpu::quantize_rows_int8);
  m.impl("int8_epilogue", &houchu_cpu::int8_epilogue);
}
