// Causal prefill attention for the CPU: the n new query tokens of one sequence attend over
// its L KV positions (its cached prefix and themselves), query i seeing keys 0..start+i.
//
// FlashAttention's tiling (Dao et al. 2022, "FlashAttention: Fast and Memory-Efficient
// Exact Attention with IO-Awareness"): a task takes kBQ query positions of one KV head's
// G query heads (grouped-query attention, Ainslie et al. 2023: all G heads share the
// K/V they read) and walks the visible keys kBK at a time with an online softmax, so the
// [n, L] score matrix never exists and key blocks past the diagonal are skipped (half the
// work of a full matrix at start = 0). Scores, softmax and the output accumulator are
// float32. With bfloat16 inputs both products run as bfloat16 pair dot products
// (vdpbf16ps, each product exact in float32) and the probabilities are rounded to
// bfloat16 before P·V, as torch's CPU flash attention does; float32 inputs use float32 FMAs.
//
// K and V are first repacked per KV head into the layouts the dot products read (a key
// block's 16 keys side by side per head dimension; a V pair of keys side by side per head
// dimension): one pass over K/V, read kBQ·G rows at a time afterwards from L1/L2.
//
// The AVX2 level runs the same tiling in 8-lane float32 vectors (K/V packed as float32,
// bfloat16 widened; see prefill_avx2).
//
// A sliding window of W keys (Mistral, Gemma's local layers; window = 0: none) lets query
// position p see keys p - W + 1 .. p: key blocks before a task's first window are skipped
// and the keys before each row's window masked, as those past the diagonal are.
#include "aten.h"
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>
#include "library.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <type_traits>
#include <vector>

#include "vec.h"

namespace houchu_cpu {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// One call's geometry. Strides are in elements; query row i of head h starts at
// q + i * qs0 + h * qs1 (likewise k, v with KV head indices).
template <typename T>
struct Problem {
  const T* q;
  const T* k;
  const T* v;
  T* out;  // [n, H, D] contiguous
  int64_t n, len, heads, kv_heads, group, dim, start;
  int64_t qs0, qs1, ks0, ks1, vs0, vs1;
  float scale;
  int64_t window;  // keys each query sees, its own included (0: all before it)
};

// The first key query position `pos` sees.
template <typename T>
inline int64_t first_key(const Problem<T>& p, int64_t pos) {
  return p.window ? std::max<int64_t>(0, pos - p.window + 1) : 0;
}

// Portable path: one query row at a time, two-pass softmax, float32 throughout.
template <typename T>
void prefill_reference(const Problem<T>& p) {
  at::parallel_for(0, p.n * p.heads, 1, [&](int64_t a, int64_t e) {
    std::vector<float> s(p.len), acc(p.dim);
    for (int64_t t = a; t < e; ++t) {
      const int64_t i = t / p.heads, h = t % p.heads, kvh = h / p.group;
      const int64_t visible = p.start + i + 1, lo = first_key(p, p.start + i);
      const T* qi = p.q + i * p.qs0 + h * p.qs1;
      float mx = kNegInf;
      for (int64_t j = lo; j < visible; ++j) {
        const T* kj = p.k + j * p.ks0 + kvh * p.ks1;
        float dot = 0.f;
        for (int64_t d = 0; d < p.dim; ++d)
          dot += static_cast<float>(qi[d]) * static_cast<float>(kj[d]);
        s[j] = dot * p.scale;
        mx = std::max(mx, s[j]);
      }
      float sum = 0.f;
      std::fill(acc.begin(), acc.end(), 0.f);
      for (int64_t j = lo; j < visible; ++j) {
        const float w = std::exp(s[j] - mx);
        sum += w;
        const T* vj = p.v + j * p.vs0 + kvh * p.vs1;
        for (int64_t d = 0; d < p.dim; ++d) acc[d] += w * static_cast<float>(vj[d]);
      }
      T* o = p.out + (i * p.heads + h) * p.dim;
      for (int64_t d = 0; d < p.dim; ++d) o[d] = static_cast<T>(acc[d] / sum);
    }
  });
}

#ifdef HOUCHU_AVX512
constexpr int64_t kBQ = 16;  // query positions per task
constexpr int64_t kBK = 64;  // keys per block: four 16-key tiles
constexpr int64_t kRB = 4;   // query rows per score tile

// Packed K/V of every KV head, zero past the last key. float32 inputs: K as
// [Hkv][tiles][D][16] (a tile's 16 keys side by side per dimension), V as [Hkv][Lp][D].
// bfloat16: K as [Hkv][tiles][D/2][16][2] and V as [Hkv][Lp/2][D][2] (pairs along the
// reduction axis, vdpbf16ps's operand layout). Lp: L rounded up to kBK.
template <typename T>
struct Packed {
  std::vector<T> k, v;
  int64_t lp;
};

template <typename T>
Packed<T> pack(const Problem<T>& p) {
  constexpr int64_t w = std::is_same_v<T, float> ? 1 : 2;  // elements per reduction slot
  Packed<T> pk;
  pk.lp = (p.len + kBK - 1) / kBK * kBK;
  const int64_t d = p.dim, tiles = pk.lp / 16;
  pk.k.assign(p.kv_heads * pk.lp * d, T(0));
  pk.v.assign(p.kv_heads * pk.lp * d, T(0));
  at::parallel_for(0, p.kv_heads * tiles, 1, [&](int64_t a, int64_t e) {
    for (int64_t x = a; x < e; ++x) {
      const int64_t h = x / tiles, tile = x % tiles;
      T* kt = pk.k.data() + (h * tiles + tile) * 16 * d;
      T* vt = pk.v.data() + (h * pk.lp + tile * 16) * d;
      for (int64_t t = 0; t < 16 && tile * 16 + t < p.len; ++t) {
        const int64_t j = tile * 16 + t;
        const T* kj = p.k + j * p.ks0 + h * p.ks1;
        const T* vj = p.v + j * p.vs0 + h * p.vs1;
        for (int64_t c = 0; c < d; ++c) {  // K: slot c / w, key t, element c % w
          kt[((c / w) * 16 + t) * w + c % w] = kj[c];
        }
        // V: key pair (t / w) of the tile, dimension c, element t % w
        T* vp = vt + (t / w) * d * w + t % w;
        for (int64_t c = 0; c < d; ++c) vp[c * w] = vj[c];
      }
    }
  });
  return pk;
}

// Per-thread working set of one task: rows are (query position, head of the group).
template <typename T>
struct Scratch {
  std::vector<float> s, o, m, l;  // scores [R][kBK], output [R][D], max, sum [R]
  std::vector<T> prob;            // probabilities [R][kBK] in T
  std::vector<const T*> qrow;     // [R] query row pointers
  std::vector<int64_t> pos;       // [R] absolute position of each row
  std::vector<T> zero;            // [D] the query of padding rows
  Scratch(int64_t rows, int64_t d)
      : s(rows * kBK), o(rows * d), m(rows), l(rows), prob(rows * kBK), qrow(rows), pos(rows),
        zero(d, T(0)) {}
};

// Scores of kRB query rows against the block's 64 keys: out [kRB][kBK] (unscaled).
template <typename T>
inline void score_tile(const T* const* qr, const T* ktile, int64_t d, float* out) {
  __m512 acc[kRB][4];
  for (auto& row : acc)
    for (auto& a : row) a = _mm512_setzero_ps();
  const int64_t tile_elems = 16 * d;  // one 16-key tile
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t c = 0; c < d; ++c) {
      __m512 kv[4];
      for (int t = 0; t < 4; ++t) kv[t] = _mm512_loadu_ps(ktile + t * tile_elems + c * 16);
      for (int r = 0; r < kRB; ++r) {
        const __m512 qb = _mm512_set1_ps(qr[r][c]);
        for (int t = 0; t < 4; ++t) acc[r][t] = _mm512_fmadd_ps(qb, kv[t], acc[r][t]);
      }
    }
  } else {
#ifdef __AVX512BF16__
    for (int64_t c = 0; c < d / 2; ++c) {
      __m512i kv[4];
      for (int t = 0; t < 4; ++t) kv[t] = _mm512_loadu_si512(ktile + t * tile_elems + c * 32);
      for (int r = 0; r < kRB; ++r) {
        int32_t pair;
        std::memcpy(&pair, qr[r] + 2 * c, 4);
        const __m512bh qb = (__m512bh)_mm512_set1_epi32(pair);
        for (int t = 0; t < 4; ++t) acc[r][t] = _mm512_dpbf16_ps(acc[r][t], qb, (__m512bh)kv[t]);
      }
    }
#endif
  }
  for (int r = 0; r < kRB; ++r)
    for (int t = 0; t < 4; ++t) _mm512_storeu_ps(out + r * kBK + t * 16, acc[r][t]);
}

// o[r] += P[r] · V_block for NR rows; DV = D / 16 accumulators per row.
template <typename T, int DV, int NR>
inline void pv_tile(const T* prob, const T* vblock, float* o) {
  constexpr int64_t d = DV * 16;
  __m512 acc[NR][DV];
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < DV; ++c) acc[r][c] = _mm512_loadu_ps(o + r * d + c * 16);
  if constexpr (std::is_same_v<T, float>) {
    for (int64_t j = 0; j < kBK; ++j) {
      __m512 vv[DV];
      for (int c = 0; c < DV; ++c) vv[c] = _mm512_loadu_ps(vblock + j * d + c * 16);
      for (int r = 0; r < NR; ++r) {
        const __m512 pb = _mm512_set1_ps(prob[r * kBK + j]);
        for (int c = 0; c < DV; ++c) acc[r][c] = _mm512_fmadd_ps(pb, vv[c], acc[r][c]);
      }
    }
  } else {
#ifdef __AVX512BF16__
    for (int64_t j = 0; j < kBK / 2; ++j) {
      __m512i vv[DV];
      for (int c = 0; c < DV; ++c) vv[c] = _mm512_loadu_si512(vblock + (j * d + c * 16) * 2);
      for (int r = 0; r < NR; ++r) {
        int32_t pair;
        std::memcpy(&pair, prob + r * kBK + 2 * j, 4);
        const __m512bh pb = (__m512bh)_mm512_set1_epi32(pair);
        for (int c = 0; c < DV; ++c) acc[r][c] = _mm512_dpbf16_ps(acc[r][c], pb, (__m512bh)vv[c]);
      }
    }
#endif
  }
  for (int r = 0; r < NR; ++r)
    for (int c = 0; c < DV; ++c) _mm512_storeu_ps(o + r * d + c * 16, acc[r][c]);
}

inline void store_prob(float* p, __m512 v) { _mm512_storeu_ps(p, v); }

// 16 probabilities rounded to bfloat16 (nearest even; one vcvtneps2bf16 where the CPU
// has AVX512-BF16, the only case the tiled bfloat16 path runs).
inline void store_prob(c10::BFloat16* p, __m512 v) {
#ifdef __AVX512BF16__
  _mm256_storeu_si256(reinterpret_cast<__m256i*>(p), (__m256i)_mm512_cvtneps_pbh(v));
#else
  vec::store16(p, v);
#endif
}

// Online softmax of one row's block scores (keys k0..k0+63; those past pos, or before
// lo, masked): rescales the row's running output by exp(m_old - m_new) and writes the
// probabilities (all zero for a block before the row's window).
template <typename T>
inline void softmax_row(float* s, int64_t k0, int64_t pos, int64_t lo, float scale, float& m,
                        float& l, float* o, int64_t d, T* prob) {
  __m512 v[4];
  __mmask16 keep[4];
  __m512 mx = _mm512_set1_ps(kNegInf);
  const __m512 sc = _mm512_set1_ps(scale);
  for (int t = 0; t < 4; ++t) {
    const int64_t visible = pos - (k0 + t * 16) + 1;  // keys of this tile at or before pos
    const int64_t skip = lo - (k0 + t * 16);          // keys of this tile before lo
    const __mmask16 upto = visible >= 16 ? __mmask16(0xFFFF)
                           : visible <= 0 ? __mmask16(0)
                                          : __mmask16((1u << visible) - 1);
    const __mmask16 from = skip <= 0 ? __mmask16(0xFFFF)
                           : skip >= 16 ? __mmask16(0)
                                        : __mmask16(0xFFFFu << skip);
    keep[t] = upto & from;
    v[t] = _mm512_maskz_mul_ps(keep[t], _mm512_loadu_ps(s + t * 16), sc);
    mx = _mm512_mask_max_ps(mx, keep[t], mx, v[t]);
  }
  const float m_new = std::max(m, _mm512_reduce_max_ps(mx));
  if (m_new == kNegInf) {  // no key of the row's window yet
    for (int t = 0; t < 4; ++t) store_prob(prob + t * 16, _mm512_setzero_ps());
    return;
  }
  const float alpha = std::exp(m - m_new);  // 0 on the first block (m = -inf)
  const __m512 mv = _mm512_set1_ps(m_new);
  __m512 sum = _mm512_setzero_ps();
  for (int t = 0; t < 4; ++t) {
    const __m512 e = _mm512_maskz_mov_ps(keep[t], vec::exp16(_mm512_sub_ps(v[t], mv)));
    sum = _mm512_add_ps(sum, e);
    store_prob(prob + t * 16, e);
  }
  l = l * alpha + _mm512_reduce_add_ps(sum);
  m = m_new;
  if (alpha != 1.f) {
    const __m512 av = _mm512_set1_ps(alpha);
    for (int64_t c = 0; c < d; c += 16)
      _mm512_storeu_ps(o + c, _mm512_mul_ps(_mm512_loadu_ps(o + c), av));
  }
}

// One task: positions [i0, i1) of KV head h's query group.
template <typename T, int DV>
void run_task(const Problem<T>& p, const Packed<T>& pk, int64_t h, int64_t i0, int64_t i1,
              Scratch<T>& w) {
  constexpr int64_t d = DV * 16;
  constexpr int NR = DV <= 4 ? 4 : 2;  // rows per P·V tile (accumulators fit in 32 zmm)
  const int64_t real = (i1 - i0) * p.group;
  const int64_t rows = (real + kRB - 1) / kRB * kRB;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t rr = std::min(r, real - 1);
    const int64_t i = i0 + rr / p.group, head = h * p.group + rr % p.group;
    w.qrow[r] = r < real ? p.q + i * p.qs0 + head * p.qs1 : w.zero.data();
    w.pos[r] = p.start + i;
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
  }
  std::fill(w.o.begin(), w.o.begin() + rows * d, 0.f);
  const int64_t tiles = pk.lp / 16;
  const T* kh = pk.k.data() + h * tiles * 16 * d;
  const T* vh = pk.v.data() + h * pk.lp * d;
  const int64_t keys = p.start + i1;  // keys the last position sees
  // key blocks before the first position's window are never read
  for (int64_t k0 = first_key(p, p.start + i0) / kBK * kBK; k0 < keys; k0 += kBK) {
    for (int64_t r = 0; r < rows; r += kRB)
      score_tile<T>(w.qrow.data() + r, kh + k0 * d, d, w.s.data() + r * kBK);
    for (int64_t r = 0; r < rows; ++r)
      softmax_row<T>(w.s.data() + r * kBK, k0, w.pos[r], first_key(p, w.pos[r]), p.scale,
                     w.m[r], w.l[r], w.o.data() + r * d, d, w.prob.data() + r * kBK);
    for (int64_t r = 0; r < rows; r += NR)
      pv_tile<T, DV, NR>(w.prob.data() + r * kBK, vh + k0 * d, w.o.data() + r * d);
  }
  for (int64_t r = 0; r < real; ++r) {
    const int64_t i = i0 + r / p.group, head = h * p.group + r % p.group;
    T* out = p.out + (i * p.heads + head) * d;
    const __m512 inv = _mm512_set1_ps(1.f / w.l[r]);
    for (int64_t c = 0; c < d; c += 16)
      vec::store16(out + c, _mm512_mul_ps(_mm512_loadu_ps(w.o.data() + r * d + c), inv));
  }
}

template <typename T, int DV>
void prefill_tiled(const Problem<T>& p) {
  const Packed<T> pk = pack(p);
  const int64_t blocks = (p.n + kBQ - 1) / kBQ, tasks = blocks * p.kv_heads;
  const int64_t rows = (kBQ * p.group + kRB - 1) / kRB * kRB;
  // later query blocks see more keys: hand them out first, dynamically
#pragma omp parallel num_threads(at::get_num_threads())
  {
    Scratch<T> w(rows, p.dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = blocks - 1 - t / p.kv_heads, h = t % p.kv_heads;
      run_task<T, DV>(p, pk, h, b * kBQ, std::min(p.n, (b + 1) * kBQ), w);
    }
  }
}

// The tiled path if it applies: AVX-512 (with BF16 for bfloat16), D in {32, 64, 128}.
template <typename T>
bool prefill_avx512(const Problem<T>& p) {
#ifndef __AVX512BF16__
  if constexpr (!std::is_same_v<T, float>) return false;
#endif
  switch (p.dim) {
    case 32:
      prefill_tiled<T, 2>(p);
      return true;
    case 64:
      prefill_tiled<T, 4>(p);
      return true;
    case 128:
      prefill_tiled<T, 8>(p);
      return true;
    default:
      return false;
  }
}
#elif defined(HOUCHU_AVX2)
// The AVX2 + FMA tiled path: the AVX-512 path's tiling and online softmax in 8-lane
// float32 vectors. bfloat16 inputs are widened to float32 (exactly) when K/V are packed
// and when a task's queries are copied, so both products are float32 FMAs of the same
// exact products vdpbf16ps forms; the probabilities are rounded to bfloat16 before P·V,
// as the AVX-512 path (and torch's CPU flash attention) does.
constexpr int64_t kBQ = 16;  // query positions per task
constexpr int64_t kBK = 64;  // keys per block: eight 8-key tiles
constexpr int64_t kRB = 4;   // query rows per score tile and per P·V tile

// Packed K/V of every KV head in float32, zero past the last key: K as [Hkv][tiles][D][8]
// (a tile's 8 keys side by side per dimension), V as [Hkv][Lp][D]. Lp: L rounded up to
// kBK.
struct Packed8 {
  std::vector<float> k, v;
  int64_t lp;
};

template <typename T>
Packed8 pack8(const Problem<T>& p) {
  Packed8 pk;
  pk.lp = (p.len + kBK - 1) / kBK * kBK;
  const int64_t d = p.dim, tiles = pk.lp / 8;
  pk.k.assign(p.kv_heads * pk.lp * d, 0.f);
  pk.v.assign(p.kv_heads * pk.lp * d, 0.f);
  at::parallel_for(0, p.kv_heads * tiles, 1, [&](int64_t a, int64_t e) {
    for (int64_t x = a; x < e; ++x) {
      const int64_t h = x / tiles, tile = x % tiles;
      float* kt = pk.k.data() + (h * tiles + tile) * 8 * d;
      float* vt = pk.v.data() + (h * pk.lp + tile * 8) * d;
      for (int64_t t = 0; t < 8 && tile * 8 + t < p.len; ++t) {
        const int64_t j = tile * 8 + t;
        const T* kj = p.k + j * p.ks0 + h * p.ks1;
        const T* vj = p.v + j * p.vs0 + h * p.vs1;
        for (int64_t c = 0; c < d; ++c) kt[c * 8 + t] = static_cast<float>(kj[c]);
        for (int64_t c = 0; c < d; ++c) vt[t * d + c] = static_cast<float>(vj[c]);
      }
    }
  });
  return pk;
}

// Per-thread working set of one task: rows are (query position, head of the group).
struct Scratch8 {
  // queries [R][D] in float32 (zero for padding rows), scores [R][kBK], output [R][D],
  // max, sum [R], probabilities [R][kBK] (rounded to T)
  std::vector<float> q, s, o, m, l, prob;
  std::vector<int64_t> pos;  // [R] absolute position of each row
  Scratch8(int64_t rows, int64_t d)
      : q(rows * d), s(rows * kBK), o(rows * d), m(rows), l(rows), prob(rows * kBK), pos(rows) {}
};

// Scores of kRB query rows q [kRB][D] against the block's 64 keys (8 packed tiles):
// out [kRB][kBK] (unscaled). Two tiles at a time: 8 accumulators, 2 key loads and 4
// broadcasts per dimension.
inline void score_tile8(const float* q, const float* kblock, int64_t d, float* out) {
  for (int64_t tp = 0; tp < kBK / 16; ++tp) {
    const float* k0 = kblock + 2 * tp * 8 * d;
    const float* k1 = k0 + 8 * d;
    __m256 acc[kRB][2];
    for (auto& row : acc)
      for (auto& a : row) a = _mm256_setzero_ps();
    for (int64_t c = 0; c < d; ++c) {
      const __m256 kv0 = _mm256_loadu_ps(k0 + c * 8), kv1 = _mm256_loadu_ps(k1 + c * 8);
      for (int r = 0; r < kRB; ++r) {
        const __m256 qb = _mm256_broadcast_ss(q + r * d + c);
        acc[r][0] = _mm256_fmadd_ps(qb, kv0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(qb, kv1, acc[r][1]);
      }
    }
    for (int r = 0; r < kRB; ++r) {
      _mm256_storeu_ps(out + r * kBK + tp * 16, acc[r][0]);
      _mm256_storeu_ps(out + r * kBK + tp * 16 + 8, acc[r][1]);
    }
  }
}

// o[r] += P[r] · V_block for kRB rows, 16 dimensions at a time (8 accumulators, 2 V
// loads and 4 broadcasts per key); D a multiple of 16.
inline void pv_tile8(const float* prob, const float* vblock, int64_t d, float* o) {
  for (int64_t c = 0; c < d; c += 16) {
    __m256 acc[kRB][2];
    for (int r = 0; r < kRB; ++r) {
      acc[r][0] = _mm256_loadu_ps(o + r * d + c);
      acc[r][1] = _mm256_loadu_ps(o + r * d + c + 8);
    }
    for (int64_t j = 0; j < kBK; ++j) {
      const __m256 v0 = _mm256_loadu_ps(vblock + j * d + c);
      const __m256 v1 = _mm256_loadu_ps(vblock + j * d + c + 8);
      for (int r = 0; r < kRB; ++r) {
        const __m256 pb = _mm256_broadcast_ss(prob + r * kBK + j);
        acc[r][0] = _mm256_fmadd_ps(pb, v0, acc[r][0]);
        acc[r][1] = _mm256_fmadd_ps(pb, v1, acc[r][1]);
      }
    }
    for (int r = 0; r < kRB; ++r) {
      _mm256_storeu_ps(o + r * d + c, acc[r][0]);
      _mm256_storeu_ps(o + r * d + c + 8, acc[r][1]);
    }
  }
}

// Online softmax of one row's block scores (keys k0..k0+63; those past pos masked), as
// the AVX-512 softmax_row: rescales the row's running output by exp(m_old - m_new), sums
// the unrounded probabilities and writes them rounded to T.
template <typename T>
inline void softmax_row8(float* s, int64_t k0, int64_t pos, int64_t lo, float scale, float& m,
                         float& l, float* o, int64_t d, float* prob) {
  const __m256 ninf = _mm256_set1_ps(kNegInf), sc = _mm256_set1_ps(scale);
  __m256 v[8], keep[8];
  __m256 mx = ninf;
  for (int t = 0; t < 8; ++t) {
    const int64_t visible = pos - (k0 + t * 8) + 1;  // keys of this tile at or before pos
    const int64_t skip = lo - (k0 + t * 8);          // keys of this tile before lo
    keep[t] = _mm256_andnot_ps(
        _mm256_castsi256_ps(simd::lanes8(std::clamp<int64_t>(skip, 0, 8))),
        _mm256_castsi256_ps(simd::lanes8(std::clamp<int64_t>(visible, 0, 8))));
    v[t] = _mm256_and_ps(keep[t], _mm256_mul_ps(_mm256_loadu_ps(s + t * 8), sc));
    mx = _mm256_max_ps(mx, _mm256_blendv_ps(ninf, v[t], keep[t]));
  }
  const float m_new = std::max(m, simd::hmax8(mx));
  if (m_new == kNegInf) {  // no key of the row's window yet
    for (int t = 0; t < 8; ++t) _mm256_storeu_ps(prob + t * 8, _mm256_setzero_ps());
    return;
  }
  const float alpha = std::exp(m - m_new);            // 0 on the first block (m = -inf)
  const __m256 mv = _mm256_set1_ps(m_new);
  __m256 sum = _mm256_setzero_ps();
  for (int t = 0; t < 8; ++t) {
    const __m256 e = _mm256_and_ps(keep[t], simd::exp8(_mm256_sub_ps(v[t], mv)));
    sum = _mm256_add_ps(sum, e);
    _mm256_storeu_ps(prob + t * 8, simd::round8<T>(e));
  }
  l = l * alpha + simd::hsum8(sum);
  m = m_new;
  if (alpha != 1.f) {
    const __m256 av = _mm256_set1_ps(alpha);
    for (int64_t c = 0; c < d; c += 8)
      _mm256_storeu_ps(o + c, _mm256_mul_ps(_mm256_loadu_ps(o + c), av));
  }
}

// One task: positions [i0, i1) of KV head h's query group.
template <typename T>
void run_task8(const Problem<T>& p, const Packed8& pk, int64_t h, int64_t i0, int64_t i1,
               Scratch8& w) {
  const int64_t d = p.dim;
  const int64_t real = (i1 - i0) * p.group;
  const int64_t rows = (real + kRB - 1) / kRB * kRB;
  for (int64_t r = 0; r < rows; ++r) {
    const int64_t rr = std::min(r, real - 1);
    const int64_t i = i0 + rr / p.group, head = h * p.group + rr % p.group;
    float* qf = w.q.data() + r * d;
    if (r < real) {
      const T* qi = p.q + i * p.qs0 + head * p.qs1;
      for (int64_t c = 0; c < d; c += 8) simd::store8(qf + c, simd::load8(qi + c));
    } else {
      std::fill(qf, qf + d, 0.f);
    }
    w.pos[r] = p.start + i;
    w.m[r] = kNegInf;
    w.l[r] = 0.f;
  }
  std::fill(w.o.begin(), w.o.begin() + rows * d, 0.f);
  const float* kh = pk.k.data() + h * pk.lp * d;
  const float* vh = pk.v.data() + h * pk.lp * d;
  const int64_t keys = p.start + i1;  // keys the last position sees
  // key blocks before the first position's window are never read
  for (int64_t k0 = first_key(p, p.start + i0) / kBK * kBK; k0 < keys; k0 += kBK) {
    for (int64_t r = 0; r < rows; r += kRB)
      score_tile8(w.q.data() + r * d, kh + k0 * d, d, w.s.data() + r * kBK);
    for (int64_t r = 0; r < rows; ++r)
      softmax_row8<T>(w.s.data() + r * kBK, k0, w.pos[r], first_key(p, w.pos[r]), p.scale,
                      w.m[r], w.l[r], w.o.data() + r * d, d, w.prob.data() + r * kBK);
    for (int64_t r = 0; r < rows; r += kRB)
      pv_tile8(w.prob.data() + r * kBK, vh + k0 * d, d, w.o.data() + r * d);
  }
  for (int64_t r = 0; r < real; ++r) {
    const int64_t i = i0 + r / p.group, head = h * p.group + r % p.group;
    T* out = p.out + (i * p.heads + head) * d;
    const __m256 inv = _mm256_set1_ps(1.f / w.l[r]);
    for (int64_t c = 0; c < d; c += 8)
      simd::store8(out + c, _mm256_mul_ps(_mm256_loadu_ps(w.o.data() + r * d + c), inv));
  }
}

// The tiled path if it applies: D in {32, 64, 128}, as the AVX-512 one.
template <typename T>
bool prefill_avx2(const Problem<T>& p) {
  if (p.dim != 32 && p.dim != 64 && p.dim != 128) return false;
  const Packed8 pk = pack8(p);
  const int64_t blocks = (p.n + kBQ - 1) / kBQ, tasks = blocks * p.kv_heads;
  const int64_t rows = (kBQ * p.group + kRB - 1) / kRB * kRB;
  // later query blocks see more keys: hand them out first, dynamically
#pragma omp parallel num_threads(at::get_num_threads())
  {
    Scratch8 w(rows, p.dim);
#pragma omp for schedule(dynamic, 1)
    for (int64_t t = 0; t < tasks; ++t) {
      const int64_t b = blocks - 1 - t / p.kv_heads, h = t % p.kv_heads;
      run_task8<T>(p, pk, h, b * kBQ, std::min(p.n, (b + 1) * kBQ), w);
    }
  }
  return true;
}
#endif

template <typename T>
void prefill_dispatch(const Problem<T>& p) {
#ifdef HOUCHU_AVX512
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
    if (prefill_avx512(p)) return;
  }
#elif defined(HOUCHU_AVX2)
  if constexpr (std::is_same_v<T, float> || std::is_same_v<T, c10::BFloat16>) {
    if (prefill_avx2(p)) return;
  }
#endif
  prefill_reference(p);
}

}  // namespace

// q: [n, H, D]; k, v: [L, Hkv, D] (float32 or bfloat16, all one dtype, last dimension
// contiguous, any other strides); start: position of the first query (its cached KV
// prefix), start + n <= L; scale: the score scale (1 / sqrt(D) for Llama); window: keys
// each query sees, its own included (0: all) -> [n, H, D] contiguous: query i attends keys
// max(0, start + i - window + 1)..start+i.
at::Tensor prefill_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                             int64_t start, double scale, int64_t window) {
  TORCH_CHECK(q.dim() == 3 && k.dim() == 3 && v.dim() == 3,
              "prefill_attention: q must be [n, H, D] and k, v [L, Hkv, D]");
  TORCH_CHECK(q.scalar_type() == k.scalar_type() && q.scalar_type() == v.scalar_type(),
              "prefill_attention: q, k and v must share a dtype");
  TORCH_CHECK(q.scalar_type() == at::kFloat || q.scalar_type() == at::kBFloat16,
              "prefill_attention: float32 or bfloat16 only, got ", q.scalar_type());
  TORCH_CHECK(q.device().is_cpu() && k.device().is_cpu() && v.device().is_cpu(),
              "prefill_attention: CPU tensors only");
  TORCH_CHECK(q.stride(2) == 1 && k.stride(2) == 1 && v.stride(2) == 1,
              "prefill_attention: the head dimension must be contiguous");
  TORCH_CHECK(k.sizes() == v.sizes(), "prefill_attention: k and v shapes differ");
  const int64_t n = q.size(0), h = q.size(1), d = q.size(2), len = k.size(0), hkv = k.size(1);
  TORCH_CHECK(k.size(2) == d, "prefill_attention: q and k head dims differ");
  TORCH_CHECK(hkv > 0 && h % hkv == 0, "prefill_attention: ", h, " query heads are not a ",
              "multiple of ", hkv, " KV heads");
  TORCH_CHECK(start >= 0 && start + n <= len, "prefill_attention: start ", start, " + ", n,
              " queries exceeds ", len, " keys");
  TORCH_CHECK(window >= 0, "prefill_attention: negative window ", window);
  auto out = at::empty({n, h, d}, q.options());
  if (n == 0) return out;
  AT_DISPATCH_FLOATING_TYPES_AND(at::kBFloat16, q.scalar_type(), "prefill_attention", [&] {
    const Problem<scalar_t> p{q.data_ptr<scalar_t>(), k.data_ptr<scalar_t>(),
                              v.data_ptr<scalar_t>(), out.data_ptr<scalar_t>(),
                              n, len, h, hkv, h / hkv, d, start,
                              q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                              v.stride(0), v.stride(1), static_cast<float>(scale), window};
    prefill_dispatch(p);
  });
  return out;
}

}  // namespace houchu_cpu

HOUCHU_FRAGMENT(m) {
  m.def(
      "prefill_attention(Tensor q, Tensor k, Tensor v, int start, float scale, int window=0) "
      "-> Tensor");
}

HOUCHU_IMPL(m) {
  m.impl("prefill_attention", &houchu_cpu::prefill_attention);
}
