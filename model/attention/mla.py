"""Multi-head latent attention (MLA; DeepSeek-AI 2024, "DeepSeek-V2", §2.1) over a
paged pool of compressed latents.

Per token, MLA projects the hidden state down to a latent ``c = norm(W_DKV x)`` of
``kv_lora_rank`` elements and one RoPE key ``k_pe`` of ``qk_rope_head_dim`` elements
shared by every head; each head's key is ``[W_UK c, k_pe]`` and its value ``W_UV c``.
houchu stores only ``[c, k_pe]`` per token and layer (``LatentKVPool``), not the full
keys and values of every head.

Two ways to attend over the latents, the same arithmetic reordered:

- expanded (prefill chunks): up-project the latents of the sequence's context into
  full per-head keys and values (``kv_b_proj``) and run causal SDPA; compute-bound work
  with many queries per latent, as the reference implementation does.
- absorbed (decode and speculative verification): fold ``W_UK`` into the query
  (``q_lat = q_nopeᵀ W_UK``, per head ``[kv_lora_rank]``), attend with one shared key
  ``[c, k_pe]`` and value ``c`` straight from the pool (multi-query attention over the
  latents), then apply ``W_UV`` to the attended latent and the output projection. A
  decode step reads ``kv_lora_rank + qk_rope_head_dim`` elements per cached token and
  layer, and never up-projects the context (DeepSeek-V2 §2.1.2; vLLM's and SGLang's
  MLA decode use the same absorption).

``MLAAttention.absorb = False`` decodes the expanded way instead (the benchmark's
"naive" step, ``houchu.devtools.bench.mla``). Numerics follow transformers'
``DeepseekV2Attention`` / ``DeepseekV3Attention``: DeepSeek's interleaved RoPE pairs are
permuted to rotate-half halves at load (the same rotation), softmax scaled by
``qk_head_dim^-0.5`` times YaRN's ``mscale(factor, mscale_all_dim)²``.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from houchu.model.attention.metadata import TorchMeta
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.batch import StepBatch
from houchu.model.config.core import ModelConfig, ModelLoadError, mla_of
from houchu.model.kv.mla_pool import LatentKVPool
from houchu.model.ops import TorchOps
from houchu.model.rope import apply_rope, yarn_attention_factor, yarn_mscale

Linear = Callable[[list[Any]], nn.Module]


def deinterleave_rope_rows(w: torch.Tensor, heads: int, nope: int, rope: int) -> torch.Tensor:
    """Reorder each head's last ``rope`` rows from adjacent pairs ``(x0, x1), (x2, x3),
    …`` (DeepSeek's RoPE layout) to halves ``x0, x2, …, x1, x3, …`` (rotate-half), so
    that houchu's RoPE computes the same rotation.

    w: ``[heads · (nope + rope), in]`` -> the same shape, rows permuted.
    """
    v = w.reshape(heads, nope + rope, *w.shape[1:])
    pe = v[:, nope:]
    pe = torch.cat([pe[:, 0::2], pe[:, 1::2]], dim=1)
    return torch.cat([v[:, :nope], pe], dim=1).reshape(w.shape)


def softmax_scale(cfg: ModelConfig) -> float:
    """``qk_head_dim^-0.5``, times YaRN's ``mscale(factor, mscale_all_dim)²`` where
    the config uses YaRN with ``mscale_all_dim`` (transformers' ``yarn_apply_mscale``)."""
    scale = mla_of(cfg).qk_head_dim ** -0.5
    if cfg.rope_type == "yarn" and cfg.rope_mscale_all_dim:
        scale *= yarn_mscale(cfg.rope_factor, cfg.rope_mscale_all_dim) ** 2
    return scale


def prepare_mla(batch: StepBatch) -> TorchMeta:
    """The step's decode rows, prefill chunks and verification groups (the torch
    backend's per-step metadata: MLA attends with torch ops on any device)."""
    return TorchSDPABackend.prepare(TorchSDPABackend(), batch)


class MLAAttention(nn.Module):
    """One layer's MLA: projections, RoPE on the decoupled parts, latent store, and
    attention (expanded for prefill, absorbed for decode).

    Args:
        cfg: the model's configuration (``cfg.mla`` set).
        w: Hugging Face-named tensors (consumed): ``{prefix}.q_proj`` or ``q_a_proj``,
            ``q_a_layernorm``, ``q_b_proj``; ``kv_a_proj_with_mqa``, ``kv_a_layernorm``,
            ``kv_b_proj`` (``.weight`` each).
        prefix: e.g. ``model.layers.3.self_attn``.
        linear: builds a projection from a list of tensors to fuse (may quantize).
        dtype: the model dtype (``kv_b_proj`` is kept dense in it, split per head into
            ``w_uk`` ``[H, dn, r]`` and ``w_uv`` ``[H, dv, r]``: absorbed into the query
            and the output).
    Raises:
        ModelLoadError: a tensor is missing or mis-shaped.
    """

    def __init__(
        self, cfg: ModelConfig, w: dict[str, Any], prefix: str, linear: Linear, dtype: torch.dtype
    ) -> None:
        super().__init__()
        m = mla_of(cfg)
        h, self.m, self.eps = cfg.num_heads, m, cfg.rms_norm_eps
        self.num_heads = h
        _check_mla_shapes(cfg, w, prefix)

        def take(name: str) -> torch.Tensor:
            t = w.pop(f"{prefix}.{name}")
            if not isinstance(t, torch.Tensor):
                raise ModelLoadError(f"{prefix}.{name}: a quantized tensor cannot be permuted")
            return t

        def q_rows(t: torch.Tensor) -> torch.Tensor:
            if not m.rope_interleave:
                return t
            return deinterleave_rope_rows(t, h, m.qk_nope_head_dim, m.qk_rope_head_dim)

        self.q_a = self.q_b = self.q_proj = None
        self.q_a_norm: nn.Parameter | None = None
        if m.q_lora_rank:
            self.q_a = linear([take("q_a_proj.weight")])
            self.q_a_norm = _param(take("q_a_layernorm.weight").to(dtype))  # [q_lora_rank]
            self.q_b = linear([q_rows(take("q_b_proj.weight"))])
        else:
            self.q_proj = linear([q_rows(take("q_proj.weight"))])
        kv_a = take("kv_a_proj_with_mqa.weight")  # [r + dr, hidden]
        if m.rope_interleave:
            kv_a = deinterleave_rope_rows(kv_a, 1, m.kv_lora_rank, m.qk_rope_head_dim)
        self.kv_a = linear([kv_a])
        self.kv_a_norm = _param(take("kv_a_layernorm.weight").to(dtype))  # [r]
        # kv_b_proj [H·(dn + dv), r] split per head into the key and value up-projections
        kv_b = take("kv_b_proj.weight").to(dtype).view(h, -1, m.kv_lora_rank)
        self.w_uk = _param(kv_b[:, : m.qk_nope_head_dim].contiguous())  # [H, dn, r]
        self.w_uv = _param(kv_b[:, m.qk_nope_head_dim :].contiguous())  # [H, dv, r]
        self.scale = softmax_scale(cfg)
        self.rope_factor = yarn_attention_factor(cfg)  # YaRN's cos/sin multiplier
        self.absorb = True  # decode in the absorbed form (False: expand the context)

    def forward(
        self,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        layer: int,
        pool: LatentKVPool,
        batch: StepBatch,
        meta: TorchMeta,
        ops: TorchOps,
    ) -> torch.Tensor:
        """Store this step's latents for ``layer`` and attend.

        Args:
            x: ``[T, hidden]`` the normed residual stream (model dtype).
            cos, sin: ``[T, 1, dr]`` RoPE tables.
            layer: layer index.
            pool: the latent pool (written at ``batch.slot_mapping``).
            batch: the step; meta: ``prepare_mla(batch)``.
            ops: the kernel set (its RMSNorm).
        Returns:
            ``[T, H, dv]``: each token's attention output per head, before ``o_proj``.
        """
        m, t, h = self.m, x.shape[0], self.num_heads
        r, dn, dr = m.kv_lora_rank, m.qk_nope_head_dim, m.qk_rope_head_dim
        if self.q_a is not None:
            q = self.q_b(ops.rms_norm(self.q_a(x), self.q_a_norm, self.eps))
        else:
            q = self.q_proj(x)
        q_nope, q_pe = q.view(t, h, dn + dr).split([dn, dr], dim=-1)  # [T, H, dn], [T, H, dr]
        kv = self.kv_a(x)  # [T, r + dr]
        c = ops.rms_norm(kv[:, :r].contiguous(), self.kv_a_norm, self.eps)  # [T, r]
        if self.rope_factor != 1.0:
            cos, sin = cos * self.rope_factor, sin * self.rope_factor
        q_pe = apply_rope(q_pe, cos, sin)  # [T, H, dr]
        k_pe = apply_rope(kv[:, None, r:], cos, sin)[:, 0]  # [T, dr]
        pool.write(layer, batch.slot_mapping, c, k_pe)
        if meta.all_decode:
            return self._decode(layer, q_nope, q_pe, pool, meta)
        out = q.new_empty(t, h, m.v_head_dim)  # [T, H, dv]
        for s in meta.prefill:
            a, b = s.rows
            if s.start == 0:
                lat = torch.cat([c[a:b], k_pe[a:b]], dim=-1)  # [n, r + dr], as stored
            else:
                lat = pool.gather(layer, s.pages, s.kv_len)  # [L, r + dr]
            qn, qp = q_nope[a:b][None], q_pe[a:b][None]  # [1, n, H, ·]
            out[a:b] = self._expanded(qn, qp, lat[None], s.mask)[0]
        if meta.decode_rows is not None:
            rows = meta.decode_rows
            qn, qp = q_nope.index_select(0, rows), q_pe.index_select(0, rows)
            out[rows] = self._decode(layer, qn, qp, pool, meta)
        if meta.multi is not None:
            g = meta.multi
            b, n = g.rows.shape
            idx = g.rows.reshape(-1)
            qn = q_nope.index_select(0, idx).view(b, n, h, dn)  # [B, n, H, dn]
            qp = q_pe.index_select(0, idx).view(b, n, h, dr)  # [B, n, H, dr]
            lat = pool.gather_padded(layer, g.pages)  # [B, L, r + dr]
            o = self._absorbed(qn, qp, lat, g.mask)  # [B, n, H, dv]
            out[g.rows[g.valid]] = o[g.valid]
        return out

    def _decode(
        self,
        layer: int,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        pool: LatentKVPool,
        meta: TorchMeta,
    ) -> torch.Tensor:
        """One query per sequence: q_nope ``[B, H, dn]``, q_pe ``[B, H, dr]`` ->
        ``[B, H, dv]``, absorbed (or expanded when ``absorb`` is off)."""
        lat = pool.gather_padded(layer, meta.decode_pages)  # [B, L, r + dr]
        mask = meta.length_mask(lat.shape[1])  # [B, 1, 1, L]
        if not self.absorb:
            return self._expanded(q_nope[:, None], q_pe[:, None], lat, mask)[:, 0]
        return self._absorbed(q_nope[:, None], q_pe[:, None], lat, mask)[:, 0]

    def _absorbed(
        self, q_nope: torch.Tensor, q_pe: torch.Tensor, lat: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor:
        """Attention with ``W_UK`` folded into the query and ``W_UV`` applied after.

        Args:
            q_nope: ``[B, n, H, dn]``; q_pe: ``[B, n, H, dr]`` (RoPE applied).
            lat: ``[B, L, r + dr]`` cached ``[c, k_pe]`` of each sequence.
            mask: ``[B, 1, n, L]`` or ``[B, 1, 1, L]`` bool, True = attend.
        Returns:
            ``[B, n, H, dv]``.
        """
        b, n, h, dn = q_nope.shape
        r = self.m.kv_lora_rank
        # per head, [B·n, dn] @ [dn, r] (a contiguous batch: BLAS's fast path)
        qh = q_nope.permute(2, 0, 1, 3).reshape(h, b * n, dn).contiguous()  # [H, B·n, dn]
        q_lat = torch.bmm(qh, self.w_uk).view(h, b, n, r).permute(1, 2, 0, 3)  # [B, n, H, r]
        qa = torch.cat([q_lat, q_pe], dim=-1)  # [B, n, H, r + dr]
        if n == 1:  # the H heads along SDPA's query axis: one KV head, no repeat
            o = F.scaled_dot_product_attention(
                qa.view(b, 1, h, -1),  # [B, 1, H, r + dr]
                lat[:, None],  # [B, 1, L, r + dr]
                lat[:, None, :, :r],  # [B, 1, L, r]: the value is the latent
                attn_mask=mask,  # [B, 1, 1, L]
                scale=self.scale,
            )  # [B, 1, H, r]
            o_lat = o.view(b, 1, h, r)
        else:
            o = F.scaled_dot_product_attention(
                qa.transpose(1, 2),  # [B, H, n, r + dr]
                lat[:, None],  # [B, 1, L, r + dr]
                lat[:, None, :, :r],  # [B, 1, L, r]
                attn_mask=mask,  # [B, 1, n, L]
                scale=self.scale,
                enable_gqa=True,
            )  # [B, H, n, r]
            o_lat = o.transpose(1, 2)  # [B, n, H, r]
        oh = o_lat.permute(2, 0, 1, 3).reshape(h, b * n, r).contiguous()  # [H, B·n, r]
        o = torch.bmm(oh, self.w_uv.transpose(1, 2))  # [H, B·n, dv]
        return o.view(h, b, n, -1).permute(1, 2, 0, 3)  # [B, n, H, dv]

    def _expanded(
        self,
        q_nope: torch.Tensor,
        q_pe: torch.Tensor,
        lat: torch.Tensor,
        mask: torch.Tensor | None,
    ) -> torch.Tensor:
        """Attention over full per-head keys and values up-projected from the latents.

        Args:
            q_nope: ``[B, n, H, dn]``; q_pe: ``[B, n, H, dr]``.
            lat: ``[B, L, r + dr]``.
            mask: ``[B, 1, n, L]`` / ``[n, L]`` bool, or None for plain causal
                attention (n == L).
        Returns:
            ``[B, n, H, dv]``.
        """
        m, h = self.m, self.num_heads
        b, span = lat.shape[:2]
        r = m.kv_lora_rank
        c = lat[..., :r].reshape(b * span, r)  # [B·L, r]
        k_nope = (c @ self.w_uk.view(-1, r).T).view(b, span, h, -1)  # [B, L, H, dn]
        v = (c @ self.w_uv.view(-1, r).T).view(b, span, h, -1)  # [B, L, H, dv]
        k_pe = lat[:, :, None, r:].expand(b, span, h, m.qk_rope_head_dim)  # [B, L, H, dr]
        k = torch.cat([k_nope, k_pe], dim=-1)  # [B, L, H, dn + dr]
        q = torch.cat([q_nope, q_pe], dim=-1)  # [B, n, H, dn + dr]
        o = F.scaled_dot_product_attention(
            q.transpose(1, 2),  # [B, H, n, dn + dr]
            k.transpose(1, 2),  # [B, H, L, dn + dr]
            v.transpose(1, 2),  # [B, H, L, dv]
            attn_mask=mask,
            is_causal=mask is None,
            scale=self.scale,
        )  # [B, H, n, dv]
        return o.transpose(1, 2)


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


def _check_mla_shapes(cfg: ModelConfig, w: dict[str, Any], prefix: str) -> None:
    m, h, hid = mla_of(cfg), cfg.num_heads, cfg.hidden_size
    want = {
        "kv_a_proj_with_mqa.weight": (m.latent_dim, hid),
        "kv_a_layernorm.weight": (m.kv_lora_rank,),
        "kv_b_proj.weight": (h * (m.qk_nope_head_dim + m.v_head_dim), m.kv_lora_rank),
    }
    if m.q_lora_rank:
        want |= {
            "q_a_proj.weight": (m.q_lora_rank, hid),
            "q_a_layernorm.weight": (m.q_lora_rank,),
            "q_b_proj.weight": (h * m.qk_head_dim, m.q_lora_rank),
        }
    else:
        want["q_proj.weight"] = (h * m.qk_head_dim, hid)
    for name, shape in want.items():
        t = w.get(f"{prefix}.{name}")
        if t is None:
            raise ModelLoadError(f"missing tensor {prefix}.{name}")
        if tuple(t.shape) != shape:
            raise ModelLoadError(
                f"tensor {prefix}.{name}: shape {tuple(t.shape)}, expected {shape}"
            )
