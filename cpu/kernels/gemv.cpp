// Weight-only int4 / int8 GEMV for the CPU (decode: M = 1..8 activation rows). int4, with
// exact activations: x is used as it is (bfloat16 exactly; float32 split into three
// bfloat16 terms hi + mid + lo that sum to it exactly), products are exact and sums are
// float32, so results equal x.float() @ w.float().T up to float32 summation order, where
// w is the dense weight built in float32 from the stored codes, scales and offsets
// (int8_acts: x quantized to int8, gemv_a8.h). int8: on x86 x quantized to int16
// (gemv_a16.h), elsewhere exact as int4's.
//
// Operators (torch.ops.houchu_cpu.*):
//   int4_pack(q, scale, offset, group_size) -> packed     once, at model load
//   int4_gemv(x, packed, group_size, out_features, int8_acts=False, batch_invariant=False,
//     float_out=False) -> y (batch_invariant: each row's sums in one order whatever the
//     row count, so a row's output is bit for bit independent of the other rows; float
//     activations; float_out: float32 y from bfloat16 x, as an LM head's logits want)
//   int8_pack(q, scale) -> packed                         once, at model load
//   int8_gemv(x, packed, out_features, float_out=False) -> y (float_out: float32 y
//     from bfloat16 x, as an LM head's logits want: no rounding to bfloat16)
// Each packed weight is one tensor (a Tensor[] argument costs ~0.5 us more per call).
//
// Both weight layouts group output features in blocks of 16 (one AVX-512 lane per
// feature) and are contiguous per block, so each thread streams one contiguous range.
// int4: the inner product uses vdpbf16ps (AVX512_BF16: 16 lanes x 2 products per
// instruction, exact products, float32 accumulation): an int4 code is exact in bfloat16.
// int4 codes become bfloat16 with one vpermw table lookup per 32 codes; per group g,
// sum_k x_k (q_k s + o) = s * sum_k x_k q_k + o * sum_k x_k, with sum_k x_k computed once
// per call. Without AVX512_BF16 the dot product is emulated with two FMAs; at the AVX2 and
// NEON levels float32 FMAs compute the same exact products. int8 on x86: x quantized to
// int16 per 64 inputs (2^-15 of the block's largest |x|) and exact integer sums
// (gemv_a16.h; the LM head: 16 rows in 4 ms on 2 AVX2 cores, not 8); on NEON float32
// FMAs. Without SIMD a scalar path decodes the same layouts.
#include "aten.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include "library.h"

#include "gemv.h"

namespace houchu_cpu {
namespace gemv {

// Calls f(OutT{}) with OutT = c10::BFloat16 or float, x's dtype (checked before).
template <typename F>
void with_out_type(const at::Tensor& x, F&& f) {
  if (x.scalar_type() == at::kBFloat16)
    f(c10::BFloat16{});
  else
    f(float{});
}

// y = x @ W.T for a checked PackedLinear, blocks split over torch's threads.
at::Tensor gemv_call(const at::Tensor& x, const PackedLinear& p, const char* who,
                     bool int8_acts = false, bool float_out = false) {
  TORCH_CHECK(x.scalar_type() == at::kBFloat16 || x.scalar_type() == at::kFloat, who,
              ": x must be bfloat16 or float32, got ", x.scalar_type());
  const int64_t m = x.size(0);
  auto out = at::empty({m, p.n}, float_out ? x.options().dtype(at::kFloat) : x.options());
  if (m == 0) return out;
  const Acts xa = acts_of(x, p.kpad, p.int4 ? p.G : 0, int8_acts);
  with_out_type(out, [&](auto out_t) {
    using scalar_t = decltype(out_t);
    scalar_t* op = out.data_ptr<scalar_t>();
    at::parallel_for(0, p.nb, grain_for(p.blk_bytes), [&](int64_t b0, int64_t b1) {
      run_blocks(p, xa, m, op, b0, b1);
    });
  });
  return out;
}


// ---- int4 -------------------------------------------------------------------------

// q: [N, K] uint8 codes 0..15; scale, offset: [N, K/G] bfloat16 or float32 (same dtype);
// group_size G: K % G == 0, G % 8 == 0 -> blob, uint8 [ceil(N/16), K/G, H + 8G]:
// per block of 16 features and per group, an H-byte header then G/8 chunks of 64 bytes.
//   header, bfloat16 scales (H = 64): dword i = offset[f] bits << 16 | scale[f] bits;
//   header, float32 scales (H = 128): 16 float32 scales, then 16 float32 offsets;
//   chunk c (k = g*G + 8c + kk, kk = 0..7): 16-bit word 2i + (kk & 1) holds, in bits
//   4t..4t+3 with t = kk / 2, the code of feature 16*block + i (little endian).
// Features past N (the last block's padding) have zero codes, scales and offsets.
at::Tensor int4_pack(const at::Tensor& q, const at::Tensor& scale,
                                  const at::Tensor& offset, int64_t group_size) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kByte,
              "int4_pack: q must be a [N, K] uint8 tensor of codes, got ", q.scalar_type(), " ",
              q.sizes());
  const int64_t n = q.size(0), k = q.size(1), G = group_size;
  TORCH_CHECK(n > 0 && k > 0, "int4_pack: empty weight ", q.sizes());
  TORCH_CHECK(G > 0 && G % 8 == 0 && k % G == 0, "int4_pack: group_size must be a positive ",
              "multiple of 8 dividing K = ", k, ", got ", G);
  const int64_t ng = k / G;
  TORCH_CHECK(scale.dim() == 2 && scale.size(0) == n && scale.size(1) == ng,
              "int4_pack: scale must be [N, K/G] = [", n, ", ", ng, "], got ", scale.sizes());
  TORCH_CHECK(offset.sizes() == scale.sizes(), "int4_pack: offset must be [N, K/G] = [", n,
              ", ", ng, "], got ", offset.sizes());
  TORCH_CHECK(scale.scalar_type() == offset.scalar_type() &&
                  (scale.scalar_type() == at::kBFloat16 || scale.scalar_type() == at::kFloat),
              "int4_pack: scale and offset must both be bfloat16 or both float32, got ",
              scale.scalar_type(), " and ", offset.scalar_type());
  TORCH_CHECK(q.max().item<uint8_t>() <= 15, "int4_pack: codes must be in 0..15");
  const bool f32 = scale.scalar_type() == at::kFloat;
  const int64_t H = f32 ? 128 : 64, gbytes = H + 8 * G, nb = (n + kBlock - 1) / kBlock;
  auto qc = q.contiguous();
  auto sc = scale.contiguous(), oc = offset.contiguous();
  auto blob = at::zeros({nb, ng, gbytes}, q.options());
  const uint8_t* qp = qc.data_ptr<uint8_t>();
  uint8_t* bp = blob.data_ptr<uint8_t>();
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = 0; i < kBlock && b * kBlock + i < n; ++i) {
        const int64_t f = b * kBlock + i;
        for (int64_t g = 0; g < ng; ++g) {
          uint8_t* h = bp + (b * ng + g) * gbytes;
          if (f32) {
            const float s = sc.data_ptr<float>()[f * ng + g], o = oc.data_ptr<float>()[f * ng + g];
            std::memcpy(h + 4 * i, &s, 4);
            std::memcpy(h + 64 + 4 * i, &o, 4);
          } else {
            const uint32_t d =
                static_cast<uint32_t>(bf16_bits(oc.data_ptr<c10::BFloat16>()[f * ng + g])) << 16 |
                bf16_bits(sc.data_ptr<c10::BFloat16>()[f * ng + g]);
            std::memcpy(h + 4 * i, &d, 4);
          }
          for (int64_t kk = 0; kk < G; ++kk) {
            const uint8_t code = qp[f * k + g * G + kk];
            h[H + 64 * (kk / 8) + int4_byte(i, kk % 8)] |=
                static_cast<uint8_t>(code << int4_shift(kk % 8));
          }
        }
      }
  });
  return blob;
}

// x: [M, K] bfloat16 or float32 (any strides); packed: int4_pack's blob;
// group_size: the G given to int4_pack; out_features: N -> [M, N] in x's dtype,
// y = x @ (q * scale + offset).T with float32 accumulation; int8_acts: x quantized to
// int8 per group first, integer dot products (W4A8, gemv_a8.h); batch_invariant: the
// same accumulator chains at every row count (PackedLinear::invariant; not with int8_acts);
// float_out: y in float32 whatever x's dtype (the float32 sums, never rounded).
at::Tensor int4_gemv(const at::Tensor& x, const at::Tensor& blob, int64_t group_size,
                     int64_t out_features, bool int8_acts, bool batch_invariant,
                     bool float_out) {
  TORCH_CHECK(blob.scalar_type() == at::kByte, "int4_gemv: packed must be int4_pack's uint8 blob");
  TORCH_CHECK(!(int8_acts && batch_invariant),
              "int4_gemv: batch_invariant takes float activations, not int8_acts");
  PackedLinear p = PackedLinear::of(blob, group_size, out_features, "int4_gemv");
  p.invariant = batch_invariant;
  TORCH_CHECK(x.dim() == 2 && x.size(1) == p.kpad, "int4_gemv: x must be [M, K] with K = ",
              p.kpad, ", got ", x.sizes());
  return gemv_call(x, p, "int4_gemv", int8_acts, float_out);
}

// ---- int8 -------------------------------------------------------------------------

// q: [N, K] int8; scale: [N] bfloat16 or float32 -> packed, int8
// [ceil(N/16), 1 + ceil(K/4), 64]: per block b of 16 features, a 64-byte header of 16
// float32 scales (zero past N), then chunks c = 0.. of 64 bytes holding, at byte
// 32t + 2i + h (t, h in 0..1, i in 0..15), q[16b + i, 4c + 2t + h] (zero past N and K).
at::Tensor int8_pack(const at::Tensor& q, const at::Tensor& scale) {
  TORCH_CHECK(q.dim() == 2 && q.scalar_type() == at::kChar,
              "int8_pack: q must be a [N, K] int8 tensor, got ", q.scalar_type(), " ", q.sizes());
  const int64_t n = q.size(0), k = q.size(1);
  TORCH_CHECK(n > 0 && k > 0, "int8_pack: empty weight ", q.sizes());
  TORCH_CHECK(scale.dim() == 1 && scale.size(0) == n, "int8_pack: scale must be [N] = [", n,
              "], got ", scale.sizes());
  TORCH_CHECK(scale.scalar_type() == at::kBFloat16 || scale.scalar_type() == at::kFloat,
              "int8_pack: scale must be bfloat16 or float32, got ", scale.scalar_type());
  const int64_t nb = (n + kBlock - 1) / kBlock, nc = (k + 3) / 4;
  auto qc = q.contiguous();
  auto s32 = scale.to(at::kFloat).contiguous();
  auto blob = at::zeros({nb, 1 + nc, 64}, q.options());
  const int8_t* qp = qc.data_ptr<int8_t>();
  const float* sp = s32.data_ptr<float>();
  int8_t* bp = blob.data_ptr<int8_t>();
  at::parallel_for(0, nb, 1, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b)
      for (int64_t i = 0; i < kBlock && b * kBlock + i < n; ++i) {
        int8_t* blk = bp + b * (1 + nc) * 64;
        std::memcpy(blk + 4 * i, sp + b * kBlock + i, 4);
        for (int64_t kk = 0; kk < k; ++kk) {
          const int64_t c = kk / 4, t = (kk % 4) / 2, h = kk % 2;
          blk[64 * (1 + c) + 32 * t + 2 * i + h] = qp[(b * kBlock + i) * k + kk];
        }
      }
  });
  return blob;
}


// x: [M, K] bfloat16 or float32 (any strides); packed: int8_pack's blob; out_features:
// N -> [M, N] in x's dtype, y = (x @ q.T) * scale with float32 accumulation.
at::Tensor int8_gemv(const at::Tensor& x, const at::Tensor& blob, int64_t out_features,
                     bool float_out) {
  TORCH_CHECK(blob.scalar_type() == at::kChar, "int8_gemv: packed must be int8_pack's contiguous ",
              "int8 [N/16, 1 + K/4, 64]");
  const PackedLinear p = PackedLinear::of(blob, 0, out_features, "int8_gemv");
  TORCH_CHECK(x.dim() == 2 && p.fits(x.size(1)),
              "int8_gemv: x must be [M, K] with K matching the packed weight's ", p.kpad,
              " (padded) columns, got ", x.sizes());
  return gemv_call(x, p, "int8_gemv", false, float_out);
}

}  // namespace gemv
}  // namespace houchu_cpu


HOUCHU_FRAGMENT(m) {
  m.def("int4_pack(Tensor q, Tensor scale, Tensor offset, int group_size) -> Tensor");
  m.def(
      "int4_gemv(Tensor x, Tensor packed, int group_size, int out_features, bool int8_acts=False, "
      "bool batch_invariant=False, bool float_out=False) -> Tensor");
  m.def("int8_pack(Tensor q, Tensor scale) -> Tensor");
  m.def("int8_gemv(Tensor x, Tensor packed, int out_features, bool float_out=False) -> Tensor");
}

HOUCHU_IMPL(m) {
  m.impl("int4_pack", &houchu_cpu::gemv::int4_pack);
  m.impl("int4_gemv", &houchu_cpu::gemv::int4_gemv);
  m.impl("int8_pack", &houchu_cpu::gemv::int8_pack);
  m.impl("int8_gemv", &houchu_cpu::gemv::int8_gemv);
}
