// Fused elementwise kernels of the Llama block for the CPU: RMSNorm, residual add +
// RMSNorm, rotate-half RoPE (queries and keys in one call) and SwiGLU's SiLU·mul.
//
// Each is one pass over memory and one operator dispatch where the torch reference
// (houchu/model/ops.py, TorchOps) takes 3-8 ops. Numerics follow the reference op by op:
// math in float32, rounded to the tensor dtype wherever the reference rounds, so
// bfloat16 results differ from it at most by float32 summation order in the RMS.
#include "aten.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include "library.h"

#include <cmath>
#include <tuple>
#include <type_traits>

#include "norm_rope.h"

namespace houchu_cpu {

template <typename T>
void rms_norm_rows(const T* x, int64_t x_stride, const T* w, T* out, int64_t out_stride,
                   int64_t rows, int64_t hidden, double eps, T* sum_out,
                   const T* delta, int64_t delta_stride) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(hidden);
    for (int64_t r = r0; r < r1; ++r) {
      rms_norm_row<T>(x + r * x_stride, w, out + r * out_stride, hidden, eps,
                      delta ? sum_out + r * out_stride : nullptr,
                      delta ? delta + r * delta_stride : nullptr, buf.data());
    }
  });
}

static void check_rows(const at::Tensor& x, const at::Tensor& w, const char* name) {
  TORCH_CHECK(x.dim() == 2, name, ": x must be [N, hidden], got ", x.sizes());
  TORCH_CHECK(x.stride(1) == 1, name, ": x rows must be contiguous");
  TORCH_CHECK(w.dim() == 1 && w.size(0) == x.size(1) && w.is_contiguous(), name,
              ": weight must be a contiguous [hidden]");
  TORCH_CHECK(w.scalar_type() == x.scalar_type(), name, ": weight and x dtypes differ");
  TORCH_CHECK(x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16, name,
              ": float32 or bfloat16 only, got ", x.scalar_type());
}

// x: [N, hidden], w: [hidden] -> [N, hidden]: w * (x / sqrt(mean(x^2) + eps)).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& w, double eps) {
  check_rows(x, w, "rms_norm");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "rms_norm", [&] {
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), w.data_ptr<scalar_t>(),
                            out.data_ptr<scalar_t>(), out.stride(0), x.size(0), x.size(1),
                            eps, nullptr, nullptr, 0);
  });
  return out;
}

// x, delta: [N, hidden] -> (rms_norm(x + delta), x + delta), both [N, hidden].
std::tuple<at::Tensor, at::Tensor> add_rms_norm(const at::Tensor& x, const at::Tensor& delta,
                                                const at::Tensor& w, double eps) {
  check_rows(x, w, "add_rms_norm");
  TORCH_CHECK(delta.sizes() == x.sizes() && delta.stride(1) == 1 &&
                  delta.scalar_type() == x.scalar_type(),
              "add_rms_norm: delta must match x");
  auto out = at::empty({x.size(0), x.size(1)}, x.options());
  auto sum = at::empty({x.size(0), x.size(1)}, x.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, x.scalar_type(), "add_rms_norm", [&] {
    rms_norm_rows<scalar_t>(x.data_ptr<scalar_t>(), x.stride(0), w.data_ptr<scalar_t>(),
                            out.data_ptr<scalar_t>(), out.stride(0), x.size(0), x.size(1),
                            eps, sum.data_ptr<scalar_t>(), delta.data_ptr<scalar_t>(),
                            delta.stride(0));
  });
  return {out, sum};
}

template <typename T>
void rope_heads(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                at::Tensor& out) {
  const int64_t t = x.size(0), h = x.size(1), d = x.size(2);
  const T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), cs0 = cos.stride(0), ss0 = sin.stride(0);
  at::parallel_for(0, t * h, 64, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const int64_t ti = i / h, hi = i % h;
      rope_row<T>(xp + ti * xs0 + hi * xs1, cp + ti * cs0, sp + ti * ss0, op + i * d, d);
    }
  });
}

// q: [T, H, D], k: [T, Hkv, D] (last dim contiguous), cos, sin: [T, 1, D] -> rotated
// (q, k), new contiguous tensors.
std::tuple<at::Tensor, at::Tensor> rope(const at::Tensor& q, const at::Tensor& k,
                                        const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && q.size(2) == k.size(2) && q.size(2) % 2 == 0,
              "rope: q [T, H, D] and k [T, Hkv, D] with even D");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1, "rope: head_dim must be contiguous");
  TORCH_CHECK(cos.dim() == 3 && cos.size(0) == q.size(0) && cos.size(2) == q.size(2) &&
                  cos.stride(2) == 1 && sin.sizes() == cos.sizes() && sin.stride(2) == 1,
              "rope: cos and sin must be [T, 1, D]");
  TORCH_CHECK(cos.scalar_type() == q.scalar_type() && sin.scalar_type() == q.scalar_type() &&
                  k.scalar_type() == q.scalar_type(),
              "rope: q, k, cos and sin must share a dtype");
  auto qo = at::empty(q.sizes(), q.options());
  auto ko = at::empty(k.sizes(), k.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "rope", [&] {
    rope_heads<scalar_t>(q, cos, sin, qo);
    rope_heads<scalar_t>(k, cos, sin, ko);
  });
  return {qo, ko};
}

template <typename T>
void silu_mul_rows(const T* g, int64_t gs, T* o, int64_t n, int64_t inter) {
  at::parallel_for(0, n, 8, [&](int64_t a, int64_t b) {
    for (int64_t r = a; r < b; ++r) {
      silu_mul_span<T>(g + r * gs, g + r * gs + inter, o + r * inter, 0, inter);
    }
  });
}

// gate_up: [N, 2I] (gate | up) -> [N, I]: silu(gate) * up.
at::Tensor silu_mul(const at::Tensor& gate_up) {
  TORCH_CHECK(gate_up.dim() == 2 && gate_up.size(1) % 2 == 0 && gate_up.stride(1) == 1,
              "silu_mul: gate_up must be [N, 2I] with contiguous rows");
  TORCH_CHECK(gate_up.scalar_type() == at::kFloat || gate_up.scalar_type() == at::kBFloat16,
              "silu_mul: float32 or bfloat16 only, got ", gate_up.scalar_type());
  const int64_t n = gate_up.size(0), inter = gate_up.size(1) / 2;
  auto out = at::empty({n, inter}, gate_up.options());
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, gate_up.scalar_type(), "silu_mul", [&] {
    silu_mul_rows<scalar_t>(gate_up.data_ptr<scalar_t>(), gate_up.stride(0),
                            out.data_ptr<scalar_t>(), n, inter);
  });
  return out;
}

}  // namespace houchu_cpu

HOUCHU_FRAGMENT(m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
}

HOUCHU_IMPL(m) {
  m.impl("rms_norm", &houchu_cpu::rms_norm);
  m.impl("add_rms_norm", &houchu_cpu::add_rms_norm);
  m.impl("rope", &houchu_cpu::rope);
  m.impl("silu_mul", &houchu_cpu::silu_mul);
}
