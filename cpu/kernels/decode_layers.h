// The kernel of decode_layers.cpp's operator: one decode step's decoder layers (and the
// final norm and LM head) on the threads of one parallel region. See decode_layers.cpp
// for why and for the numerics.
#pragma once
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>
#include <utility>
#include <vector>

#include "attention.h"
#include "gemv.h"
#include "norm_rope.h"

namespace houchu_cpu {
namespace fused {

using gemv::Acts;
using gemv::kBlock;
using gemv::PackedLinear;

// Everything one layer reads and writes, checked by decode_layers.
struct LayerArgs {
  int64_t B = 0, hidden = 0, H = 0, Hkv = 0, D = 0, I = 0, ps = 0, n_pages = 0, max_len = 0;
  float eps = 0.f, scale = 0.f;
  PackedLinear qkv, o, gate_up, down;
  const void *cos = nullptr, *sin = nullptr, *in_norm = nullptr, *post_norm = nullptr;
  int64_t cos_stride = 0, sin_stride = 0;
  void *k_cache = nullptr, *v_cache = nullptr;  // this layer's [P, page_size, Hkv, D]
  c10::Half *k_scale = nullptr, *v_scale = nullptr;  // int8 pool: [P, page_size, Hkv]
  const int64_t* pages = nullptr;               // [B, n_pages]
  const int32_t* lens = nullptr;                // [B]
};

// The shared intermediates, all [B, width] row-major in the model dtype T.
template <typename T>
struct Shared {
  T *qkv, *q, *attn, *o, *gate_up, *act;
};

// Thread t's contiguous share [first, second) of n items over nt threads. Static shares
// beat handing out chunks dynamically here: each thread then streams one contiguous
// range of weights, which the hardware prefetchers follow (guided scheduling measured
// ~25% slower at batch 1).
inline std::pair<int64_t, int64_t> share(int64_t n, int t, int nt) {
  return {n * t / nt, n * (t + 1) / nt};
}

// Per-thread buffers, reused from call to call; one slot per use, so that no two uses
// share a buffer whatever the types.
enum Slot { kActIn, kActOut, kScores, kNorm, kResid, kNormed, kDown, kKey, kShared, kSlots };

template <typename T>
inline std::vector<T>& scratch(Slot slot, int64_t n) {
  thread_local std::vector<T> bufs[kSlots];
  if (static_cast<int64_t>(bufs[slot].size()) < n) bufs[slot].resize(n);
  return bufs[slot];
}

// A GEMV's input on the calling thread: in [B, k] (T) cast to the linear layer's
// activation dtype A and laid out for the kernels once, then any block range computed
// with `run`. The product is computed and rounded in A, then cast to T (x.to(A), the
// GEMV, y.to(T), as the Python linear layers do).
template <typename T, typename A>
class GemvInput {
 public:
  GemvInput(const PackedLinear& p, const T* in, int64_t B, int64_t k)
      : p_(p), B_(B), xa_(cast(in, B * k), B, k, k, 1, p.kpad, p.int4 ? p.G : 0, p.a8) {}

  // out[:, 16 b0 .. 16 b1) = in @ W.T for the blocks [b0, b1); out is [B, p.n].
  void run(T* out, int64_t b0, int64_t b1) const {
    if (b0 >= b1) return;
    if constexpr (std::is_same_v<T, A>) {
      gemv::run_blocks<T>(p_, xa_, B_, out, b0, b1);
    } else {
      std::vector<A>& y = scratch<A>(kActOut, B_ * p_.n);
      gemv::run_blocks<A>(p_, xa_, B_, y.data(), b0, b1);
      const int64_t c1 = std::min(p_.n, b1 * kBlock);
      for (int64_t r = 0; r < B_; ++r)
        for (int64_t c = b0 * kBlock; c < c1; ++c)
          out[r * p_.n + c] = static_cast<T>(static_cast<float>(y[r * p_.n + c]));
    }
  }

  // out[:, 16 b0 .. 16 b1) = in @ W.T in float32, never rounded to A or T (the logits).
  void run_float(float* out, int64_t b0, int64_t b1) const {
    if (b0 < b1) gemv::run_blocks<float>(p_, xa_, B_, out, b0, b1);
  }

 private:
  static const A* cast(const T* in, int64_t n) {
    if constexpr (std::is_same_v<T, A>) {
      return in;
    } else {
      std::vector<A>& xin = scratch<A>(kActIn, n);
      for (int64_t i = 0; i < n; ++i) xin[i] = static_cast<A>(static_cast<float>(in[i]));
      return xin.data();
    }
  }

  const PackedLinear& p_;
  int64_t B_;
  Acts xa_;
};

// Per-(token, head) symmetric int8 quantization of one row x [D], exactly as
// houchu/model/kv_pool.py's quantize_kv: scale = clamp(amax|x| / 127, 2^-14, 65504) rounded
// to float16, q = round_half_even(clamp(x / scale, -127, 127)).
template <typename T>
void quantize_kv_row(const T* x, int64_t d, int8_t* q, c10::Half* scale) {
  float amax = 0.f;
  for (int64_t j = 0; j < d; ++j) amax = std::max(amax, std::abs(static_cast<float>(x[j])));
  const c10::Half h(std::min(std::max(amax / 127.f, 0x1p-14f), 65504.f));
  const float sf = static_cast<float>(h);
  for (int64_t j = 0; j < d; ++j) {
    const float y = std::min(std::max(static_cast<float>(x[j]) / sf, -127.f), 127.f);
    q[j] = static_cast<int8_t>(std::nearbyint(y));
  }
  *scale = h;
}

// The new token's key (rotated) and value for row b and KV head kvh, written to the
// row's newest KV slot (position lens[b] - 1), quantized in an int8 pool.
template <typename T>
void store_kv(const LayerArgs& L, const Shared<T>& S, int64_t b, int64_t kvh) {
  const int64_t H = L.H, Hkv = L.Hkv, D = L.D, nq = (H + 2 * Hkv) * D;
  const T* row = S.qkv + b * nq;
  const int64_t pos = L.lens[b] - 1;
  const int64_t slot = L.pages[b * L.n_pages + pos / L.ps] * L.ps + pos % L.ps;
  const int64_t at = slot * Hkv + kvh;  // the (slot, head) row of the pool
  const T* c = static_cast<const T*>(L.cos) + b * L.cos_stride;
  const T* s = static_cast<const T*>(L.sin) + b * L.sin_stride;
  const T* v = row + (H + Hkv + kvh) * D;
  if (L.k_scale == nullptr) {
    rope_row<T>(row + (H + kvh) * D, c, s, static_cast<T*>(L.k_cache) + at * D, D);
    std::memcpy(static_cast<T*>(L.v_cache) + at * D, v, D * sizeof(T));
    return;
  }
  std::vector<T>& k = scratch<T>(kKey, D);
  rope_row<T>(row + (H + kvh) * D, c, s, k.data(), D);
  quantize_kv_row<T>(k.data(), D, static_cast<int8_t*>(L.k_cache) + at * D, L.k_scale + at);
  quantize_kv_row<T>(v, D, static_cast<int8_t*>(L.v_cache) + at * D, L.v_scale + at);
}

// n query heads q [n, D] of KV head kvh over len positions of this layer's pool, whose
// elements are C (T, or int8_t with L's scales): the group kernel (AVX-512's, AVX2's or
// NEON's) where it applies, else the portable one head by head. out: [n, D].
template <typename T, typename C>
void attend_pool(const LayerArgs& L, const T* q, int64_t n, const int64_t* pages, int64_t len,
                 int64_t kvh, T* out) {
  const int64_t Hkv = L.Hkv, D = L.D;
  const C* kc = static_cast<const C*>(L.k_cache);
  const C* vc = static_cast<const C*>(L.v_cache);
#if defined(HOUCHU_AVX512) || defined(HOUCHU_AVX2) || defined(HOUCHU_NEON)
  if constexpr (kVec<T>) {
    if ((D == 64 || D == 128) && n <= attn::kMaxGroup) {
      std::vector<float>& sc = scratch<float>(kScores, n * L.max_len);
      attn::attend_group<T, C>(q, D, kc, vc, pages, len, L.ps, Hkv, kvh, n, D, L.scale, out,
                               sc.data(), L.k_scale, L.v_scale);
      return;
    }
  }
#endif
  // acc [D], qf [D], tile [page_size, D], scores [len]
  float* f = scratch<float>(kScores, L.max_len + (2 + L.ps) * D).data();
  for (int64_t g = 0; g < n; ++g)
    attn::attend_one<T, C>(q + g * D, kc, vc, L.k_scale, L.v_scale, pages, len, L.ps, Hkv, kvh,
                           D, L.scale, out + g * D, f + (2 + L.ps) * D, f, f + D, f + 2 * D);
}

// Query heads [h0, h1) of row b, all of KV head h0 / G: rotated, then attending over the
// row's lens[b] positions (the new one, stored by store_kv, included).
template <typename T>
void attend_heads(const LayerArgs& L, const Shared<T>& S, int64_t b, int64_t h0, int64_t h1) {
  const int64_t H = L.H, Hkv = L.Hkv, D = L.D, G = H / Hkv, nq = (H + 2 * Hkv) * D;
  const int64_t kvh = h0 / G, n = h1 - h0, len = L.lens[b];
  const T* c = static_cast<const T*>(L.cos) + b * L.cos_stride;
  const T* s = static_cast<const T*>(L.sin) + b * L.sin_stride;
  T* q = S.q + (b * H + h0) * D;
  for (int64_t h = h0; h < h1; ++h) rope_row<T>(S.qkv + b * nq + h * D, c, s, q + (h - h0) * D, D);
  const int64_t* pages = L.pages + b * L.n_pages;
  T* out = S.attn + (b * H + h0) * D;
  if (L.k_scale != nullptr)  // int8 pool: rows dequantized as the per-op path does
    attend_pool<T, int8_t>(L, q, n, pages, len, kvh, out);
  else
    attend_pool<T, T>(L, q, n, pages, len, kvh, out);
}

// Attention items of a layer: a KV head's G query heads share each K/V load, but with
// fewer groups than a few per thread they are split into chunks of heads to balance.
inline int64_t head_chunks(const LayerArgs& L, int nt) {
  const int64_t G = L.H / L.Hkv, groups = L.B * L.Hkv;
  return std::min<int64_t>(G, (4 * nt + groups - 1) / groups);
}

// Thread t's attention items [a0, a1) of n = B * Hkv * chunks (item i: row
// i / (Hkv * chunks)): contiguous ranges of near-equal work, each item costing its row's
// length plus a fixed overhead, so that a thread given the longer rows does not keep the
// other waiting at the barrier (an even count of items did at 16 rows of mixed lengths).
inline std::pair<int64_t, int64_t> share_attention(const LayerArgs& L, int64_t chunks, int t,
                                                   int nt) {
  const int64_t n = L.B * L.Hkv * chunks, per_row = L.Hkv * chunks;
  constexpr int64_t kItemCost = 16;  // positions' worth of a item's fixed work
  int64_t total = 0;
  for (int64_t b = 0; b < L.B; ++b) total += per_row * (L.lens[b] + kItemCost);
  auto boundary = [&](int64_t part) {  // first item whose work starts at or past the cut
    if (part <= 0) return int64_t{0};
    if (part >= nt) return n;
    const int64_t cut = total * part / nt;
    int64_t done = 0;
    for (int64_t i = 0; i < n; ++i) {
      if (done >= cut) return i;
      done += L.lens[i / per_row] + kItemCost;
    }
    return n;
  };
  return {boundary(t), boundary(t + 1)};
}

// Layer L on thread t of nt (called inside the parallel region): reads the residual
// stream x [B, hidden], writes the layer's output to out [B, hidden] (out may be x: x is
// last read before the barrier that precedes the first write).
template <typename T, typename A>
void layer_thread(const LayerArgs& L, const Shared<T>& S, const T* x, T* out, int t, int nt) {
  const int64_t B = L.B, hid = L.hidden, HD = L.H * L.D, I = L.I;
  const T* in_norm = static_cast<const T*>(L.in_norm);
  const T* post_norm = static_cast<const T*>(L.post_norm);
  std::vector<float>& fbuf = scratch<float>(kNorm, hid);
  std::vector<T>& resid = scratch<T>(kResid, B * hid);  // x + o_proj(attention)
  std::vector<T>& h = scratch<T>(kNormed, B * hid);      // a normed copy, this thread's own

  // input norm (every thread, all rows), then qkv blocks
  for (int64_t r = 0; r < B; ++r)
    rms_norm_row<T>(x + r * hid, in_norm, h.data() + r * hid, hid, L.eps, nullptr, nullptr,
                    fbuf.data());
  {
    const GemvInput<T, A> in(L.qkv, h.data(), B, hid);
    const auto [b0, b1] = share(L.qkv.nb, t, nt);
    in.run(S.qkv, b0, b1);
  }
#pragma omp barrier
  const int64_t kv_items = B * L.Hkv;
  for (int64_t i = kv_items * t / nt; i < kv_items * (t + 1) / nt; ++i)
    store_kv<T>(L, S, i / L.Hkv, i % L.Hkv);
#pragma omp barrier
  const int64_t G = L.H / L.Hkv, chunks = head_chunks(L, nt);
  const auto [a0, a1] = share_attention(L, chunks, t, nt);
  for (int64_t i = a0; i < a1; ++i) {
    const int64_t grp = i / chunks, ch = i % chunks;
    const int64_t b = grp / L.Hkv, first = grp % L.Hkv * G;
    attend_heads<T>(L, S, b, first + G * ch / chunks, first + G * (ch + 1) / chunks);
  }
#pragma omp barrier
  {
    const GemvInput<T, A> in(L.o, S.attn, B, HD);
    const auto [b0, b1] = share(L.o.nb, t, nt);
    in.run(S.o, b0, b1);
  }
#pragma omp barrier
  // residual add + post-attention norm (every thread), gate and up blocks of the same
  // features, and their SiLU·mul
  for (int64_t r = 0; r < B; ++r)
    rms_norm_row<T>(x + r * hid, post_norm, h.data() + r * hid, hid, L.eps,
                    resid.data() + r * hid, S.o + r * hid, fbuf.data());
  {
    const int64_t half = I / kBlock;
    const GemvInput<T, A> in(L.gate_up, h.data(), B, hid);
    const auto [g0, g1] = share(half, t, nt);
    in.run(S.gate_up, g0, g1);
    in.run(S.gate_up, half + g0, half + g1);
    for (int64_t r = 0; r < B; ++r)
      silu_mul_span<T>(S.gate_up + r * 2 * I, S.gate_up + r * 2 * I + I, S.act + r * I,
                       g0 * kBlock, g1 * kBlock);
  }
#pragma omp barrier
  // down blocks, added to the residual
  std::vector<T>& y = scratch<T>(kDown, B * hid);
  const GemvInput<T, A> in(L.down, S.act, B, I);
  const auto [d0, d1] = share(L.down.nb, t, nt);
  in.run(y.data(), d0, d1);
  const int64_t c1 = std::min(hid, d1 * kBlock);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t c = d0 * kBlock; c < c1; ++c)
      out[r * hid + c] = static_cast<T>(static_cast<float>(resid[r * hid + c]) +
                                        static_cast<float>(y[r * hid + c]));
}

// The model's final RMSNorm and LM head, when the call computes them.
struct HeadArgs {
  bool on = false;
  const void* norm = nullptr;  // [hidden] in T
  PackedLinear p;              // [V, hidden]
  float* logits = nullptr;     // [B, V]
};

// logits[:, this thread's blocks] = head(RMSNorm(x)) in float32, as the per-op path's
// LM head (Int8Linear.float_out) computes them: the products summed in float32 and never
// rounded to the activation dtype (bfloat16 logits turn near-ties into exact ties).
template <typename T, typename A>
void head_thread(const HeadArgs& H, const T* x, int64_t B, int64_t hid, float eps, int t,
                 int nt) {
  std::vector<float>& fbuf = scratch<float>(kNorm, hid);
  std::vector<T>& h = scratch<T>(kNormed, B * hid);
  for (int64_t r = 0; r < B; ++r)
    rms_norm_row<T>(x + r * hid, static_cast<const T*>(H.norm), h.data() + r * hid, hid, eps,
                    nullptr, nullptr, fbuf.data());
  const GemvInput<T, A> in(H.p, h.data(), B, hid);
  const auto [b0, b1] = share(H.p.nb, t, nt);
  in.run_float(H.logits, b0, b1);
}

// All layers, x [B, hidden] -> out [B, hidden], then the head if H.on, in one parallel
// region.
template <typename T, typename A>
void run_layers(const std::vector<LayerArgs>& layers, const HeadArgs& H, const T* x, T* out) {
  const LayerArgs& L0 = layers.front();
  const int64_t B = L0.B, HD = L0.H * L0.D, nq = (L0.H + 2 * L0.Hkv) * L0.D;
  std::vector<T>& buf = scratch<T>(kShared, B * (nq + 3 * HD + L0.hidden + 3 * L0.I));
  T* p = buf.data();
  Shared<T> S;
  S.qkv = p;
  S.q = S.qkv + B * nq;
  S.attn = S.q + B * HD;
  S.o = S.attn + B * HD;
  S.gate_up = S.o + B * L0.hidden;
  S.act = S.gate_up + B * 2 * L0.I;
  const int nt = std::max(1, at::get_num_threads());
#pragma omp parallel num_threads(nt)
  {
    const int t = omp_get_thread_num(), team = omp_get_num_threads();
    for (size_t l = 0; l < layers.size(); ++l) {
      layer_thread<T, A>(layers[l], S, l == 0 ? x : out, out, t, team);
#pragma omp barrier
    }
    if (H.on) head_thread<T, A>(H, out, B, L0.hidden, L0.eps, t, team);
  }
}

}  // namespace fused
}  // namespace houchu_cpu
