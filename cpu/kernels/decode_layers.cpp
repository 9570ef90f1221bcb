// The decoder layers of a decode step (every row one new token), all in one operator
// call and one parallel region. Each layer: RMSNorm -> qkv GEMV -> RoPE -> KV store ->
// paged attention -> o_proj GEMV -> residual add + RMSNorm -> gate_up GEMV -> SiLU·mul
// -> down GEMV -> residual add.
//
// Why: at batch 1 a layer is ten small kernels of 5-40 us each, and what the per-op path
// pays besides them (an operator dispatch, a thread-team wake-up and a few allocations
// per op, several hundred per step) is as large as the kernels' own time. Here the
// threads stay in one team for the whole step and meet at six barriers per layer; each
// GEMV splits its 16-feature blocks over the threads, work that every thread needs (the
// norms) is done by each thread for itself, and the SiLU·mul and the final residual add
// run on the thread that computed their inputs.
//
// The kernels are the per-op operators' own (gemv.h, norm_rope.h, attention.h), called
// in the same order with the same roundings, and every output element is computed by one
// thread whichever thread it is, so the result equals the per-op path's
// (houchu/model/llama.py's DecoderLayer.pre, the cpu attention backend, DecoderLayer.post)
// bit for bit, including the casts to and from the linear layers' activation dtype.
#include "aten.h"
#include "library.h"

#include <optional>
#include <vector>

#include "decode_layers.h"

namespace houchu_cpu {

using fused::HeadArgs;
using fused::LayerArgs;
using fused::run_layers;
using gemv::kBlock;
using gemv::PackedLinear;

// The first n decoder layers for B decode rows (one new token each), n = norms.size() / 2.
// Shapes and dtypes:
//   x: [B, hidden] residual stream, float32 or bfloat16 (T; contiguous);
//   cos, sin: [B, 1, D] RoPE tables in T;
//   norms: 2 n tensors [hidden] in T, layer l's input norm at 2 l, post-attention at 2 l + 1;
//   linears: 4 n int4_pack or int8_pack blobs, layer l's at 4 l .. 4 l + 3: qkv
//     [(H + 2 Hkv) D, hidden], o_proj [hidden, H D], gate_up [2 I, hidden] (gate | up,
//     I % 16 == 0) and down [hidden, I];
//   group_sizes: 4 n int4 group sizes (ignored for int8); out_features: 4 n output widths;
//   act_dtype: the linear layers' activation dtype (float32 or bfloat16);
//   k_cache, v_cache: [L, P, page_size, Hkv, D] in T, the pool (L >= n; layer l uses
//     [l]; written: each row's key and value at position lens[b] - 1), or int8 with
//     k_scale and v_scale (houchu/model/kv_pool.py's int8 pool);
//   pages: [B, n_pages] int64; lens: [B] int32, KV length with the new token;
//   scale: softmax scale;
//   final_norm, lm_head, head_group_size, vocab_size (optional, together): the model's
//     final norm weight [hidden] in T and its LM head as an int4_pack or int8_pack blob of
//     [vocab_size, hidden] (as the linears above);
//   k_scale, v_scale (optional, together): [L, P, page_size, Hkv] float16, an int8 pool's
//     per-(token, head) scales (written with the new keys and values);
//   int8_acts: the int4 linears quantize their inputs to int8 per group (W4A8, gemv_a8.h).
//   batch_invariant: the int4 linears with float activations (and an int4 head) sum each
//     row in one order whatever the row count (PackedLinear::invariant, gemv.h), as the
//     op-by-op GEMV does with int4_gemv(batch_invariant=True).
// Returns [B, hidden] in T: the residual stream after layer n - 1; with the head, [B,
// vocab_size] float32 logits instead.
// Raises c10::Error (RuntimeError) on malformed arguments.
at::Tensor decode_layers(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin,
                         at::TensorList norms, double eps, at::TensorList linears,
                         at::IntArrayRef group_sizes, at::IntArrayRef out_features,
                         at::ScalarType act_dtype, const at::Tensor& k_cache,
                         const at::Tensor& v_cache, const at::Tensor& pages,
                         const at::Tensor& lens, double scale,
                         const std::optional<at::Tensor>& final_norm,
                         const std::optional<at::Tensor>& lm_head, int64_t head_group_size,
                         int64_t vocab_size, const std::optional<at::Tensor>& k_scale,
                         const std::optional<at::Tensor>& v_scale, bool int8_acts,
                         bool batch_invariant) {
  const char* who = "decode_layers";
  const auto T = x.scalar_type();
  TORCH_CHECK(T == at::kFloat || T == at::kBFloat16, who, ": x must be float32 or bfloat16");
  TORCH_CHECK(act_dtype == at::kFloat || act_dtype == at::kBFloat16, who,
              ": act_dtype must be float32 or bfloat16");
  TORCH_CHECK(x.dim() == 2 && x.is_contiguous() && x.size(0) >= 1, who,
              ": x must be a contiguous [B, hidden] with B >= 1, got ", x.sizes());
  const int64_t n = static_cast<int64_t>(norms.size()) / 2;
  TORCH_CHECK(n >= 1 && norms.size() == static_cast<size_t>(2 * n), who,
              ": norms must hold 2 tensors per layer, got ", norms.size());
  TORCH_CHECK(linears.size() == static_cast<size_t>(4 * n) &&
                  group_sizes.size() == static_cast<size_t>(4 * n) &&
                  out_features.size() == static_cast<size_t>(4 * n),
              who, ": linears, group_sizes and out_features need 4 entries per layer (",
              4 * n, ")");
  const bool int8_pool = k_scale.has_value();
  const auto C = int8_pool ? at::kChar : T;
  TORCH_CHECK(k_scale.has_value() == v_scale.has_value(), who,
              ": give both KV scales or neither");
  TORCH_CHECK(k_cache.dim() == 5 && k_cache.is_contiguous() && v_cache.is_contiguous() &&
                  v_cache.sizes() == k_cache.sizes() && k_cache.scalar_type() == C &&
                  v_cache.scalar_type() == C,
              who, ": caches must be contiguous [L, P, page_size, Hkv, D] in x's dtype, or ",
              "int8 with k_scale and v_scale");
  if (int8_pool)
    for (const at::Tensor* sc : {&*k_scale, &*v_scale})
      TORCH_CHECK(sc->is_contiguous() && sc->scalar_type() == at::kHalf &&
                      sc->sizes() == k_cache.sizes().slice(0, 4),
                  who, ": KV scales must be contiguous [L, P, page_size, Hkv] float16");
  TORCH_CHECK(k_cache.size(0) >= n, who, ": the pool has ", k_cache.size(0), " layers, not ",
              n);
  const int64_t B = x.size(0), hidden = x.size(1);
  TORCH_CHECK(k_cache.size(4) % 2 == 0, who, ": head_dim must be even");
  for (const at::Tensor* c : {&cos, &sin})
    TORCH_CHECK(c->dim() == 3 && c->size(0) == B && c->size(2) == k_cache.size(4) &&
                    c->stride(2) == 1 && c->scalar_type() == T,
                who, ": cos and sin must be [B, 1, D] in x's dtype");
  TORCH_CHECK(pages.dim() == 2 && pages.size(0) == B && pages.is_contiguous() &&
                  pages.scalar_type() == at::kLong,
              who, ": pages must be a contiguous [B, n_pages] int64");
  TORCH_CHECK(lens.dim() == 1 && lens.size(0) == B && lens.is_contiguous() &&
                  lens.scalar_type() == at::kInt,
              who, ": lens must be a contiguous [B] int32");
  const int64_t ps = k_cache.size(2), n_pages = pages.size(1);
  const int64_t* pg = pages.data_ptr<int64_t>();
  const int32_t* ln = lens.data_ptr<int32_t>();
  int64_t max_len = 0;
  for (int64_t b = 0; b < B; ++b) {
    const int64_t len = ln[b];
    TORCH_CHECK(len >= 1 && len <= n_pages * ps, who, ": len ", len, " outside [1, ",
                n_pages * ps, "]");
    max_len = std::max(max_len, len);
    for (int64_t j = 0; j < (len + ps - 1) / ps; ++j)
      TORCH_CHECK(pg[b * n_pages + j] >= 0 && pg[b * n_pages + j] < k_cache.size(1), who,
                  ": page ", pg[b * n_pages + j], " outside the pool");
  }
  const int64_t layer_elems = k_cache[0].numel(), esize = k_cache.element_size();
  std::vector<LayerArgs> layers(n);
  for (int64_t l = 0; l < n; ++l) {
    LayerArgs& L = layers[l];
    L.B = B;
    L.hidden = hidden;
    L.ps = ps;
    L.Hkv = k_cache.size(3);
    L.D = k_cache.size(4);
    for (const at::Tensor& w : {norms[2 * l], norms[2 * l + 1]})
      TORCH_CHECK(w.dim() == 1 && w.size(0) == hidden && w.is_contiguous() &&
                      w.scalar_type() == T,
                  who, ": norm weights must be contiguous [hidden] in x's dtype");
    L.in_norm = norms[2 * l].data_ptr();
    L.post_norm = norms[2 * l + 1].data_ptr();
    L.qkv = PackedLinear::of(linears[4 * l], group_sizes[4 * l], out_features[4 * l], who);
    L.o = PackedLinear::of(linears[4 * l + 1], group_sizes[4 * l + 1], out_features[4 * l + 1],
                           who);
    L.gate_up = PackedLinear::of(linears[4 * l + 2], group_sizes[4 * l + 2],
                                 out_features[4 * l + 2], who);
    L.down = PackedLinear::of(linears[4 * l + 3], group_sizes[4 * l + 3],
                              out_features[4 * l + 3], who);
    for (PackedLinear* lin : {&L.qkv, &L.o, &L.gate_up, &L.down}) {
      lin->a8 = int8_acts && lin->int4;
      lin->invariant = batch_invariant && lin->int4 && !lin->a8;
    }
    const int64_t nq = L.qkv.n;
    TORCH_CHECK(nq % L.D == 0 && nq / L.D > 2 * L.Hkv && (nq / L.D - 2 * L.Hkv) % L.Hkv == 0,
                who, ": qkv's ", nq, " outputs are not (H + 2 Hkv) * D for Hkv = ", L.Hkv,
                ", D = ", L.D);
    L.H = nq / L.D - 2 * L.Hkv;
    L.I = L.gate_up.n / 2;
    TORCH_CHECK(L.qkv.fits(hidden) && L.o.n == hidden && L.o.fits(L.H * L.D) &&
                    L.gate_up.n % 2 == 0 && L.I % kBlock == 0 && L.gate_up.fits(hidden) &&
                    L.down.n == hidden && L.down.fits(L.I),
                who, ": layer ", l, "'s linears do not chain (hidden ", hidden, ", H*D ",
                L.H * L.D, ", gate_up ", L.gate_up.n,
                " outputs, which must be 2 I with I % 16 == 0)");
    TORCH_CHECK(l == 0 || (L.H == layers[0].H && L.I == layers[0].I), who,
                ": every layer must have the same shapes");
    L.n_pages = n_pages;
    L.pages = pg;
    L.lens = ln;
    L.max_len = max_len;
    L.eps = static_cast<float>(eps);
    L.scale = static_cast<float>(scale);
    L.cos = cos.data_ptr();
    L.sin = sin.data_ptr();
    L.cos_stride = cos.stride(0);
    L.sin_stride = sin.stride(0);
    L.k_cache = static_cast<char*>(k_cache.data_ptr()) + l * layer_elems * esize;
    L.v_cache = static_cast<char*>(v_cache.data_ptr()) + l * layer_elems * esize;
    if (int8_pool) {
      const int64_t per_layer = layer_elems / L.D;
      L.k_scale = k_scale->data_ptr<c10::Half>() + l * per_layer;
      L.v_scale = v_scale->data_ptr<c10::Half>() + l * per_layer;
    }
  }
  HeadArgs H;
  at::Tensor logits;
  TORCH_CHECK(final_norm.has_value() == lm_head.has_value(), who,
              ": final_norm and lm_head come together");
  if (lm_head.has_value()) {
    TORCH_CHECK(final_norm->dim() == 1 && final_norm->size(0) == hidden &&
                    final_norm->is_contiguous() && final_norm->scalar_type() == T,
                who, ": final_norm must be a contiguous [hidden] in x's dtype");
    H.on = true;
    H.norm = final_norm->data_ptr();
    H.p = PackedLinear::of(*lm_head, head_group_size, vocab_size, who);
    H.p.invariant = batch_invariant && H.p.int4;  // float activations
    TORCH_CHECK(H.p.fits(hidden), who, ": lm_head must be a blob of [vocab_size, hidden]");
    logits = at::empty({B, vocab_size}, x.options().dtype(at::kFloat));
    H.logits = logits.data_ptr<float>();
  }
  auto out = at::empty_like(x);
  const bool act_bf16 = act_dtype == at::kBFloat16;
  using BF = c10::BFloat16;
  if (T == at::kBFloat16) {
    const BF* xi = x.data_ptr<BF>();
    BF* o = out.data_ptr<BF>();
    act_bf16 ? run_layers<BF, BF>(layers, H, xi, o) : run_layers<BF, float>(layers, H, xi, o);
  } else {
    const float* xi = x.data_ptr<float>();
    float* o = out.data_ptr<float>();
    act_bf16 ? run_layers<float, BF>(layers, H, xi, o)
             : run_layers<float, float>(layers, H, xi, o);
  }
  return H.on ? logits : out;
}

}  // namespace houchu_cpu

HOUCHU_FRAGMENT(m) {
  m.def(
      "decode_layers(Tensor x, Tensor cos, Tensor sin, Tensor[] norms, float eps, "
      "Tensor[] linears, int[] group_sizes, int[] out_features, ScalarType act_dtype, "
      "Tensor(a!) k_cache, Tensor(b!) v_cache, Tensor pages, Tensor lens, float scale, "
      "Tensor? final_norm=None, Tensor? lm_head=None, int head_group_size=0, int vocab_size=0, "
      "Tensor(c!)? k_scale=None, Tensor(d!)? v_scale=None, bool int8_acts=False, "
      "bool batch_invariant=False) -> Tensor");
}

HOUCHU_IMPL(m) {
  m.impl("decode_layers", &houchu_cpu::decode_layers);
}
