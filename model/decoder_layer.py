"""One decoder block of the Llama family (``houchu.model.llama``): RMSNorm → attention
(grouped-query, MLA, a sliding window) → residual → RMSNorm → SwiGLU / GeGLU MLP or routed
experts → residual, split in ``pre`` (up to the attention) and ``post`` (after it), so
the model runs attention for the whole batch in between."""

from __future__ import annotations

import torch
from torch import nn

from houchu.model.attention.mla import MLAAttention
from houchu.model.block_parts import OffsetRMSNorm, apply_norm, gelu_tanh_mul
from houchu.model.config.core import ModelConfig
from houchu.model.linear.dense import LinearBase
from houchu.model.linear.factory import fuse_weights, make_linear
from houchu.model.moe import MoEMLP
from houchu.model.ops import TorchOps
from houchu.model.quant.functions import Int4Weight, QuantSpec
from houchu.model.weights.shapes import Weights


def frozen_param(t: torch.Tensor) -> nn.Parameter:
    """``t`` as a parameter that takes no gradient (inference weights)."""
    return nn.Parameter(t, requires_grad=False)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019): ``w * x / sqrt(mean(x²) + eps)``, computed in fp32
    and cast back before the weight multiply (as Hugging Face's LlamaRMSNorm).

    weight: ``[hidden]``.
    """

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = frozen_param(weight)  # [hidden]
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[N, hidden]`` -> ``[N, hidden]``, same dtype."""
        return TorchOps.rms_norm(x, self.weight, self.eps)


class DecoderLayer(nn.Module):
    """One Llama block with fused qkv ``[(H + 2·Hkv)·D, hidden]`` and gate_up
    ``[2·intermediate, hidden]`` projections, split around attention into ``pre`` (norm,
    qkv, RoPE) and ``post`` (o_proj, residual, norm, MLP, residual) so a compiled or
    graph-captured step can treat the pieces separately."""

    def __init__(
        self,
        cfg: ModelConfig,
        w: Weights,
        prefix: str,
        spec: QuantSpec,
        device: torch.device,
        dtype: torch.dtype,
        moe: bool = False,
        layer: int = 0,
    ) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.eps = cfg.rms_norm_eps
        norm = norm_kind(cfg)
        self.input_norm = norm(w.pop(f"{prefix}.input_layernorm.weight"), cfg.rms_norm_eps)
        # Gemma: applied to the attention output; Llama: before the MLP
        self.post_norm = norm(w.pop(f"{prefix}.post_attention_layernorm.weight"), cfg.rms_norm_eps)
        #: Gemma's norms before and after the MLP (None: a Llama block)
        self.ff_norms: nn.ModuleList | None = None
        if cfg.gemma_blocks:
            self.ff_norms = nn.ModuleList(
                norm(w.pop(f"{prefix}.{n}_feedforward_layernorm.weight"), cfg.rms_norm_eps)
                for n in ("pre", "post")
            )
        self.gelu = cfg.hidden_act == "gelu_tanh"  # GeGLU (Gemma) instead of SwiGLU
        #: which RoPE table of ``LlamaModel.embed_and_rope`` this layer reads, when it
        #: gives several (Gemma 3's local layers: 1)
        self.rope_slot = int(bool(cfg.rope_local_theta) and layer in cfg.sliding_layers)
        a, m = f"{prefix}.self_attn", f"{prefix}.mlp"

        def lin(parts: list[torch.Tensor | Int4Weight]) -> LinearBase:
            return make_linear(fuse_weights(parts, dtype), spec, device, dtype=dtype)

        #: multi-head latent attention (DeepSeek) in place of the qkv projection, or None
        self.mla = MLAAttention(cfg, w, a, lin, dtype) if cfg.is_mla else None
        self.qkv: LinearBase | None = None
        if self.mla is None:
            self.qkv = lin([w.pop(f"{a}.{n}_proj.weight") for n in "qkv"])
        self.o_proj = lin([w.pop(f"{a}.o_proj.weight")])
        #: the routed experts where this layer's MLP is a MoE (then gate_up/down are None)
        self.moe = MoEMLP.from_weights(cfg, w, m, dtype, lin) if moe else None
        self.gate_up: LinearBase | None = None
        self.down: LinearBase | None = None
        if self.moe is None:
            self.gate_up = lin([w.pop(f"{m}.gate_proj.weight"), w.pop(f"{m}.up_proj.weight")])
            self.down = lin([w.pop(f"{m}.down_proj.weight")])
        # Qwen2: the q/k/v biases fused as the projection is: [(H + 2·Hkv)·D]
        self.qkv_bias = (
            frozen_param(torch.cat([w.pop(f"{a}.{n}_proj.bias") for n in "qkv"]).to(dtype))
            if cfg.attention_bias
            else None
        )
        # Qwen3 with attention_bias: the output projection's bias, [hidden]
        self.o_bias = frozen_param(w.pop(f"{a}.o_proj.bias").to(dtype)) if cfg.o_proj_bias else None
        # Qwen3: RMSNorm over each head of q and of k before RoPE, weights [D]
        self.q_norm = norm(w.pop(f"{a}.q_norm.weight"), cfg.rms_norm_eps) if cfg.qk_norm else None
        self.k_norm = norm(w.pop(f"{a}.k_norm.weight"), cfg.rms_norm_eps) if cfg.qk_norm else None

    def pre(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, ops: TorchOps
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Norm, qkv projection and RoPE.

        Args:
            x: ``[T, hidden]`` residual stream.
            cos, sin: ``[T, 1, D]`` RoPE tables, or ``[K, T, 1, D]`` (one per RoPE
                setting; the layer reads its ``rope_slot``).
            ops: the kernel set.
        Returns:
            ``(q [T, H, D], k [T, Hkv, D], v [T, Hkv, D])`` in the model dtype.
        """
        t = x.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        if cos.dim() == 4:
            cos, sin = cos[self.rope_slot], sin[self.rope_slot]
        assert self.qkv is not None  # MLA layers attend through ``self.mla``
        qkv = self.qkv(apply_norm(self.input_norm, x, ops))  # [T, (H+2Hkv)*D]
        if self.qkv_bias is not None:
            qkv = qkv + self.qkv_bias
        q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
        if self.q_norm is not None and self.k_norm is not None:  # per head: [T·H, D] rows
            q = apply_norm(self.q_norm, q.reshape(t * h, d), ops)
            k = apply_norm(self.k_norm, k.reshape(t * hkv, d), ops)
        q, k = ops.rope(q.reshape(t, h, d), k.reshape(t, hkv, d), cos, sin)
        return q, k, v.reshape(t, hkv, d)

    def post(
        self,
        x: torch.Tensor,
        o: torch.Tensor,
        ops: TorchOps,
        rows: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Output projection, residual, norm, SwiGLU MLP (``down(silu(gate) * up)``),
        residual.

        Args:
            x: ``[T, hidden]`` residual stream before attention.
            o: ``[T, H, D]`` attention output.
            ops: the kernel set.
            rows: ``[R]`` int64 rows to keep (only the sampled rows after the last layer),
                or None for all.
        Returns:
            ``[T, hidden]`` (or ``[R, hidden]``) residual stream.
        """
        a = self.o_proj(o.reshape(o.shape[0], -1))  # [T, hidden]
        if self.o_bias is not None:
            a = a + self.o_bias
        if rows is not None:
            x, a = x.index_select(0, rows), a.index_select(0, rows)
        if self.ff_norms is not None:  # Gemma: norm the attention output, then the MLP's
            x = x + self.post_norm(a)
            return x + self.ff_norms[1](self._mlp(self.ff_norms[0](x), ops))
        h, x = ops.add_rms_norm(x, a, self.post_norm.weight, self.eps)
        return x + self._mlp(h, ops)

    def _mlp(self, h: torch.Tensor, ops: TorchOps) -> torch.Tensor:
        """The gated MLP (or the MoE): h ``[R, hidden]`` -> ``[R, hidden]``."""
        if self.moe is not None:
            return self.moe(h, ops.silu_mul)
        assert self.gate_up is not None and self.down is not None
        if self.gelu:
            return self.down(gelu_tanh_mul(self.gate_up(h)))
        return self.down(self.gate_up.forward_silu_mul(h, ops.silu_mul))


def norm_kind(cfg: ModelConfig) -> type[nn.Module]:
    """The RMSNorm of the model's blocks: Gemma's (1 + w) or Llama's."""
    return OffsetRMSNorm if cfg.gemma_blocks else RMSNorm
