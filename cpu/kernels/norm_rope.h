// Row kernels of the Llama block's elementwise ops (norm_rope.cpp has the operators;
// decode_layers.cpp calls these from inside its own threads). Math in float32, rounded to
// the storage type T wherever houchu/model/ops.py's TorchOps reference rounds.
#pragma once
#include <c10/util/BFloat16.h>

#include <cmath>
#include <cstdint>
#include <type_traits>

#include "vec.h"

namespace houchu_cpu {

// Whether T has a vector path (AVX-512's 16 lanes, AVX2's or NEON's 8) in this build.
template <typename T>
constexpr bool kVec =
#if defined(HOUCHU_AVX512) || defined(HOUCHU_AVX2) || defined(HOUCHU_NEON)
    std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>;
#else
    false;
#endif

// Round a float32 to the storage type T and back (a no-op for float).
template <typename T>
inline float round_to(float x) {
  return static_cast<float>(static_cast<T>(x));
}

// One row of RMSNorm: out[hidden] = w * (s / sqrt(mean(s^2) + eps)), s = x, or with
// delta s = x + delta rounded to T and also written to sum_out. buf: [hidden] float32
// scratch.
template <typename T>
void rms_norm_row(const T* xr, const T* w, T* out, int64_t hidden, double eps, T* sum_out,
                  const T* delta, float* buf) {
#ifdef HOUCHU_AVX512
  if constexpr (kVec<T>) {
    if (hidden % 16 == 0) {
      using namespace vec;
      __m512 acc = _mm512_setzero_ps();
      for (int64_t i = 0; i < hidden; i += 16) {
        __m512 f = load16(xr + i);
        if (delta != nullptr) {  // the residual add, rounded as x + delta is
          f = round16<T>(_mm512_add_ps(f, load16(delta + i)));
          store16(sum_out + i, f);
        }
        _mm512_storeu_ps(buf + i, f);
        acc = _mm512_fmadd_ps(f, f, acc);
      }
      const float ms = _mm512_reduce_add_ps(acc) / static_cast<float>(hidden);
      const __m512 inv = _mm512_set1_ps(1.f / std::sqrt(ms + static_cast<float>(eps)));
      for (int64_t i = 0; i < hidden; i += 16) {
        const __m512 n = round16<T>(_mm512_mul_ps(_mm512_loadu_ps(buf + i), inv));
        store16(out + i, _mm512_mul_ps(load16(w + i), n));
      }
      return;
    }
  }
#elif defined(HOUCHU_AVX2)
  if constexpr (kVec<T>) {
    if (hidden % 8 == 0) {  // as the AVX-512 path, 8 lanes at a time
      using namespace simd;
      __m256 acc = _mm256_setzero_ps();
      for (int64_t i = 0; i < hidden; i += 8) {
        __m256 f = load8(xr + i);
        if (delta != nullptr) {  // the residual add, rounded as x + delta is
          f = round8<T>(_mm256_add_ps(f, load8(delta + i)));
          store8(sum_out + i, f);
        }
        _mm256_storeu_ps(buf + i, f);
        acc = _mm256_fmadd_ps(f, f, acc);
      }
      const float ms = hsum8(acc) / static_cast<float>(hidden);
      const __m256 inv = _mm256_set1_ps(1.f / std::sqrt(ms + static_cast<float>(eps)));
      for (int64_t i = 0; i < hidden; i += 8) {
        const __m256 n = round8<T>(_mm256_mul_ps(_mm256_loadu_ps(buf + i), inv));
        store8(out + i, _mm256_mul_ps(load8(w + i), n));
      }
      return;
    }
  }
#elif defined(HOUCHU_NEON)
  if constexpr (kVec<T>) {
    if (hidden % 8 == 0) {  // the AVX2 path's steps (neon.h)
      using namespace neon;
      f32x8 acc = zero8();
      for (int64_t i = 0; i < hidden; i += 8) {
        f32x8 f = load8(xr + i);
        if (delta != nullptr) {  // the residual add, rounded as x + delta is
          f = round8<T>(add8(f, load8(delta + i)));
          store8(sum_out + i, f);
        }
        store8(buf + i, f);
        acc = fma8(f, f, acc);
      }
      const float ms = hsum8(acc) / static_cast<float>(hidden);
      const f32x8 inv = set8(1.f / std::sqrt(ms + static_cast<float>(eps)));
      for (int64_t i = 0; i < hidden; i += 8) {
        const f32x8 n = round8<T>(mul8(load8(buf + i), inv));
        store8(out + i, mul8(load8(w + i), n));
      }
      return;
    }
  }
#endif
  float ss = 0.f;
  if (delta != nullptr) {  // residual add, rounded as the reference's x + delta
#pragma omp simd reduction(+ : ss)
    for (int64_t i = 0; i < hidden; ++i) {
      T s = static_cast<T>(static_cast<float>(xr[i]) + static_cast<float>(delta[i]));
      sum_out[i] = s;
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
#pragma omp simd
  for (int64_t i = 0; i < hidden; ++i) {
    out[i] = static_cast<T>(static_cast<float>(w[i]) * round_to<T>(buf[i] * inv));
  }
}

// One head of rotate-half RoPE: o[d] = x * cos + rotate_half(x) * sin, each product
// rounded to T as the reference does. x, c, s, o: [d] (d even).
template <typename T>
void rope_row(const T* xr, const T* c, const T* s, T* o, int64_t d) {
  const int64_t half = d / 2;
#ifdef HOUCHU_AVX512
  if constexpr (kVec<T>) {
    if (half % 16 == 0) {
      using namespace vec;
      const __m512 neg = _mm512_set1_ps(-1.f);
      for (int64_t j = 0; j < d; j += 16) {
        const __m512 rot =
            j < half ? _mm512_mul_ps(neg, load16(xr + j + half)) : load16(xr + j - half);
        const __m512 a1 = round16<T>(_mm512_mul_ps(load16(xr + j), load16(c + j)));
        const __m512 a2 = round16<T>(_mm512_mul_ps(rot, load16(s + j)));
        store16(o + j, _mm512_add_ps(a1, a2));
      }
      return;
    }
  }
#elif defined(HOUCHU_AVX2)
  if constexpr (kVec<T>) {
    if (half % 8 == 0) {  // 8 lanes never straddle the halves
      using namespace simd;
      const __m256 neg = _mm256_set1_ps(-1.f);
      for (int64_t j = 0; j < d; j += 8) {
        const __m256 rot =
            j < half ? _mm256_mul_ps(neg, load8(xr + j + half)) : load8(xr + j - half);
        const __m256 a1 = round8<T>(_mm256_mul_ps(load8(xr + j), load8(c + j)));
        const __m256 a2 = round8<T>(_mm256_mul_ps(rot, load8(s + j)));
        store8(o + j, _mm256_add_ps(a1, a2));
      }
      return;
    }
  }
#elif defined(HOUCHU_NEON)
  if constexpr (kVec<T>) {
    if (half % 8 == 0) {  // 8 lanes never straddle the halves
      using namespace neon;
      const f32x8 neg = set8(-1.f);
      for (int64_t j = 0; j < d; j += 8) {
        const f32x8 rot = j < half ? mul8(neg, load8(xr + j + half)) : load8(xr + j - half);
        const f32x8 a1 = round8<T>(mul8(load8(xr + j), load8(c + j)));
        const f32x8 a2 = round8<T>(mul8(rot, load8(s + j)));
        store8(o + j, add8(a1, a2));
      }
      return;
    }
  }
#endif
#pragma omp simd
  for (int64_t j = 0; j < d; ++j) {
    const float rot =
        j < half ? -static_cast<float>(xr[j + half]) : static_cast<float>(xr[j - half]);
    const float a1 = round_to<T>(static_cast<float>(xr[j]) * static_cast<float>(c[j]));
    const float a2 = round_to<T>(rot * static_cast<float>(s[j]));
    o[j] = static_cast<T>(a1 + a2);
  }
}

// SwiGLU's gating over columns [i0, i1) of one row: o[i] = silu(g[i]) * u[i], the
// activation rounded to T. i1 - i0 a multiple of 16 takes the AVX-512 path (of 8, the
// AVX2 or NEON one).
template <typename T>
void silu_mul_span(const T* g, const T* u, T* o, int64_t i0, int64_t i1) {
#ifdef HOUCHU_AVX512
  if constexpr (kVec<T>) {
    if ((i1 - i0) % 16 == 0) {
      using namespace vec;
      const __m512 one = _mm512_set1_ps(1.f);
      for (int64_t i = i0; i < i1; i += 16) {
        const __m512 x = load16(g + i);
        const __m512 e = exp16(_mm512_sub_ps(_mm512_setzero_ps(), x));
        const __m512 act = round16<T>(_mm512_div_ps(x, _mm512_add_ps(one, e)));
        store16(o + i, _mm512_mul_ps(act, load16(u + i)));
      }
      return;
    }
  }
#elif defined(HOUCHU_AVX2)
  if constexpr (kVec<T>) {
    if ((i1 - i0) % 8 == 0) {
      using namespace simd;
      const __m256 one = _mm256_set1_ps(1.f);
      for (int64_t i = i0; i < i1; i += 8) {
        const __m256 x = load8(g + i);
        const __m256 e = exp8(_mm256_sub_ps(_mm256_setzero_ps(), x));
        const __m256 act = round8<T>(_mm256_div_ps(x, _mm256_add_ps(one, e)));
        store8(o + i, _mm256_mul_ps(act, load8(u + i)));
      }
      return;
    }
  }
#elif defined(HOUCHU_NEON)
  if constexpr (kVec<T>) {
    if ((i1 - i0) % 8 == 0) {
      using namespace neon;
      const f32x8 one = set8(1.f);
      for (int64_t i = i0; i < i1; i += 8) {
        const f32x8 x = load8(g + i);
        const f32x8 e = exp8(sub8(zero8(), x));
        const f32x8 act = round8<T>(div8(x, add8(one, e)));
        store8(o + i, mul8(act, load8(u + i)));
      }
      return;
    }
  }
#endif
#pragma omp simd
  for (int64_t i = i0; i < i1; ++i) {
    const float x = static_cast<float>(g[i]);
    const float act = round_to<T>(x / (1.f + std::exp(-x)));
    o[i] = static_cast<T>(act * static_cast<float>(u[i]));
  }
}

}  // namespace houchu_cpu
