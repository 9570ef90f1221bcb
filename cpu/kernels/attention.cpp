// Paged decode attention for the CPU: each sequence's one new query token attends over
// its KV positions 0..len-1 (start..len-1 with a sliding window's starts), read in place from the page pool through its page table
// (no gather into a padded copy first, which is what the torch backend must do).
//
// Softmax attention (Vaswani et al. 2017) with grouped-query KV heads (Ainslie et al.
// 2023: query head h reads KV head h / (H / Hkv)). Scores, softmax and the weighted sum
// are float32; an int8 pool is dequantized per token and head (value * scale, rounded to
// the model dtype, as houchu.model.kv.pool.dequantize_kv does).
#include "aten.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include "library.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>
#include <vector>

#include "attention.h"

namespace houchu_cpu {

namespace {

using attn::attend_one;
#if defined(HOUCHU_AVX512) || defined(HOUCHU_AVX2) || defined(HOUCHU_NEON)
using attn::kMaxGroup;

// The group kernel (AVX-512's, AVX2's or NEON's) if it applies (D in {64, 128},
// G <= 16); C: T, or int8_t with scales.
template <typename T, typename C>
bool decode_attention_group(const at::Tensor& q, const at::Tensor& k_cache,
                            const at::Tensor& v_cache,
                            const std::optional<at::Tensor>& k_scale,
                            const std::optional<at::Tensor>& v_scale, const at::Tensor& pages,
                            const at::Tensor& lens, double scale, const int32_t* sp,
                            at::Tensor& out) {
  const int64_t b = q.size(0), h = q.size(1), d = q.size(2);
  const int64_t ps = k_cache.size(1), hkv = k_cache.size(2), group = h / hkv;
  if ((d != 64 && d != 128) || group > kMaxGroup) return false;
  const int64_t n_pages = pages.size(1);
  const int32_t* lp = lens.data_ptr<int32_t>();
  int64_t max_len = 0;
  for (int64_t i = 0; i < b; ++i) max_len = std::max<int64_t>(max_len, lp[i]);
  const T* qp = q.data_ptr<T>();
  const C* kc = k_cache.data_ptr<C>();
  const C* vc = v_cache.data_ptr<C>();
  const c10::Half* ks = k_scale ? k_scale->data_ptr<c10::Half>() : nullptr;
  const c10::Half* vs = v_scale ? v_scale->data_ptr<c10::Half>() : nullptr;
  const int64_t* pp = pages.data_ptr<int64_t>();
  T* op = out.data_ptr<T>();
  const int64_t qs0 = q.stride(0), qs1 = q.stride(1);
  at::parallel_for(0, b * hkv, 1, [&](int64_t a, int64_t e) {
    std::vector<float> scores(group * max_len);
    for (int64_t i = a; i < e; ++i) {
      const int64_t bi = i / hkv, kvh = i % hkv;
      const T* qi = qp + bi * qs0 + kvh * group * qs1;
      T* oi = op + (bi * h + kvh * group) * d;
      attn::attend_group<T, C>(qi, qs1, kc, vc, pp + bi * n_pages, lp[bi], ps, hkv, kvh, group,
                               d, static_cast<float>(scale), oi, scores.data(), ks, vs,
                               sp ? sp[bi] : 0);
    }
  });
  return true;
}
#endif


template <typename T, typename C>
void decode_attention(const at::Tensor& q, const at::Tensor& k_cache, const at::Tensor& v_cache,
                      const std::optional<at::Tensor>& k_scale,
                      const std::optional<at::Tensor>& v_scale, const at::Tensor& pages,
                      const at::Tensor& lens, double scale, const int32_t* sp,
                      at::Tensor& out) {
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
                       scratch.data() + 2 * d, sp ? sp[bi] : 0);
    }
  });
}

}  // namespace

// q: [B, H, D]; k_cache, v_cache: [P, page_size, Hkv, D] (one layer of the pool);
// k_scale, v_scale: [P, page_size, Hkv] float16 for an int8 pool, else None;
// pages: [B, n_pages] int64; lens: [B] int32 (1 <= len <= n_pages * page_size);
// scale: softmax scale (1 / sqrt(D) for Llama); starts: [B] int32, the first position
// each row attends (a sliding window; 0 <= start < len), or None for 0 -> [B, H, D] in
// q's dtype.
at::Tensor paged_decode_attention(const at::Tensor& q, const at::Tensor& k_cache,
                                  const at::Tensor& v_cache,
                                  const std::optional<at::Tensor>& k_scale,
                                  const std::optional<at::Tensor>& v_scale,
                                  const at::Tensor& pages, const at::Tensor& lens,
                                  double scale, const std::optional<at::Tensor>& starts) {
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
  TORCH_CHECK(!starts || (starts->dim() == 1 && starts->size(0) == q.size(0) &&
                          starts->is_contiguous() && starts->scalar_type() == at::kInt),
              "paged_decode_attention: starts must be a contiguous [B] int32");
  const int32_t* sp = starts ? starts->data_ptr<int32_t>() : nullptr;
  const int64_t cap = pages.size(1) * k_cache.size(1);
  const int32_t* lp = lens.data_ptr<int32_t>();
  const int64_t* pp = pages.data_ptr<int64_t>();
  for (int64_t i = 0; i < lens.size(0); ++i) {
    TORCH_CHECK(lp[i] >= 1 && lp[i] <= cap, "paged_decode_attention: len ", lp[i],
                " outside [1, ", cap, "]");
    TORCH_CHECK(!sp || (sp[i] >= 0 && sp[i] < lp[i]), "paged_decode_attention: start ",
                sp ? sp[i] : 0, " outside [0, len)");
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
#if defined(HOUCHU_AVX512) || defined(HOUCHU_AVX2) || defined(HOUCHU_NEON)
    if constexpr (std::is_same_v<scalar_t, float> || std::is_same_v<scalar_t, c10::BFloat16>) {
      if (quantized ? decode_attention_group<scalar_t, int8_t>(q, k_cache, v_cache, k_scale,
                                                               v_scale, pages, lens, scale, sp, out)
                    : decode_attention_group<scalar_t, scalar_t>(
                          q, k_cache, v_cache, k_scale, v_scale, pages, lens, scale, sp, out)) {
        return;
      }
    }
#endif
    if (quantized) {
      decode_attention<scalar_t, int8_t>(q, k_cache, v_cache, k_scale, v_scale, pages, lens,
                                         scale, sp, out);
    } else {
      decode_attention<scalar_t, scalar_t>(q, k_cache, v_cache, k_scale, v_scale, pages, lens,
                                           scale, sp, out);
    }
  });
  return out;
}

}  // namespace houchu_cpu

HOUCHU_FRAGMENT(m) {
  m.def(
      "paged_decode_attention(Tensor q, Tensor k_cache, Tensor v_cache, Tensor? k_scale, "
      "Tensor? v_scale, Tensor pages, Tensor lens, float scale, Tensor? starts=None) -> Tensor");
}

HOUCHU_IMPL(m) {
  m.impl("paged_decode_attention", &houchu_cpu::paged_decode_attention);
}
