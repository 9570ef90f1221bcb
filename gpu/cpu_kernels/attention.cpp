// Paged decode attention for the CPU: each sequence's one new query token attends over
// its KV positions 0..len-1, read in place from the page pool through its page table
// (no gather into a padded copy first, which is what the torch backend must do).
//
// Softmax attention (Vaswani et al. 2017) with grouped-query KV heads (Ainslie et al.
// 2023: query head h reads KV head h / (H / Hkv)). Scores, softmax and the weighted sum
// are float32; an int8 pool is dequantized per token and head (value * scale, rounded to
// the model dtype, as houchu.gpu.kv_pool.dequantize_kv does).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <torch/library.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "vec.h"

namespace houchu_cpu {

namespace {

#ifdef HOUCHU_AVX512
constexpr int64_t kMaxGroup = 16, kMaxDv = 16;  // query heads per KV head; D / 16

// All G query heads of one KV head of one sequence, AVX-512: each K/V row is loaded and
// widened to float32 once for the G heads. q: G rows at stride q_stride; out: [G, D]
// contiguous. Scratch: scores [G, len].
template <typename T, int DV>
void attend_group_avx512(const T* q, int64_t q_stride, const T* kc, const T* vc,
                         const int64_t* pages, int64_t len, int64_t ps, int64_t hkv,
                         int64_t kvh, int64_t group, float scale, T* out, float* scores) {
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
  for (int64_t g = 0; g < group; ++g) mx[g] = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps);
    const T* k = kc + (pages[p] * ps * hkv + kvh) * d;
    for (int64_t r = 0; r < n; ++r, k += stride) {
      __m512 kv[DV];
      for (int i = 0; i < DV; ++i) kv[i] = load16(k + i * 16);
      for (int64_t g = 0; g < group; ++g) {
        __m512 acc = _mm512_mul_ps(qv[g][0], kv[0]);
        for (int i = 1; i < DV; ++i) acc = _mm512_fmadd_ps(qv[g][i], kv[i], acc);
        const float s = _mm512_reduce_add_ps(acc);
        scores[g * len + p * ps + r] = s;
        mx[g] = std::max(mx[g], s);
      }
    }
  }
  float inv[kMaxGroup];
  for (int64_t g = 0; g < group; ++g) {
    float* sg = scores + g * len;
    __m512 sum = _mm512_setzero_ps();
    const __m512 m = _mm512_set1_ps(mx[g]);
    int64_t t = 0;
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
  for (int64_t p = 0; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps);
    const T* v = vc + (pages[p] * ps * hkv + kvh) * d;
    for (int64_t r = 0; r < n; ++r, v += stride) {
      __m512 vv[DV];
      for (int i = 0; i < DV; ++i) vv[i] = load16(v + i * 16);
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

// The AVX-512 path if it applies (unquantized pool, D in {64, 128}, G <= 16).
template <typename T>
bool decode_attention_avx512(const at::Tensor& q, const at::Tensor& k_cache,
                             const at::Tensor& v_cache, const at::Tensor& pages,
                             const at::Tensor& lens, double scale, at::Tensor& out) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t ps = k_cache.size(1), hkv = k_cache.size(2), group = h / hkv;
  if ((d != 64 && d != 128) || group > kMaxGroup) return false;
  const int64_t n_pages = pages.size(1);
  const int32_t* lp = lens.data_ptr<int32_t>();
  int64_t max_len = 0;
  for (int64_t i = 0; i < b; ++i) max_len = std::max<int64_t>(max_len, lp[i]);
  const T* qp = q.data_ptr<T>();
  const T* kc = k_cache.data_ptr<T>();
  const T* vc = v_cache.data_ptr<T>();
  const int64_t* pp = pages.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  at::parallel_for(0, b * hkv, 1, [&](int64_t a, int64_t e) {
    std::vector<float> scores(group * max_len);
    for (int64_t i = a; i < e; ++i) {
      const int64_t bi = i / hkv, kvh = i % hkv;
      const T* qi = qp + bi * qs0 + kvh * group * qs1;
      T* oi = op + (bi * h + kvh * group) * d;
      if (d == 64) {
        attend_group_avx512<T, 4>(qi, qs1, kc, vc, pp + bi * n_pages, lp[bi], ps, hkv, kvh,
                                  group, static_cast<float>(scale), oi, scores.data());
      } else {
        attend_group_avx512<T, 8>(qi, qs1, kc, vc, pp + bi * n_pages, lp[bi], ps, hkv, kvh,
                                  group, static_cast<float>(scale), oi, scores.data());
      }
    }
  });
  return true;
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
                float* tile) {
  for (int64_t j = 0; j < d; ++j) qf[j] = static_cast<float>(q[j]) * scale;
  const int64_t n_pages = (len + ps - 1) / ps, stride = hkv * d;
  float mx = -std::numeric_limits<float>::infinity();
  for (int64_t p = 0; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps), first = pages[p] * ps * hkv + kvh;
    rows_to_float<T, C>(kc + first * d, stride, ks ? ks + first : nullptr, hkv, n, d, tile);
    for (int64_t r = 0; r < n; ++r) {
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
  for (int64_t t = 0; t < len; ++t) {
    scores[t] = std::exp(scores[t] - mx);
    denom += scores[t];
  }
  std::fill(acc, acc + d, 0.f);
  for (int64_t p = 0; p < n_pages; ++p) {
    const int64_t n = std::min(ps, len - p * ps), first = pages[p] * ps * hkv + kvh;
    rows_to_float<T, C>(vc + first * d, stride, vs ? vs + first : nullptr, hkv, n, d, tile);
    for (int64_t r = 0; r < n; ++r) {
      const float pr = scores[p * ps + r];
      const float* v = tile + r * d;
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) acc[j] += pr * v[j];
    }
  }
  const float inv = 1.f / denom;
  for (int64_t j = 0; j < d; ++j) out[j] = static_cast<T>(acc[j] * inv);
}

template <typename T, typename C>
void decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const std::optional<at::Tensor>& k_scale,
                      const std::optional<at::Tensor>& v_scale, const at::Tensor& pages,
                      const at::Tensor& lens, double scale, at::Tensor& out) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t ps = k_cache.size(1), hkv = k_cache.size(2), group = h / hkv;
  const int64_t n_pages = pages.size(1);
  const T* qp = q.data_ptr<T>();
  const C* kc = k_cache.data_ptr<C>();
  const C* vc = v_cache.data_ptr<C>();
  const c10::Half* ks = k_scale ? k_scale->data_ptr<c10::Half>() : nullptr;
  const c10::Half* vs = v_scale ? v_scale->data_ptr<c10::Half>() : nullptr;
  const int64_t* pp = pages.data_ptr<int64_t>();
  const int32_t* lp = lens.data_ptr<int32_t>();
  T* op = out.data_ptr<T>();
  int64_t max_len = 0;
  for (int64_t i = 0; i < b; ++i) max_len = std::max<int64_t>(max_len, lp[i]);
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  at::parallel_for(0, b * h, 1, [&](int64_t a, int64_t e) {
    // acc [D], qf [D], tile [page_size, D], scores [len]
    std::vector<float> scratch(max_len + (2 + ps) * d);
    for (int64_t i = a; i < e; ++i) {
      const int64_t bi = i / h, hi = i % h;
      attend_one<T, C>(qp + bi * qs0 + hi * qs1, kc, vc, ks, vs, pp + bi * n_pages, lp[bi], ps,
                       hkv, hi / group, d, static_cast<float>(scale), op + i * d,
                       scratch.data() + (2 + ps) * d, scratch.data(), scratch.data() + d,
                       scratch.data() + 2 * d);
    }
  });
}

}  // namespace

// q: [B, H, D]; k_cache, v_cache: [P, page_size, Hkv, D] (one layer of the pool);
// k_scale, v_scale: [P, page_size, Hkv] float16 for an int8 pool, else None;
// pages: [B, n_pages] int64; lens: [B] int32 (1 <= len <= n_pages * page_size);
// scale: softmax scale (1 / sqrt(D)) -> [B, H, D] in q's dtype.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache,
                                  const std::optional<at::Tensor>& k_scale,
                                  const std::optional<at::Tensor>& v_scale,
                                  const at::Tensor& pages, const at::Tensor& lens,
                                  double scale) {
  TORCH_CHECK(q.dim() == 3 && q.stride(2) == 1, "paged_decode_attention: q must be [B, H, D]");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && k_cache.size(3) == q.size(2),
              "paged_decode_attention: caches must be contiguous [P, page_size, Hkv, D]");
  TORCH_CHECK(q.size(1) % k_cache.size(2) == 0,
              "paged_decode_attention: query heads must be a multiple of KV heads");
  TORCH_CHECK(pages.dim() == 2 && pages.size(0) == q.size(0) && pages.is_contiguous() &&
                  pages.scalar_type() == at::kLong,
              "paged_decode_attention: pages must be a contiguous [B, n_pages] int64");
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == q.size(0) && lens.is_contiguous() &&
                  lens.scalar_type() == at::kInt,
              "paged_decode_attention: lens must be a contiguous [B] int32");
  TORCH_CHECK(k_scale.has_value() == v_scale.has_value(),
              "paged_decode_attention: give both scales or neither");
  const int64_t cap = pages.size(1) * k_cache.size(1);
  const int32_t* lp = lens.data_ptr<int32_t>();
  const int64_t* pp = pages.data_ptr<int64_t>();
  for (int64_t i = 0; i < lens.size(0); ++i) {
    TORCH_CHECK(lp[i] >= 1 && lp[i] <= cap, "paged_decode_attention: len ", lp[i],
                " outside [1, ", cap, "]");
    for (int64_t j = 0; j < (lp[i] + k_cache.size(1) - 1) / k_cache.size(1); ++j) {
      const int64_t pg = pp[i * pages.size(1) + j];
      TORCH_CHECK(pg >= 0 && pg < k_cache.size(0), "paged_decode_attention: page ", pg,
                  " outside the pool");
    }
  }
  auto out = at::empty({q.size(0), q.size(1), q.size(2)}, q.options());
  const bool quantized = k_scale.has_value();
  if (quantized) {
    TORCH_CHECK(k_cache.scalar_type() == at::kChar && k_scale->scalar_type() == at::kHalf &&
                    v_scale->scalar_type() == at::kHalf && k_scale->is_contiguous() &&
                    v_scale->is_contiguous() &&
                    k_scale->numel() * k_cache.size(3) == k_cache.numel() &&
                    v_scale->numel() == k_scale->numel(),
                "paged_decode_attention: a quantized pool is int8 with [P, ps, Hkv] float16 "
                "scales");
  } else {
    TORCH_CHECK(k_cache.scalar_type() == q.scalar_type() && v_cache.scalar_type() == q.scalar_type(),
                "paged_decode_attention: cache dtype must match q (or be int8 with scales)");
  }
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "paged_decode_attention", [&] {
#ifdef HOUCHU_AVX512
    if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, c10::BFloat16>) {
      if (!quantized &&
          decode_attention_avx512<scalar_t>(q, k_cache, v_cache, pages, lens, scale, out)) {
        return;
      }
    }
#endif
    if (quantized) {
      decode_attention<scalar_t, int8_t>(q, k_cache, v_cache, k_scale, v_scale, pages, lens,
                                         scale, out);
    } else {
      decode_attention<scalar_t, scalar_t>(q, k_cache, v_cache, k_scale, v_scale, pages, lens,
                                           scale, out);
    }
  });
  return out;
}

}  // namespace houchu_cpu

TORCH_LIBRARY_FRAGMENT(houchu_cpu, m) {
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? k_scale, "
      "Tensor? v_scale, Tensor pages, Tensor lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(houchu_cpu, CPU, m) {
  m.impl("paged_decode_attention", &houchu_cpu::paged_decode_attention);
}
