// Checks of houchu's NEON kernels (cpu/kernels, the neon and neon_dotprod levels)
// against scalar references on random inputs. Cross-compiled for aarch64 and run under
// qemu-aarch64 by tests/unit/test_neon_kernels.py, which also builds it natively at the
// avx2 level to hold the AVX2 kernels to the same references; exits 1 after printing
// every failed check (the first 40). Where the kernels follow the AVX2 ones' float32 steps (int4 / int8 / W4A8
// GEMV), the reference replays those steps with std::fma and the results must be equal
// bit for bit; elsewhere (attention, RMSNorm, SiLU, exp) they must agree to float32
// rounding. The AVX2 build's int8 GEMV takes int16 activations (gemv_a16.h): its
// reference replays that quantization and its integer sums.
#include "cpu/kernels/argmax.h"
#include "cpu/kernels/attention.h"
#include "cpu/kernels/gemv.h"
#include "cpu/kernels/norm_rope.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

#if defined(__aarch64__)
#if !defined(HOUCHU_NEON) || !defined(HOUCHU_A8_NEON)
#error "the NEON paths are not compiled in"
#endif
#if defined(HOUCHU_EXPECT_DOTPROD) != defined(__ARM_FEATURE_DOTPROD)
#error "dotprod is not as this level expects"
#endif
constexpr int64_t kRowTile = houchu_cpu::gemv::kMaxTileNeon;
#elif defined(HOUCHU_AVX2) && defined(HOUCHU_A8_X86) && !defined(HOUCHU_A8_VNNI)
// Built natively at the avx2 level, the same checks hold the AVX2 kernels to the same
// bit-exact references: the NEON and AVX2 levels compute the same floats.
constexpr int64_t kRowTile = houchu_cpu::gemv::kMaxTile2;
static_assert(houchu_cpu::gemv::kMaxTile2 == houchu_cpu::gemv::kMaxTileA8);
#else
#error "build for aarch64, or natively with -march=x86-64-v3 (the avx2 level)"
#endif

using c10::BFloat16;
using namespace houchu_cpu;

namespace {

int failures = 0, checks = 0;
std::mt19937 rng(1234);

float uniform(float lo, float hi) { return std::uniform_real_distribution<float>(lo, hi)(rng); }

void fail(const char* what, const char* detail) {
  if (++failures <= 40) std::printf("FAIL %s: %s\n", what, detail);
}

// a == b bit for bit (float32), or both NaN
bool same(float a, float b) {
  return std::memcmp(&a, &b, 4) == 0 || (std::isnan(a) && std::isnan(b));
}

void expect_same(const char* what, float got, float want, int64_t i) {
  ++checks;
  if (!same(got, want)) {
    char d[160];
    std::snprintf(d, sizeof d, "[%lld] %.9g != %.9g", static_cast<long long>(i), got, want);
    fail(what, d);
  }
}

void expect_close(const char* what, float got, double want, double tol, int64_t i) {
  ++checks;
  if (!(std::abs(got - want) <= tol)) {
    char d[160];
    std::snprintf(d, sizeof d, "[%lld] %.9g vs %.9g (tol %.3g)", static_cast<long long>(i), got,
                  want, tol);
    fail(what, d);
  }
}

float bf16_round(float x) { return static_cast<float>(BFloat16(x)); }

template <typename OutT>
float out_value(OutT v) {
  return static_cast<float>(v);
}

// ---- int4 GEMV (float32 activations) and W4A8 -------------------------------------

struct Int4Blob {
  int64_t n, k, G, H, nb, ng, gbytes;
  std::vector<uint8_t> bytes;
  float scale(int64_t f, int64_t g) const { return so(f, g, 0); }
  float offset(int64_t f, int64_t g) const { return so(f, g, 1); }
  uint8_t code(int64_t f, int64_t k_) const {
    const int64_t b = f / 16, i = f % 16, g = k_ / G, kk = k_ % G;
    const uint8_t byte = hdr(b, g)[H + 64 * (kk / 8) + gemv::int4_byte(i, kk % 8)];
    return (byte >> gemv::int4_shift(kk % 8)) & 15;
  }
  const uint8_t* hdr(int64_t b, int64_t g) const { return bytes.data() + (b * ng + g) * gbytes; }
  float so(int64_t f, int64_t g, int which) const {
    const uint8_t* h = hdr(f / 16, g);
    const int64_t i = f % 16;
    float v;
    if (H == 128) {
      std::memcpy(&v, h + 64 * which + 4 * i, 4);
    } else {
      uint32_t d;
      std::memcpy(&d, h + 4 * i, 4);
      const uint32_t u = which == 0 ? (d & 0xFFFFu) << 16 : d & 0xFFFF0000u;
      std::memcpy(&v, &u, 4);
    }
    return v;
  }
  gemv::PackedLinear packed() const {
    gemv::PackedLinear p;
    p.int4 = true;
    p.w = bytes.data();
    p.nb = nb;
    p.n = n;
    p.kpad = k;
    p.G = G;
    p.ng = ng;
    p.H = H;
    p.blk_bytes = ng * gbytes;
    return p;
  }
};

Int4Blob random_int4(int64_t n, int64_t k, int64_t G, int64_t H) {
  Int4Blob w{n, k, G, H, (n + 15) / 16, k / G, H + 8 * G, {}};
  w.bytes.resize(w.nb * w.ng * w.gbytes);
  for (auto& b : w.bytes) b = static_cast<uint8_t>(rng() & 0xFF);  // codes: any byte
  for (int64_t b = 0; b < w.nb; ++b)
    for (int64_t g = 0; g < w.ng; ++g) {
      uint8_t* h = w.bytes.data() + (b * w.ng + g) * w.gbytes;
      for (int64_t i = 0; i < 16; ++i) {
        const float s = uniform(0.001f, 0.05f), o = uniform(-0.4f, 0.1f);
        if (H == 128) {
          std::memcpy(h + 4 * i, &s, 4);
          std::memcpy(h + 64 + 4 * i, &o, 4);
        } else {
          const uint32_t d = static_cast<uint32_t>(gemv::to_bf16_bits(o)) << 16 |
                             gemv::to_bf16_bits(s);
          std::memcpy(h + 4 * i, &d, 4);
        }
      }
    }
  return w;
}

// The AVX2 kernel's float32 steps for one (row, feature): per group the products
// code * x accumulated in k order (two chains, even and odd k, in a 1-row tile), then
// acc = fma(s, dot, acc), acc = fma(o, sum of the group's x, acc).
float int4_replay(const Int4Blob& w, const float* x, int64_t f, bool one_row) {
  float acc = 0.f;
  for (int64_t g = 0; g < w.ng; ++g) {
    float d[2] = {0.f, 0.f}, gs = 0.f;
    for (int64_t j = g * w.G; j < (g + 1) * w.G; ++j) {
      const int a = one_row ? static_cast<int>(j % 2) : 0;
      d[a] = std::fma(static_cast<float>(w.code(f, j)), x[j], d[a]);
      gs += x[j];
    }
    const float dm = one_row ? d[0] + d[1] : d[0];
    acc = std::fma(w.scale(f, g), dm, acc);
    acc = std::fma(w.offset(f, g), gs, acc);
  }
  return acc;
}

double int4_exact(const Int4Blob& w, const float* x, int64_t f, double* mag) {
  double acc = 0.0;
  *mag = 0.0;
  for (int64_t j = 0; j < w.k; ++j) {
    const int64_t g = j / w.G;
    const double wv = double(w.scale(f, g)) * w.code(f, j) + double(w.offset(f, g));
    acc += wv * x[j];
    *mag += std::abs(wv * x[j]);
  }
  return acc;
}

// invariant: the batch-invariant form (PackedLinear::invariant), every row summed as a
// 1-row tile sums it whatever m is.
template <typename XT, typename OutT>
void check_int4(int64_t m, int64_t n, int64_t k, int64_t G, int64_t H, bool invariant = false) {
  const Int4Blob w = random_int4(n, k, G, H);
  std::vector<XT> x(m * k);
  std::vector<float> xf(m * k);
  for (int64_t i = 0; i < m * k; ++i) {
    x[i] = static_cast<XT>(uniform(-1.f, 1.f));
    xf[i] = static_cast<float>(x[i]);
  }
  gemv::PackedLinear p = w.packed();
  p.invariant = invariant;
  gemv::Acts xa(x.data(), m, k, k, 1, k, G);
  std::vector<OutT> out(m * n);
  gemv::run_blocks(p, xa, m, out.data(), 0, p.nb);
  char what[112];
  std::snprintf(what, sizeof what, "int4%s m=%lld n=%lld k=%lld G=%lld H=%lld x%s out%s",
                invariant ? " invariant" : "",
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                static_cast<long long>(G), static_cast<long long>(H),
                std::is_same_v<XT, float> ? "f32" : "bf16",
                std::is_same_v<OutT, float> ? "f32" : "bf16");
  for (int64_t r = 0; r < m; ++r) {
    const bool one_row = invariant || r / kRowTile * kRowTile == m - 1;  // a 1-row tile
    for (int64_t f = 0; f < n; ++f) {
      const float got = out_value(out[r * n + f]);
      float want = int4_replay(w, xf.data() + r * k, f, one_row);
      if (!std::is_same_v<OutT, float>) want = bf16_round(want);
      expect_same(what, got, want, r * n + f);
      double mag;
      const double exact = int4_exact(w, xf.data() + r * k, f, &mag);
      const double tol = (std::is_same_v<OutT, float> ? 1e-5 : 1e-2) * (mag + std::abs(exact)) + 1e-6;
      expect_close(what, got, exact, tol, r * n + f);
    }
  }
}

// W4A8: the quantized rows equal a scalar quantization exactly, and every output equals
// the integer dot products' float32 steps (acc = fma(s * dot, x scale, acc) per
// activation scale, then fma(o, group sum, acc), the group sum over the quantized
// activations) bit for bit.
void check_a8(int64_t m, int64_t n, int64_t k, int64_t G, int64_t H) {
  const Int4Blob w = random_int4(n, k, G, H);
  std::vector<float> x(m * k);
  for (auto& v : x) v = uniform(-1.f, 1.f) * (uniform(0.f, 1.f) < 0.05f ? 8.f : 1.f);
  const gemv::PackedLinear p = w.packed();
  gemv::Acts xa(x.data(), m, k, k, 1, k, G, /*int8_acts=*/true);
  std::vector<float> out(m * n);
  gemv::run_blocks(p, xa, m, out.data(), 0, p.nb);
  char what[96];
  std::snprintf(what, sizeof what, "w4a8 m=%lld n=%lld k=%lld G=%lld H=%lld",
                static_cast<long long>(m), static_cast<long long>(n), static_cast<long long>(k),
                static_cast<long long>(G), static_cast<long long>(H));
  const int64_t A = gemv::a8_block(G), ns = k / A;
  std::vector<int8_t> q(m * k);
  std::vector<float> qs(m * ns);
  for (int64_t r = 0; r < m; ++r)
    for (int64_t a = 0; a < ns; ++a) {
      const float* xr = x.data() + r * k + a * A;
      float amax = 0.f;
      for (int64_t j = 0; j < A; ++j) amax = std::max(amax, std::abs(xr[j]));
      qs[r * ns + a] = amax / 127.f;
      const float inv = amax > 0.f ? 127.f / amax : 0.f;
      for (int64_t c = 0; c < A / 8; ++c)
        for (int j = 0; j < 8; ++j) {
          const int8_t v = static_cast<int8_t>(std::nearbyint(xr[8 * c + gemv::kA8Order[j]] * inv));
          q[r * k + a * A + 8 * c + j] = v;
          ++checks;
          if (xa.xq[r * xa.ld + a * A + 8 * c + j] != v) fail(what, "quantized activation");
        }
      expect_same(what, xa.xs[r * ns + a], qs[r * ns + a], a);
    }
  for (int64_t r = 0; r < m; ++r)
    for (int64_t f = 0; f < n; ++f) {
      float acc = 0.f;
      for (int64_t g = 0; g < w.ng; ++g) {
        for (int64_t a = g * G / A; a < (g + 1) * G / A; ++a) {
          int32_t dot = 0;
          for (int64_t j = a * A; j < (a + 1) * A; ++j) {
            const int64_t c = j / 8, pos = j % 8;  // stored position pos holds input kA8Order[pos]
            dot += w.code(f, 8 * c + gemv::kA8Order[pos]) * q[r * k + j];
          }
          acc = std::fma(w.scale(f, g) * static_cast<float>(dot), qs[r * ns + a], acc);
        }
        float gs = 0.f;  // the quantized activations' sum (ggml q8_1's d * sum(qs))
        for (int64_t a = g * G / A; a < (g + 1) * G / A; ++a) {
          int32_t isum = 0;
          for (int64_t j = a * A; j < (a + 1) * A; ++j) isum += q[r * k + j];
          gs += qs[r * ns + a] * static_cast<float>(isum);
        }
        acc = std::fma(w.offset(f, g), gs, acc);
      }
      expect_same(what, out[r * n + f], acc, r * n + f);
    }
}

// ---- int8 GEMV ------------------------------------------------------------------------

template <typename OutT>
void check_int8(int64_t m, int64_t n, int64_t k) {
  const int64_t nb = (n + 15) / 16, nc = (k + 3) / 4;
  std::vector<int8_t> blob(nb * (1 + nc) * 64);
  for (auto& b : blob) b = static_cast<int8_t>(rng() & 0xFF);
  auto weight = [&](int64_t f, int64_t kk) {
    return blob[(f / 16) * (1 + nc) * 64 + 64 * (1 + kk / 4) + 32 * ((kk % 4) / 2) + 2 * (f % 16) +
                kk % 2];
  };
  for (int64_t b = 0; b < nb; ++b)
    for (int64_t i = 0; i < 16; ++i) {
      const float s = uniform(0.001f, 0.02f);
      std::memcpy(blob.data() + b * (1 + nc) * 64 + 4 * i, &s, 4);
    }
  auto scale = [&](int64_t f) {
    float s;
    std::memcpy(&s, blob.data() + (f / 16) * (1 + nc) * 64 + 4 * (f % 16), 4);
    return s;
  };
  std::vector<float> x(m * k);
  for (auto& v : x) v = uniform(-1.f, 1.f);
  gemv::PackedLinear p;
  p.int4 = false;
  p.w = reinterpret_cast<const uint8_t*>(blob.data());
  p.nb = nb;
  p.n = n;
  p.nc = nc;
  p.kpad = 4 * nc;
  p.blk_bytes = (1 + nc) * 64;
  gemv::Acts xa(x.data(), m, k, k, 1, p.kpad, 0);
  std::vector<OutT> out(m * n);
  gemv::run_blocks(p, xa, m, out.data(), 0, nb);
  char what[64];
  std::snprintf(what, sizeof what, "int8 m=%lld n=%lld k=%lld", static_cast<long long>(m),
                static_cast<long long>(n), static_cast<long long>(k));
  for (int64_t r = 0; r < m; ++r)
    for (int64_t f = 0; f < n; ++f) {
#ifdef HOUCHU_A16_X86
      // gemv_a16.h: x quantized to int16 per 64 inputs, exact integer sums per block,
      // then acc = fma(float(sum), scale, acc) over the blocks in order
      float acc = 0.f;
      for (int64_t j0 = 0; j0 < k; j0 += 64) {
        const int64_t j1 = std::min<int64_t>(k, j0 + 64);
        float amax = 0.f;
        for (int64_t kk = j0; kk < j1; ++kk) amax = std::max(amax, std::fabs(x[r * k + kk]));
        if (amax == 0.f) continue;
        const float inv = 16383.f / amax;
        int64_t sum = 0;
        for (int64_t kk = j0; kk < j1; ++kk)
          sum += weight(f, kk) * static_cast<int64_t>(std::nearbyint(x[r * k + kk] * inv));
        acc = std::fma(static_cast<float>(sum), amax / 16383.f, acc);
      }
      float want = acc * scale(f);
#else
      float e = 0.f, o = 0.f;  // the even-k and odd-k lanes, then added (hadd / vpaddq)
      for (int64_t kk = 0; kk < k; ++kk) {
        float& a = kk % 2 == 0 ? e : o;
        a = std::fma(static_cast<float>(weight(f, kk)), x[r * k + kk], a);
      }
      float want = (e + o) * scale(f);
#endif
      if (!std::is_same_v<OutT, float>) want = bf16_round(want);
      expect_same(what, out_value(out[r * n + f]), want, r * n + f);
    }
}

// ---- attention ------------------------------------------------------------------------

template <typename T, typename C>
void check_attention(int64_t d, int64_t group, int64_t len, int64_t start) {
  const int64_t ps = 16, hkv = 2, kvh = 1, n_pages = (len + ps - 1) / ps, P = n_pages + 2;
  std::vector<C> kc(P * ps * hkv * d), vc(P * ps * hkv * d);
  std::vector<c10::Half> ks(P * ps * hkv), vs(P * ps * hkv);
  for (int64_t i = 0; i < static_cast<int64_t>(kc.size()); ++i) {
    if constexpr (std::is_same_v<C, int8_t>) {
      kc[i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
      vc[i] = static_cast<int8_t>(static_cast<int>(rng() % 255) - 127);
    } else {
      kc[i] = static_cast<C>(uniform(-1.f, 1.f));
      vc[i] = static_cast<C>(uniform(-1.f, 1.f));
    }
  }
  for (int64_t i = 0; i < static_cast<int64_t>(ks.size()); ++i) {
    ks[i] = c10::Half(uniform(0.002f, 0.02f));
    vs[i] = c10::Half(uniform(0.002f, 0.02f));
  }
  const bool q8 = std::is_same_v<C, int8_t>;
  std::vector<int64_t> pages(n_pages);
  for (int64_t p = 0; p < n_pages; ++p) pages[p] = (p * 3 + 1) % P;  // scattered pages
  std::vector<T> q(group * d), out(group * d), ref(d);
  for (auto& v : q) v = static_cast<T>(uniform(-2.f, 2.f));
  const float scale = 1.f / std::sqrt(static_cast<float>(d));
  std::vector<float> scores(group * len), s1(len), acc(d), qf(d), tile(ps * d);
  attn::attend_group<T, C>(q.data(), d, kc.data(), vc.data(), pages.data(), len, ps, hkv, kvh,
                           group, d, scale, out.data(), scores.data(), q8 ? ks.data() : nullptr,
                           q8 ? vs.data() : nullptr, start);
  char what[96];
  std::snprintf(what, sizeof what, "attention d=%lld group=%lld len=%lld start=%lld %s%s",
                static_cast<long long>(d), static_cast<long long>(group),
                static_cast<long long>(len), static_cast<long long>(start),
                std::is_same_v<T, float> ? "f32" : "bf16", q8 ? " int8 cache" : "");
  const double tol = std::is_same_v<T, float> ? 2e-5 : 1.6e-2;
  for (int64_t g = 0; g < group; ++g) {
    attn::attend_one<T, C>(q.data() + g * d, kc.data(), vc.data(), q8 ? ks.data() : nullptr,
                           q8 ? vs.data() : nullptr, pages.data(), len, ps, hkv, kvh, d, scale,
                           ref.data(), s1.data(), acc.data(), qf.data(), tile.data(), start);
    for (int64_t j = 0; j < d; ++j) {
      const double want = static_cast<float>(ref[j]);
      expect_close(what, static_cast<float>(out[g * d + j]), want, tol * (std::abs(want) + 0.05),
                   g * d + j);
    }
  }
}

// ---- RMSNorm, RoPE, SiLU, exp, bfloat16 --------------------------------------------------

template <typename T>
void check_norm_rope(int64_t hidden, int64_t d) {
  const bool f32 = std::is_same_v<T, float>;
  std::vector<T> x(hidden), w(hidden), delta(hidden), out(hidden), sum(hidden);
  std::vector<float> buf(hidden);
  for (int64_t i = 0; i < hidden; ++i) {
    x[i] = static_cast<T>(uniform(-3.f, 3.f));
    w[i] = static_cast<T>(uniform(0.5f, 1.5f));
    delta[i] = static_cast<T>(uniform(-1.f, 1.f));
  }
  for (int with_delta = 0; with_delta < 2; ++with_delta) {
    rms_norm_row<T>(x.data(), w.data(), out.data(), hidden, 1e-6, sum.data(),
                    with_delta ? delta.data() : nullptr, buf.data());
    double ss = 0.0;
    std::vector<float> s(hidden);
    for (int64_t i = 0; i < hidden; ++i) {
      s[i] = with_delta ? round_to<T>(static_cast<float>(x[i]) + static_cast<float>(delta[i]))
                        : static_cast<float>(x[i]);
      if (with_delta) expect_same("rms_norm residual sum", static_cast<float>(sum[i]), s[i], i);
      ss += double(s[i]) * s[i];
    }
    const double inv = 1.0 / std::sqrt(ss / hidden + 1e-6);
    for (int64_t i = 0; i < hidden; ++i) {
      const double want = double(static_cast<float>(w[i])) * s[i] * inv;
      expect_close("rms_norm", static_cast<float>(out[i]), want,
                   (f32 ? 2e-6 : 1.6e-2) * std::abs(want) + 1e-7, i);
    }
  }
  std::vector<T> c(d), sn(d), o(d);
  for (int64_t j = 0; j < d; ++j) {
    c[j] = static_cast<T>(std::cos(0.1f * j));
    sn[j] = static_cast<T>(std::sin(0.1f * j));
  }
  rope_row<T>(x.data(), c.data(), sn.data(), o.data(), d);
  const int64_t half = d / 2;
  for (int64_t j = 0; j < d; ++j) {  // the portable path's steps: the same roundings
    const float rot = j < half ? -static_cast<float>(x[j + half]) : static_cast<float>(x[j - half]);
    const float a1 = round_to<T>(static_cast<float>(x[j]) * static_cast<float>(c[j]));
    const float a2 = round_to<T>(rot * static_cast<float>(sn[j]));
    expect_same("rope", static_cast<float>(o[j]), static_cast<float>(static_cast<T>(a1 + a2)), j);
  }
  silu_mul_span<T>(x.data(), w.data(), out.data(), 8, hidden);
  for (int64_t i = 8; i < hidden; ++i) {
    const double xv = static_cast<float>(x[i]);
    const double want = xv / (1.0 + std::exp(-xv)) * static_cast<float>(w[i]);
    expect_close("silu_mul", static_cast<float>(out[i]), want,
                 (f32 ? 1e-6 : 1.6e-2) * std::abs(want) + 1e-7, i);
  }
}

#ifdef HOUCHU_NEON
void check_exp_bf16() {
  using namespace neon;
  alignas(16) float in[8], got[8];
  for (int it = 0; it < 2000; ++it) {
    for (int i = 0; i < 8; ++i) in[i] = uniform(-87.f, 88.f);
    store8(got, exp8(load8(in)));
    for (int i = 0; i < 8; ++i) {
      const double want = std::exp(double(in[i]));
      expect_close("exp8", got[i], want, 4e-7 * want, i);
    }
  }
  const float edge[8] = {-200.f, -88.f, 89.f, 1000.f, 0.f, -0.f, 1.f, -1.f};
  store8(got, exp8(load8(edge)));
  ++checks;
  // clamped to [-87.3, 88.7] (as simd.h's exp8: exp(88.7) ~ 3.33e38 is still finite)
  if (!(got[0] < 1e-37f && got[1] < 1e-37f && got[2] > 3.3e38f && got[3] == got[2] &&
        got[4] == 1.f && got[5] == 1.f))
    fail("exp8", "limits (clamped to [-87.3, 88.7], exp(0) = 1)");
  // float32 -> bfloat16 rounding: c10::BFloat16's, bit for bit, NaN and inf included
  alignas(16) BFloat16 b[8];
  for (int it = 0; it < 5000; ++it) {
    for (int i = 0; i < 8; ++i) {
      const uint32_t u = static_cast<uint32_t>(rng());
      std::memcpy(&in[i], &u, 4);
    }
    in[0] = std::numeric_limits<float>::infinity();
    in[1] = it % 2 ? std::nanf("") : -std::numeric_limits<float>::infinity();
    store8(b, load8(in));
    store8(got, round8<BFloat16>(load8(in)));
    const f32x8 back = load8(b);
    alignas(16) float wide[8];
    store8(wide, back);
    for (int i = 0; i < 8; ++i) {
      const float want = static_cast<float>(BFloat16(in[i]));
      expect_same("bf16 store8", wide[i], want, i);
      expect_same("bf16 round8", got[i], want, i);
    }
  }
  float v8[8] = {3.f, -1.f, 7.5f, 2.f, -9.f, 0.25f, 7.f, 1.f};
  expect_same("hsum8", hsum8(load8(v8)),
              ((v8[0] + v8[4]) + (v8[2] + v8[6])) + ((v8[1] + v8[5]) + (v8[3] + v8[7])), 0);
  expect_same("hmax8", hmax8(load8(v8)), 7.5f, 0);
}
#endif  // HOUCHU_NEON

// argmax_row: torch.argmax's index (the first maximum; the first NaN if any).
void check_argmax() {
  for (int64_t n : {1, 3, 4, 8, 13, 1000, 49152}) {
    std::vector<float> x(n);
    for (int trial = 0; trial < 6; ++trial) {
      for (auto& v : x) v = static_cast<float>(static_cast<int>(rng() % 50));  // ties
      if (trial == 1) x[n - 1] = 100.f;
      if (trial == 2) x[(n * 2) / 3] = std::nanf("");
      if (trial == 3 && n > 5) x[n - 2] = x[n - 5] = std::nanf("");
      if (trial == 4) std::fill(x.begin(), x.end(), -std::numeric_limits<float>::infinity());
      int64_t want = 0;
      for (int64_t i = 0; i < n; ++i) {
        if (std::isnan(x[i])) {
          want = i;
          break;
        }
        if (x[i] > x[want]) want = i;
      }
      expect_same("argmax_row", static_cast<float>(argmax_row(x.data(), n)),
                  static_cast<float>(want), n);
    }
  }
}

}  // namespace

int main() {
#ifdef HOUCHU_NEON
  check_exp_bf16();
#endif
  check_argmax();
  for (int64_t H : {64, 128})
    for (int64_t m : {1, 2, 3, 4, 5, 9}) {
      check_int4<float, float>(m, 40, 64, 32, H);
      check_int4<BFloat16, BFloat16>(m, 32, 96, 32, H);
      check_int4<float, float>(m, 40, 64, 32, H, true);
      check_a8(m, 40, 64, 32, H);
    }
  check_int4<float, BFloat16>(1, 16, 48, 24, 64);  // G = 24: activation scales per 8
  check_int4<BFloat16, float>(3, 200, 256, 64, 64);
  check_a8(1, 24, 48, 24, 64);
  check_a8(3, 24, 48, 24, 128);
  check_a8(6, 200, 256, 64, 64);
  for (int64_t m : {1, 2, 4, 7}) {
    check_int8<float>(m, 40, 64);
    check_int8<BFloat16>(m, 24, 38);  // k not a multiple of 4
    check_int8<float>(m, 24, 150);    // a partial block of 64 inputs (int16 activations)
  }
  for (int64_t d : {64, 128})
    for (int64_t group : {1, 3, 8})
      for (int64_t len : {1, 7, 8, 17, 40}) {
        check_attention<float, float>(d, group, len, 0);
        check_attention<BFloat16, BFloat16>(d, group, len, 0);
        check_attention<BFloat16, int8_t>(d, group, len, 0);
        check_attention<float, int8_t>(d, group, len, 0);
      }
  check_attention<float, float>(64, 4, 40, 21);  // a sliding window's start
  check_attention<BFloat16, int8_t>(128, 2, 37, 16);
  check_norm_rope<float>(576, 64);
  check_norm_rope<BFloat16>(576, 64);
  check_norm_rope<BFloat16>(64, 128);
  std::printf("%d checks, %d failed\n", checks, failures);
  return failures == 0 ? 0 : 1;
}
