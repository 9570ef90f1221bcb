"""Paged decode attention in Triton: one new query token per sequence against its paged,
possibly int8/fp8-quantized KV.

One program per (sequence, KV head) walks the sequence's page table page by page and
keeps an online softmax (Milakov & Gimelshein 2018; the FlashAttention recurrence, Dao
et al. 2022) for the G = H / Hkv query heads that share the KV head (grouped-query
attention, Ainslie et al. 2023), so each K/V page is read once per group. Quantized pages
are dequantized in registers with their per-(token, head) float16 scales. The block
table and lengths are device tensors, so a CUDA graph can capture the launch.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl


@triton.jit
def _paged_decode_kernel(
    q_ptr,
    k_ptr,
    v_ptr,
    ks_ptr,
    vs_ptr,
    bt_ptr,
    len_ptr,
    o_ptr,
    sm_scale,
    bt_stride,
    n_kv_heads,
    G: tl.constexpr,
    D: tl.constexpr,
    PS: tl.constexpr,
    G_PAD: tl.constexpr,
    D_PAD: tl.constexpr,
    PS_PAD: tl.constexpr,
    QUANT: tl.constexpr,
):
    b = tl.program_id(0)
    kvh = tl.program_id(1)
    g = tl.arange(0, G_PAD)
    d = tl.arange(0, D_PAD)
    s = tl.arange(0, PS_PAD)
    gm, dm = g < G, d < D
    n_heads = n_kv_heads * G
    q_off = (b * n_heads + kvh * G + g)[:, None] * D + d[None, :]
    q = tl.load(q_ptr + q_off, mask=gm[:, None] & dm[None, :], other=0.0).to(tl.float32)
    seq_len = tl.load(len_ptr + b)
    m_i = tl.full((G_PAD,), float("-inf"), tl.float32)
    l_i = tl.zeros((G_PAD,), tl.float32)
    acc = tl.zeros((G_PAD, D_PAD), tl.float32)
    for p in range(0, tl.cdiv(seq_len, PS)):
        page = tl.load(bt_ptr + b * bt_stride + p).to(tl.int64)
        valid = (p * PS + s < seq_len) & (s < PS)  # [PS_PAD]
        row = (page * PS + s) * n_kv_heads + kvh  # [PS_PAD] (token, head) index
        kv_off = row[:, None] * D + d[None, :]
        kv_m = valid[:, None] & dm[None, :]
        k = tl.load(k_ptr + kv_off, mask=kv_m, other=0.0).to(tl.float32)  # [PS_PAD, D_PAD]
        v = tl.load(v_ptr + kv_off, mask=kv_m, other=0.0).to(tl.float32)
        if QUANT:
            k = k * tl.load(ks_ptr + row, mask=valid, other=0.0).to(tl.float32)[:, None]
            v = v * tl.load(vs_ptr + row, mask=valid, other=0.0).to(tl.float32)[:, None]
        sc = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * sm_scale  # [G_PAD, PS_PAD]
        sc = tl.where(valid[None, :], sc, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(sc, axis=1))
        alpha = tl.exp(m_i - m_new)
        pr = tl.exp(sc - m_new[:, None])
        l_i = l_i * alpha + tl.sum(pr, axis=1)
        acc = acc * alpha[:, None] + tl.sum(pr[:, :, None] * v[None, :, :], axis=1)
        m_i = m_new
    out = acc / l_i[:, None]
    tl.store(o_ptr + q_off, out.to(o_ptr.dtype.element_ty), mask=gm[:, None] & dm[None, :])


def paged_decode(
    q: torch.Tensor,
    pool,  # noqa: ANN001 (a KVPool; not imported to keep this module free of cycles)
    layer: int,
    block_table: torch.Tensor,
    seq_lens: torch.Tensor,
) -> torch.Tensor:
    """Attention of one query token per sequence over its first ``seq_lens`` positions.

    Args:
        q: ``[B, H, D]`` RoPE-rotated queries (model dtype).
        pool: the KV pool (``k``/``v`` ``[L, P, ps, Hkv, D]``, scales when quantized).
        layer: layer index.
        block_table: ``[B, max_pages]`` int32/int64 pages of each sequence.
        seq_lens: ``[B]`` int32 tokens each sequence attends over (>= 1).
    Returns:
        ``[B, H, D]`` in q's dtype.
    """
    b, h, d = q.shape
    hkv, ps = pool.num_kv_heads, pool.page_size
    g = h // hkv
    q = q.contiguous()
    bt = block_table.contiguous()
    out = torch.empty_like(q)
    if b == 0:
        return out
    kc, vc = pool.k[layer], pool.v[layer]
    ks = pool.k_scale[layer] if pool.quantized else kc
    vs = pool.v_scale[layer] if pool.quantized else vc
    _paged_decode_kernel[(b, hkv)](
        q,
        kc,
        vc,
        ks,
        vs,
        bt,
        seq_lens.contiguous(),
        out,
        1.0 / math.sqrt(d),
        bt.stride(0),
        hkv,
        g,
        d,
        ps,
        triton.next_power_of_2(g),
        triton.next_power_of_2(d),
        triton.next_power_of_2(ps),
        pool.quantized,
    )
    return out
