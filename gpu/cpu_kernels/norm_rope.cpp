// Fused elementwise kernels of the Llama block for the CPU: RMSNorm, residual add +
// RMSNorm, rotate-half RoPE (queries and keys in one call) and SwiGLU's SiLU·mul.
//
// Each is one pass over memory and one operator dispatch where the torch reference
// (houchu/gpu/ops.py, TorchOps) takes 3-8 ops. Numerics follow the reference op by op:
// math in float32, rounded to the tensor dtype wherever the reference rounds, so
// bfloat16 results differ from it at most by float32 summation order in the RMS.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <torch/library.h>

#include <cmath>
#include <tuple>
#include <type_traits>

#include "vec.h"

namespace houchu_cpu {

template <typename T>
constexpr bool kVec =
#ifdef HOUCHU_AVX512
    std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;
#else
    false;
#endif

// Round a float32 to the storage type T and back (a no-op for float).
template <typename T>
inline float round_to(float x) {
  return static_cast<float>(static_cast<T>(x));
}

template <typename T>
void rms_norm_rows(const T* x, int64_t x_stride, const T* w, T* out, int64_t out_stride,
                   int64_t rows, int64_t hidden, double eps, T* sum_out,
                   const T* delta, int64_t delta_stride) {
  at::parallel_for(0, rows, 16, [&](int64_t r0, int64_t r1) {
    std::vector<float> buf(hidden);
    for (int64_t r = r0; r < r1; ++r) {
      const T* xr = x + r * x_stride;
#ifdef HOUCHU_AVX512
      if constexpr (kVec<T>) {
        if (hidden % 16 == 0) {
          using namespace vec;
          __m512 acc = _mm512_setzero_ps();
          for (int64_t i = 0; i < hidden; i += 16) {
            __m512 f = load16(xr + i);
            if (delta != nullptr) {  // the residual add, rounded as x + delta is
              f = round16<T>(_mm512_add_ps(f, load16(delta + r * delta_stride + i)));
              store16(sum_out + r * out_stride + i, f);
            }
            _mm512_storeu_ps(buf.data() + i, f);
            acc = _mm512_fmadd_ps(f, f, acc);
          }
          const float ms = _mm512_reduce_add_ps(acc) / static_cast<float>(hidden);
          const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(ms + static_cast<float>(eps)));
          for (int64_t i = 0; i < hidden; i += 16) {
            const __m512 n = round16<T>(_mm512_mul_ps(_mm512_loadu_ps(buf.data() + i), inv));
            store16(out + r * out_stride + i, _mm512_mul_ps(load16(w + i), n));
          }
          continue;
        }
      }
#endif
      float ss = 0.f;
      if (delta != nullptr) {  // residual add, rounded as the reference's x + delta
        const T* dr = delta + r * delta_stride;
        T* sr = sum_out + r * out_stride;
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < hidden; ++i) {
          T s = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(dr[i]));
          sr[i] = s;
          float f = static_cast<float>(s);
          buf[i] = f;
          ss += f * f;
        }
      } else {
#pragma omp simd reduction(+ : ss)
        for (int64_t i = 0; i < hidden; ++i) {
          float f = static_cast<float>(xr[i]);
          buf[i] = f;
          ss += f * f;
        }
      }
      const float inv = 1.f / std::sqrt(ss / static_cast<float>(hidden) + static_cast<float>(eps));
      T* o = out + r * out_stride;
#pragma omp simd
      for (int64_t i = 0; i < hidden; ++i) {
        o[i] = static_cast<T>(static_cast<float>(w[i]) * round_to<T>(buf[i] * inv));
      }
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
  const int64_t t = x.size(0), h = x.size(1), d = x.size(2), half = d / 2;
  const T* xp = x.data_ptr<T>();
  const T* cp = cos.data_ptr<T>();
  const T* sp = sin.data_ptr<T>();
  T* op = out.data_ptr<T>();
  const int64_t xs0 = x.stride(0), xs1 = x.stride(1), cs0 = cos.stride(0), ss0 = sin.stride(0);
  at::parallel_for(0, t * h, 64, [&](int64_t a, int64_t b) {
    for (int64_t i = a; i < b; ++i) {
      const int64_t ti = i / h, hi = i % h;
      const T* xr = xp + ti * xs0 + hi * xs1;
      const T* c = cp + ti * cs0;
      const T* s = sp + ti * ss0;
      T* o = op + i * d;
#ifdef HOUCHU_AVX512
      if constexpr (kVec<T>) {
        if (half % 16 == 0) {
          using namespace vec;
          const __m512 neg = _mm512_set1_ps(-1.f);
          for (int64_t j = 0; j < d; j += 16) {
            const __m512 rot = j < half ? _mm512_mul_ps(neg, load16(xr + j + half))
                                        : load16(xr + j - half);
            const __m512 a1 = round16<T>(_mm512_mul_ps(load16(xr + j), load16(c + j)));
            const __m512 a2 = round16<T>(_mm512_mul_ps(rot, load16(s + j)));
            store16(o + j, _mm512_add_ps(a1, a2));
          }
          continue;
        }
      }
#endif
      // x * cos + rotate_half(x) * sin, each product rounded to T as the reference does
#pragma omp simd
      for (int64_t j = 0; j < d; ++j) {
        const float rot = j < half ? -static_cast<float>(xr[j + half])
                                   : static_cast<float>(xr[j - half]);
        const float a1 = round_to<T>(static_cast<float>(xr[j]) * static_cast<float>(c[j]));
        const float a2 = round_to<T>(rot * static_cast<float>(s[j]));
        o[j] = static_cast<T>(a1 + a2);
      }
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
      const T* gr = g + r * gs;
      const T* ur = gr + inter;
      T* orow = o + r * inter;
#ifdef HOUCHU_AVX512
      if constexpr (kVec<T>) {
        if (inter % 16 == 0) {
          using namespace vec;
          const __m512 one = _mm512_set1_ps(1.f);
          for (int64_t i = 0; i < inter; i += 16) {
            const __m512 x = load16(gr + i);
            const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
            const __m512 act = round16<T>(_mm512_div_ps(x, _mm512_add_ps(one, e)));
            store16(orow + i, _mm512_mul_ps(act, load16(ur + i)));
          }
          continue;
        }
      }
#endif
#pragma omp simd
      for (int64_t i = 0; i < inter; ++i) {
        const float x = static_cast<float>(gr[i]);
        const float act = round_to<T>(x / (1.f + std::exp(-x)));
        orow[i] = static_cast<T>(act * static_cast<float>(ur[i]));
      }
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

TORCH_LIBRARY_FRAGMENT(houchu_cpu, m) {
  m.def("rms_norm(Tensor x, Tensor w, float eps) -> Tensor");
  m.def("add_rms_norm(Tensor x, Tensor delta, Tensor w, float eps) -> (Tensor, Tensor)");
  m.def("rope(Tensor q, Tensor k, Tensor cos, Tensor sin) -> (Tensor, Tensor)");
  m.def("silu_mul(Tensor gate_up) -> Tensor");
}

TORCH_LIBRARY_IMPL(houchu_cpu, CPU, m) {
  m.impl("rms_norm", &houchu_cpu::rms_norm);
  m.impl("add_rms_norm", &houchu_cpu::add_rms_norm);
  m.impl("rope", &houchu_cpu::rope);
  m.impl("silu_mul", &houchu_cpu::silu_mul);
}
