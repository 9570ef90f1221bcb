// The float work around W8A8's int8 GEMM on the CPU, fused: per-column absmax (to pick
// LLM.int8()'s outlier features, Dettmers et al. 2022), dynamic per-token int8
// quantization that sets the outlier features aside in float32, and the epilogue that
// scales the int32 products back and adds the outliers' float32 product (AVX-512 where
// the CPU has it).
//
// Numerics follow houchu.gpu.quant.quantize_rows_int8 and W8A8Linear._int8_gemm:
// scale = max(absmax / 127, 1e-10), q = clamp(round_half_even(x / scale), -127, 127).
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include "vec.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <tuple>
#include <type_traits>
#include <vector>

namespace houchu_cpu {

namespace {

void check_acts(const at::Tensor& x, const char* name) {
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous(), name, ": x must be a contiguous [M, K]");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name,
              ": float32 or bfloat16 only, got ", x.scalar_type());
}

template <typename T>
void col_absmax_impl(const T* xp, int64_t m, int64_t k, float* o) {
  at::parallel_for(0, k, 64, [&](int64_t c0, int64_t c1) {
    for (int64_t r = 0; r < m; ++r) {
      const T* row = xp + r * k;
#pragma omp simd
      for (int64_t c = c0; c < c1; ++c) {
        o[c] = std::max(o[c], std::abs(static_cast<float>(row[c])));
      }
    }
  });
}

template <typename T>
void quantize_rows_impl(const T* xp, int64_t m, int64_t k, const uint8_t* mask,
                        const int64_t* cp, int64_t c, int8_t* qp, float* sp, T* op) {
  at::parallel_for(0, m, 4, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = xp + r * k;
      float amax = 0.f;
      for (int64_t i = 0; i < k; ++i) {
        const float v = mask[i] ? 0.f : std::abs(static_cast<float>(row[i]));
        amax = std::max(amax, v);
      }
      const float s = std::max(amax / 127.f, 1e-10f);
      sp[r] = s;
      int8_t* qr = qp + r * k;
#pragma omp simd
      for (int64_t i = 0; i < k; ++i) {
        const float v = mask[i] ? 0.f : static_cast<float>(row[i]) / s;
        qr[i] = static_cast<int8_t>(std::clamp(std::nearbyint(v), -127.f, 127.f));
      }
      for (int64_t j = 0; j < c; ++j) op[r * c + j] = row[cp[j]];
    }
  });
}

// Rows [r0, r1): out = acc * xs * ws + extra, rounded to T (extra may be null).
template <typename T>
void epilogue_rows(const int32_t* ap, const float* xs, const float* ws, const float* ep,
                   int64_t n, int64_t r0, int64_t r1, T* op) {
  for (int64_t r = r0; r < r1; ++r) {
    const int32_t* a = ap + r * n;
    const float* e = ep ? ep + r * n : nullptr;
    T* o = op + r * n;
    int64_t i = 0;
#ifdef HOUCHU_AVX512
    if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
      using namespace vec;
      const __m512 sv = _mm512_set1_ps(xs[r]);
      for (; i + 16 <= n; i += 16) {
        __m512 v = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_loadu_si512(a + i)), sv);
        v = _mm512_mul_ps(v, _mm512_loadu_ps(ws + i));
        if (e != nullptr) v = _mm512_add_ps(v, _mm512_loadu_ps(e + i));
        store16(o + i, v);
      }
    }
#endif
    for (; i < n; ++i) {
      const float v = static_cast<float>(a[i]) * xs[r] * ws[i] + (e ? e[i] : 0.f);
      o[i] = static_cast<T>(v);
    }
  }
}

template <typename T>
void epilogue_impl(const int32_t* ap, const float* xs, const float* ws, const float* ep,
                   int64_t m, int64_t n, T* op) {
  at::parallel_for(0, m, 4, [&](int64_t r0, int64_t r1) {
    epilogue_rows<T>(ap, xs, ws, ep, n, r0, r1, op);
  });
}

}  // namespace

// x: [M, K] float32/bfloat16 -> [K] float32: max over rows of |x|.
at::Tensor col_absmax(const at::Tensor& x) {
  check_acts(x, "col_absmax");
  const int64_t m = x.size(0), k = x.size(1);
  auto out = at::zeros({k}, x.options().dtype(at::kFloat));
  float* o = out.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "col_absmax", [&] {
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
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "quantize_rows_int8", [&] {
    quantize_rows_impl<scalar_t>(x.data_ptr<scalar_t>(), m, k, mask, cp, c, qp, sp,
                                 outl.data_ptr<scalar_t>());
  });
  return {q, scale, outl};
}

// acc: [M, N] int32 (x_q @ w_q^T); x_scale: [M, 1] float32; w_scale: [N] float32;
// extra: [M, N] float32 (the outlier features' product with their dequantized weight
// columns) or None -> [M, N] in `dtype` (float32 or bfloat16):
// acc * x_scale * w_scale + extra, in W8A8Linear._int8_gemm's order.
at::Tensor int8_epilogue(const at::Tensor& acc, const at::Tensor& x_scale,
                         const at::Tensor& w_scale, const std::optional<at::Tensor>& extra,
                         at::ScalarType dtype) {
  TORCH_CHECK(acc.dim() == 2 && acc.is_contiguous() && acc.scalar_type() == at::kInt,
              "int8_epilogue: acc must be a contiguous [M, N] int32");
  const int64_t m = acc.size(0), n = acc.size(1);
  TORCH_CHECK(x_scale.numel() == m && x_scale.scalar_type() == at::kFloat &&
                  x_scale.is_contiguous(),
              "int8_epilogue: x_scale must be [M, 1] float32");
  TORCH_CHECK(w_scale.numel() == n && w_scale.scalar_type() == at::kFloat &&
                  w_scale.is_contiguous(),
              "int8_epilogue: w_scale must be [N] float32");
  TORCH_CHECK(!extra || (extra->sizes() == acc.sizes() && extra->scalar_type() == at::kFloat &&
                         extra->is_contiguous()),
              "int8_epilogue: extra must be a contiguous [M, N] float32");
  TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16,
              "int8_epilogue: float32 or bfloat16 output only");
  auto out = at::empty({m, n}, acc.options().dtype(dtype));
  const int32_t* ap = acc.data_ptr<int32_t>();
  const float* xs = x_scale.data_ptr<float>();
  const float* ws = w_scale.data_ptr<float>();
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, dtype, "int8_epilogue", [&] {
    const float* ep = extra ? extra->data_ptr<float>() : nullptr;
    epilogue_impl<scalar_t>(ap, xs, ws, ep, m, n, out.data_ptr<scalar_t>());
  });
  return out;
}

}  // namespace houchu_cpu

TORCH_LIBRARY_FRAGMENT(houchu_cpu, m) {
  m.def("col_absmax(Tensor x) -> Tensor");
  m.def("quantize_rows_int8(Tensor x, Tensor cols) -> (Tensor, Tensor, Tensor)");
  m.def(
      "int8_epilogue(Tensor acc, Tensor x_scale, Tensor w_scale, Tensor? extra, "
      "ScalarType dtype) -> Tensor");
}

TORCH_LIBRARY_IMPL(houchu_cpu, CPU, m) {
  m.impl("col_absmax", &houchu_cpu::col_absmax);
  m.impl("quantize_rows_int8", &houchu_cpu::quantize_rows_int8);
  m.impl("int8_epilogue", &houchu_cpu::int8_epilogue);
}
