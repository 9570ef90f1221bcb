// One whole Llama decoder layer for a decode step (every row one new token), in one
// operator call and one parallel region: RMSNorm -> qkv GEMV -> RoPE -> KV store ->
// paged attention -> o_proj GEMV -> residual add + RMSNorm -> gate_up GEMV -> SiLU·mul
// -> down GEMV -> residual add.
//
// Why: at batch 1 a layer is ten small kernels of 5-40 us each, and what the per-op path
// pays besides them (an operator dispatch, a thread-team wake-up and a few allocations
// per op, several hundred per step) is as large as the kernels' own time. Here the
// threads stay in one team for the whole layer and meet at five barriers; each GEMV
// splits its 16-feature blocks over the threads, work that every thread needs (the
// norms) is done by each thread for itself, and the SiLU·mul and the final residual add
// run on the thread that computed their inputs.
//
// The kernels are the per-op operators' own (gemv.h, norm_rope.h, attention.h), called
// in the same order with the same roundings, so the result equals the per-op path's
// (houchu/gpu/llama.py's DecoderLayer.pre, the cpu attention backend, DecoderLayer.post)
// bit for bit, including the casts to and from the linear layers' activation dtype.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include <omp.h>
#include <torch/library.h>

#include <algorithm>
#include <cstring>
#include <type_traits>
#include <vector>

#include "attention.h"
#include "gemv.h"
#include "norm_rope.h"

namespace houchu_cpu {
namespace {

using gemv::Acts;
using gemv::kBlock;
using gemv::PackedLinear;

// Everything one layer call reads and writes, checked by decode_layer.
struct LayerArgs {
  int64_t B = 0, hidden = 0, H = 0, Hkv = 0, D = 0, I = 0, ps = 0, n_pages = 0, max_len = 0;
  float eps = 0.f, scale = 0.f;
  PackedLinear qkv, o, gate_up, down;
  const void *x = nullptr, *cos = nullptr, *sin = nullptr, *in_norm = nullptr,
             *post_norm = nullptr;
  int64_t cos_stride = 0, sin_stride = 0;
  void *k_cache = nullptr, *v_cache = nullptr;
  const int64_t* pages = nullptr;  // [B, n_pages]
  const int32_t* lens = nullptr;   // [B]
  void* out = nullptr;             // [B, hidden]
};

// The shared intermediates, all [B, width] row-major in the model dtype T.
template <typename T>
struct Shared {
  T *qkv, *q, *attn, *o, *gate_up, *act;
};

// Thread t's contiguous share [first, second) of n items over nt threads.
inline std::pair<int64_t, int64_t> share(int64_t n, int t, int nt) {
  return {n * t / nt, n * (t + 1) / nt};
}

// Per-thread buffers, reused from call to call; one slot per use, so that no two uses
// share a buffer whatever the types.
enum Slot { kActIn, kActOut, kScores, kNorm, kResid, kNormed, kDown, kShared, kSlots };

template <typename T>
inline std::vector<T>& scratch(Slot slot, int64_t n) {
  thread_local std::vector<T> bufs[kSlots];
  if (static_cast<int64_t>(bufs[slot].size()) < n) bufs[slot].resize(n);
  return bufs[slot];
}

// out[:, 16 b0 .. 16 b1) = in @ W.T for the blocks [b0, b1) of p, with the linear
// layer's activation dtype A: in (T) is cast to A, the product is computed and rounded in
// A, then cast back to T (x.to(A), the GEMV, y.to(T), as the Python linear layers do).
template <typename T, typename A>
void gemv_blocks(const PackedLinear& p, const T* in, int64_t B, int64_t k, T* out, int64_t b0,
                 int64_t b1) {
  if (b0 >= b1) return;
  const int64_t group = p.int4 ? p.G : 0;
  if constexpr (std::is_same_v<T, A>) {
    const Acts xa(in, B, k, k, 1, p.kpad, group);
    gemv::run_blocks<T>(p, xa, B, out, b0, b1);
  } else {
    std::vector<A>& xin = scratch<A>(kActIn, B * k);
    for (int64_t i = 0; i < B * k; ++i) xin[i] = static_cast<A>(static_cast<float>(in[i]));
    const Acts xa(xin.data(), B, k, k, 1, p.kpad, group);
    std::vector<A>& y = scratch<A>(kActOut, B * p.n);
    gemv::run_blocks<A>(p, xa, B, y.data(), b0, b1);
    const int64_t c1 = std::min(p.n, b1 * kBlock);
    for (int64_t r = 0; r < B; ++r)
      for (int64_t c = b0 * kBlock; c < c1; ++c)
        out[r * p.n + c] = static_cast<T>(static_cast<float>(y[r * p.n + c]));
  }
}

// The new token's key (rotated) and value for row b and KV head kvh, written to the
// row's newest KV slot (position lens[b] - 1).
template <typename T>
void store_kv(const LayerArgs& L, const Shared<T>& S, int64_t b, int64_t kvh) {
  const int64_t H = L.H, Hkv = L.Hkv, D = L.D, nq = (H + 2 * Hkv) * D;
  const T* row = S.qkv + b * nq;
  const int64_t pos = L.lens[b] - 1;
  const int64_t slot = L.pages[b * L.n_pages + pos / L.ps] * L.ps + pos % L.ps;
  const T* c = static_cast<const T*>(L.cos) + b * L.cos_stride;
  const T* s = static_cast<const T*>(L.sin) + b * L.sin_stride;
  rope_row<T>(row + (H + kvh) * D, c, s, static_cast<T*>(L.k_cache) + (slot * Hkv + kvh) * D, D);
  std::memcpy(static_cast<T*>(L.v_cache) + (slot * Hkv + kvh) * D, row + (H + Hkv + kvh) * D,
              D * sizeof(T));
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
  const T* kc = static_cast<const T*>(L.k_cache);
  const T* vc = static_cast<const T*>(L.v_cache);
  T* out = S.attn + (b * H + h0) * D;
#ifdef HOUCHU_AVX512
  if constexpr (kVec<T>) {
    if ((D == 64 || D == 128) && n <= attn::kMaxGroup) {
      std::vector<float>& sc = scratch<float>(kScores, n * L.max_len);
      if (D == 64)
        attn::attend_group_avx512<T, 4>(q, D, kc, vc, pages, len, L.ps, Hkv, kvh, n, L.scale,
                                        out, sc.data());
      else
        attn::attend_group_avx512<T, 8>(q, D, kc, vc, pages, len, L.ps, Hkv, kvh, n, L.scale,
                                        out, sc.data());
      return;
    }
  }
#endif
  // acc [D], qf [D], tile [page_size, D], scores [len]
  std::vector<float>& sc = scratch<float>(kScores, L.max_len + (2 + L.ps) * D);
  float* f = sc.data();
  for (int64_t g = 0; g < n; ++g)
    attn::attend_one<T, T>(q + g * D, kc, vc, nullptr, nullptr, pages, len, L.ps, Hkv, kvh, D,
                           L.scale, out + g * D, f + (2 + L.ps) * D, f, f + D, f + 2 * D);
}

// The whole layer on thread t of nt (called inside the parallel region).
template <typename T, typename A>
void layer_thread(const LayerArgs& L, const Shared<T>& S, int t, int nt) {
  const int64_t B = L.B, hid = L.hidden, HD = L.H * L.D, I = L.I;
  const T* x = static_cast<const T*>(L.x);
  const T* in_norm = static_cast<const T*>(L.in_norm);
  const T* post_norm = static_cast<const T*>(L.post_norm);
  std::vector<float>& fbuf = scratch<float>(kNorm, hid);
  std::vector<T>& resid = scratch<T>(kResid, B * hid);  // x + o_proj(attention)
  std::vector<T>& h = scratch<T>(kNormed, B * hid);      // a normed copy, this thread's own

  // input norm (every thread, all rows), then this thread's qkv blocks
  for (int64_t r = 0; r < B; ++r)
    rms_norm_row<T>(x + r * hid, in_norm, h.data() + r * hid, hid, L.eps, nullptr, nullptr,
                    fbuf.data());
  auto [q0, q1] = share(L.qkv.nb, t, nt);
  gemv_blocks<T, A>(L.qkv, h.data(), B, hid, S.qkv, q0, q1);
#pragma omp barrier
  auto [k0, k1] = share(B * L.Hkv, t, nt);
  for (int64_t i = k0; i < k1; ++i) store_kv<T>(L, S, i / L.Hkv, i % L.Hkv);
#pragma omp barrier
  // attention items: a KV head's G query heads share each K/V load, but with fewer
  // groups than a few per thread they are split into chunks of heads to balance
  const int64_t G = L.H / L.Hkv, groups = B * L.Hkv;
  const int64_t chunks = std::min<int64_t>(G, (4 * nt + groups - 1) / groups);
  auto [a0, a1] = share(groups * chunks, t, nt);
  for (int64_t i = a0; i < a1; ++i) {
    const int64_t grp = i / chunks, ch = i % chunks;
    const int64_t b = grp / L.Hkv, first = grp % L.Hkv * G;
    attend_heads<T>(L, S, b, first + G * ch / chunks, first + G * (ch + 1) / chunks);
  }
#pragma omp barrier
  auto [o0, o1] = share(L.o.nb, t, nt);
  gemv_blocks<T, A>(L.o, S.attn, B, HD, S.o, o0, o1);
#pragma omp barrier
  // residual add + post-attention norm (every thread), gate and up blocks of the same
  // features, and their SiLU·mul
  for (int64_t r = 0; r < B; ++r)
    rms_norm_row<T>(x + r * hid, post_norm, h.data() + r * hid, hid, L.eps,
                    resid.data() + r * hid, S.o + r * hid, fbuf.data());
  const int64_t half = I / kBlock;
  auto [g0, g1] = share(half, t, nt);
  gemv_blocks<T, A>(L.gate_up, h.data(), B, hid, S.gate_up, g0, g1);
  gemv_blocks<T, A>(L.gate_up, h.data(), B, hid, S.gate_up, half + g0, half + g1);
  for (int64_t r = 0; r < B; ++r)
    silu_mul_span<T>(S.gate_up + r * 2 * I, S.gate_up + r * 2 * I + I, S.act + r * I,
                     g0 * kBlock, g1 * kBlock);
#pragma omp barrier
  // this thread's down blocks, added to the residual
  auto [d0, d1] = share(L.down.nb, t, nt);
  std::vector<T>& y = scratch<T>(kDown, B * hid);
  gemv_blocks<T, A>(L.down, S.act, B, I, y.data(), d0, d1);
  T* out = static_cast<T*>(L.out);
  const int64_t c1 = std::min(hid, d1 * kBlock);
  for (int64_t r = 0; r < B; ++r)
    for (int64_t c = d0 * kBlock; c < c1; ++c)
      out[r * hid + c] = static_cast<T>(static_cast<float>(resid[r * hid + c]) +
                                        static_cast<float>(y[r * hid + c]));
}

template <typename T, typename A>
void run_layer(const LayerArgs& L) {
  const int64_t B = L.B, HD = L.H * L.D, nq = (L.H + 2 * L.Hkv) * L.D;
  std::vector<T>& buf = scratch<T>(kShared, B * (nq + 3 * HD + L.hidden + 3 * L.I));
  T* p = buf.data();
  Shared<T> S;
  S.qkv = p;
  S.q = S.qkv + B * nq;
  S.attn = S.q + B * HD;
  S.o = S.attn + B * HD;
  S.gate_up = S.o + B * L.hidden;
  S.act = S.gate_up + B * 2 * L.I;
  const int nt = std::max(1, at::get_num_threads());
#pragma omp parallel num_threads(nt)
  layer_thread<T, A>(L, S, omp_get_thread_num(), omp_get_num_threads());
}

}  // namespace

// One decoder layer for B decode rows (one new token each). Shapes and dtypes:
//   x: [B, hidden] residual stream, float32 or bfloat16 (T; contiguous);
//   cos, sin: [B, 1, D] RoPE tables in T; in_norm, post_norm: [hidden] in T;
//   qkv, o_proj, gate_up, down: int4_pack or int8_pack blobs of [(H + 2 Hkv) D, hidden],
//     [hidden, H D], [2 I, hidden] (gate | up, I % 16 == 0) and [hidden, I];
//   group_sizes: the int4 group size of each (ignored for int8), out_features: their N;
//   act_dtype: the linear layers' activation dtype (float32 or bfloat16);
//   k_cache, v_cache: [P, page_size, Hkv, D] in T, this layer's pool (written: each
//     row's key and value at position lens[b] - 1);
//   pages: [B, n_pages] int64; lens: [B] int32, KV length with the new token;
//   scale: softmax scale.
// Returns [B, hidden] in T: the layer's output residual stream.
at::Tensor decode_layer(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                        const at::Tensor& in_norm, const at::Tensor& post_norm, double eps,
                        const at::Tensor& qkv, const at::Tensor& o_proj,
                        const at::Tensor& gate_up, const at::Tensor& down,
                        at::IntArrayRef group_sizes, at::IntArrayRef out_features,
                        at::ScalarType act_dtype, const at::Tensor& k_cache,
                        const at::Tensor& v_cache, const at::Tensor& pages,
                        const at::Tensor& lens, double scale) {
  const char* who = "decode_layer";
  const auto T = x.scalar_type();
  TORCH_CHECK(T == at::kFloat || T == at::kBFloat16, who, ": x must be float32 or bfloat16");
  TORCH_CHECK(act_dtype == at::kFloat || act_dtype == at::kBFloat16, who,
              ": act_dtype must be float32 or bfloat16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(0) >= 1, who,
              ": x must be a contiguous [B, hidden] with B >= 1, got ", x.sizes());
  TORCH_CHECK(group_sizes.size() == 4 && out_features.size() == 4, who,
              ": group_sizes and out_features need one entry per linear (4)");
  LayerArgs L;
  L.B = x.size(0);
  L.hidden = x.size(1);
  for (const at::Tensor* w : {&in_norm, &post_norm})
    TORCH_CHECK(w->dim() == 1 && w->size(0) == L.hidden && w->is_contiguous() &&
                    w->scalar_type() == T,
                who, ": norm weights must be contiguous [hidden] in x's dtype");
  TORCH_CHECK(k_cache.dim() == 4 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && k_cache.scalar_type() == T &&
                  v_cache.scalar_type() == T,
              who, ": caches must be contiguous [P, page_size, Hkv, D] in x's dtype");
  L.ps = k_cache.size(1);
  L.Hkv = k_cache.size(2);
  L.D = k_cache.size(3);
  TORCH_CHECK(L.D % 2 == 0, who, ": head_dim must be even");
  L.qkv = PackedLinear::of(qkv, group_sizes[0], out_features[0], who);
  L.o = PackedLinear::of(o_proj, group_sizes[1], out_features[1], who);
  L.gate_up = PackedLinear::of(gate_up, group_sizes[2], out_features[2], who);
  L.down = PackedLinear::of(down, group_sizes[3], out_features[3], who);
  const int64_t nq = L.qkv.n;
  TORCH_CHECK(nq % L.D == 0 && nq / L.D > 2 * L.Hkv && (nq / L.D - 2 * L.Hkv) % L.Hkv == 0,
              who, ": qkv's ", nq, " outputs are not (H + 2 Hkv) * D for Hkv = ", L.Hkv,
              ", D = ", L.D);
  L.H = nq / L.D - 2 * L.Hkv;
  L.I = L.gate_up.n / 2;
  TORCH_CHECK(L.qkv.fits(L.hidden) && L.o.n == L.hidden && L.o.fits(L.H * L.D) &&
                  L.gate_up.n % 2 == 0 && L.I % kBlock == 0 && L.gate_up.fits(L.hidden) &&
                  L.down.n == L.hidden && L.down.fits(L.I),
              who, ": the linears' shapes do not chain (hidden ", L.hidden, ", H*D ",
              L.H * L.D, ", gate_up ", L.gate_up.n, " outputs, which must be 2 I with I % 16 == 0)");
  for (const at::Tensor* c : {&cos, &sin})
    TORCH_CHECK(c->dim() == 3 && c->size(0) == L.B && c->size(2) == L.D && c->stride(2) == 1 &&
                    c->scalar_type() == T,
                who, ": cos and sin must be [B, 1, D] in x's dtype");
  TORCH_CHECK(pages.dim() == 2 && pages.size(0) == L.B && pages.is_contiguous() &&
                  pages.scalar_type() == at::kLong,
              who, ": pages must be a contiguous [B, n_pages] int64");
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == L.B && lens.is_contiguous() &&
                  lens.scalar_type() == at::kInt,
              who, ": lens must be a contiguous [B] int32");
  L.n_pages = pages.size(1);
  L.pages = pages.data_ptr<int64_t>();
  L.lens = lens.data_ptr<int32_t>();
  for (int64_t b = 0; b < L.B; ++b) {
    const int64_t len = L.lens[b];
    TORCH_CHECK(len >= 1 && len <= L.n_pages * L.ps, who, ": len ", len, " outside [1, ",
                L.n_pages * L.ps, "]");
    L.max_len = std::max(L.max_len, len);
    for (int64_t j = 0; j < (len + L.ps - 1) / L.ps; ++j) {
      const int64_t pg = L.pages[b * L.n_pages + j];
      TORCH_CHECK(pg >= 0 && pg < k_cache.size(0), who, ": page ", pg, " outside the pool");
    }
  }
  L.eps = static_cast<float>(eps);
  L.scale = static_cast<float>(scale);
  L.x = x.data_ptr();
  L.cos = cos.data_ptr();
  L.sin = sin.data_ptr();
  L.cos_stride = cos.stride(0);
  L.sin_stride = sin.stride(0);
  L.in_norm = in_norm.data_ptr();
  L.post_norm = post_norm.data_ptr();
  L.k_cache = k_cache.data_ptr();
  L.v_cache = v_cache.data_ptr();
  auto out = at::empty_like(x);
  L.out = out.data_ptr();
  const bool act_bf16 = act_dtype == at::kBFloat16;
  if (T == at::kBFloat16)
    act_bf16 ? run_layer<c10::BFloat16, c10::BFloat16>(L) : run_layer<c10::BFloat16, float>(L);
  else
    act_bf16 ? run_layer<float, c10::BFloat16>(L) : run_layer<float, float>(L);
  return out;
}

}  // namespace houchu_cpu

TORCH_LIBRARY_FRAGMENT(houchu_cpu, m) {
  m.def(
      "decode_layer(Tensor x, Tensor cos, Tensor sin, Tensor in_norm, Tensor post_norm, "
      "float eps, Tensor qkv, Tensor o_proj, Tensor gate_up, Tensor down, int[] group_sizes, "
      "int[] out_features, ScalarType act_dtype, Tensor(a!) k_cache, Tensor(b!) v_cache, "
      "Tensor pages, Tensor lens, float scale) -> Tensor");
}

TORCH_LIBRARY_IMPL(houchu_cpu, CPU, m) {
  m.impl("decode_layer", &houchu_cpu::decode_layer);
}
