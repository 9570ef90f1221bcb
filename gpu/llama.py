"""The Llama decoder (Touvron et al. 2023) over a flattened, paged batch.

Per block: RMSNorm (Zhang & Sennrich 2019) → attention with RoPE (Su et al. 2021) and
grouped-query KV heads (Ainslie et al. 2023) → residual → RMSNorm → SwiGLU MLP
(Shazeer 2020) → residual. The q/k/v projections are fused into one matrix and the
gate/up projections into another (fewer, larger matmuls; same arithmetic). Numerics
follow Hugging Face's ``LlamaForCausalLM`` (RMSNorm in fp32, rotate-half RoPE) so logits
match it.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from houchu.gpu.attention import AttentionBackend
from houchu.gpu.batch import StepBatch
from houchu.gpu.config import ModelConfig, ModelLoadError
from houchu.gpu.kv_pool import KVPool
from houchu.gpu.linear import Linear, onednn_available
from houchu.gpu.rope import apply_rope, rope_cos_sin, rope_inv_freq


def _param(t: torch.Tensor) -> nn.Parameter:
    return nn.Parameter(t, requires_grad=False)


class RMSNorm(nn.Module):
    """RMSNorm (Zhang & Sennrich 2019): ``w * x / sqrt(mean(x²) + eps)``, computed in fp32
    and cast back before the weight multiply (as Hugging Face's LlamaRMSNorm).

    weight: ``[hidden]``.
    """

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        self.weight = _param(weight)  # [hidden]
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[N, hidden]`` -> ``[N, hidden]``, same dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * xf.to(x.dtype)


class DecoderLayer(nn.Module):
    """One Llama block with fused qkv ``[(H + 2·Hkv)·D, hidden]`` and gate_up
    ``[2·intermediate, hidden]`` projections."""

    def __init__(self, cfg: ModelConfig, w: dict[str, torch.Tensor], prefix: str) -> None:
        super().__init__()
        self.num_heads, self.num_kv_heads, self.head_dim = (
            cfg.num_heads,
            cfg.num_kv_heads,
            cfg.head_dim,
        )
        self.input_norm = RMSNorm(w.pop(f"{prefix}.input_layernorm.weight"), cfg.rms_norm_eps)
        self.post_norm = RMSNorm(
            w.pop(f"{prefix}.post_attention_layernorm.weight"), cfg.rms_norm_eps
        )
        a, m = f"{prefix}.self_attn", f"{prefix}.mlp"
        qkv = [w.pop(f"{a}.{n}_proj.weight") for n in "qkv"]
        self.qkv = Linear(torch.cat(qkv))
        self.o_proj = Linear(w.pop(f"{a}.o_proj.weight"))
        self.gate_up = Linear(
            torch.cat([w.pop(f"{m}.gate_proj.weight"), w.pop(f"{m}.up_proj.weight")])
        )
        self.down = Linear(w.pop(f"{m}.down_proj.weight"))
        self.intermediate = cfg.intermediate_size

    def attention(
        self,
        layer: int,
        x: torch.Tensor,
        cos: torch.Tensor,
        sin: torch.Tensor,
        pool: KVPool,
        backend: AttentionBackend,
        batch: StepBatch,
        meta: object,
    ) -> torch.Tensor:
        """x: ``[T, hidden]`` (normed) -> attention output ``[T, hidden]``."""
        t = x.shape[0]
        h, hkv, d = self.num_heads, self.num_kv_heads, self.head_dim
        qkv = self.qkv(x)  # [T, (H + 2Hkv) * D]
        q, k, v = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
        q = apply_rope(q.view(t, h, d), cos, sin)  # [T, H, D]
        k = apply_rope(k.view(t, hkv, d), cos, sin)  # [T, Hkv, D]
        v = v.reshape(t, hkv, d)  # [T, Hkv, D]
        o = backend.forward(layer, q, k, v, pool, batch, meta)  # [T, H, D]
        return self.o_proj(o.reshape(t, h * d))

    def mlp(self, x: torch.Tensor) -> torch.Tensor:
        """SwiGLU: ``down(silu(gate(x)) * up(x))``. x: ``[N, hidden]`` -> ``[N, hidden]``."""
        gate, up = self.gate_up(x).split(self.intermediate, dim=-1)  # [N, I] each
        return self.down(F.silu(gate) * up)


class LlamaModel(nn.Module):
    """A Llama causal LM over paged KV.

    Build with ``LlamaModel.from_tensors``; run with ``forward(batch, pool, backend)``.
    With ``prepack`` on CPU the matmul weights switch to oneDNN's packed layout (see
    ``houchu.gpu.linear``); a tied LM head then keeps a packed copy of the embedding.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        w: dict[str, torch.Tensor],
        device: torch.device | str = "cpu",
        prepack: bool = True,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.layers = nn.ModuleList(
            DecoderLayer(cfg, w, f"model.layers.{i}") for i in range(cfg.num_layers)
        )
        self.norm = RMSNorm(w.pop("model.norm.weight"), cfg.rms_norm_eps)
        self.embed = _param(w.pop("model.embed_tokens.weight"))  # [V, hidden]
        self.tied = cfg.tie_word_embeddings
        head = self.embed if self.tied else w.pop("lm_head.weight")  # [V, hidden]
        self.lm_head = Linear(head)
        inv = rope_inv_freq(cfg, w.get("rope_freqs"))
        self.register_buffer("inv_freq", inv, persistent=False)  # [D/2] fp32
        self.to(device)
        self._num_params = sum(p.numel() for p in self.parameters())  # tied counted once
        self.prepacked = (
            prepack and torch.device(device).type == "cpu" and onednn_available(self.dtype)
        )
        if self.prepacked:
            for m in self.modules():
                if isinstance(m, Linear):
                    m.prepack_onednn(keep_dense=m is self.lm_head and self.tied)

    @classmethod
    def from_tensors(
        cls,
        cfg: ModelConfig,
        tensors: dict[str, torch.Tensor],
        device: torch.device | str = "cpu",
        prepack: bool = True,
    ) -> LlamaModel:
        """Build the model from Hugging Face-named tensors (as the loaders return them).

        The dict is consumed: per-projection tensors are dropped once fused.

        Raises:
            ModelLoadError: a required tensor is missing or has the wrong shape.
        """
        _check_shapes(cfg, tensors)
        return cls(cfg, tensors, device, prepack)

    @property
    def dtype(self) -> torch.dtype:
        """The weight dtype."""
        return self.embed.dtype

    def num_params(self) -> int:
        """Scalars in the model's weights (a tied head counted once)."""
        return self._num_params

    def forward(self, batch: StepBatch, pool: KVPool, backend: AttentionBackend) -> torch.Tensor:
        """Run one step: write every new token's K/V into the pool, return sampled logits.

        Args:
            batch: the flattened step (T new tokens of S sequences).
            pool: the KV pool; positions below each sequence's ``start_pos`` must already
                hold that sequence's K/V.
            backend: the attention backend.
        Returns:
            ``[R, vocab]`` float32 logits for ``batch.sample_rows`` (R may be 0).
        """
        x = F.embedding(batch.token_ids, self.embed)  # [T, hidden]
        cos, sin = rope_cos_sin(batch.positions, self.inv_freq, x.dtype)  # [T, 1, D] each
        meta = backend.prepare(batch)
        last = len(self.layers) - 1
        for i, layer in enumerate(self.layers):
            x = x + layer.attention(i, layer.input_norm(x), cos, sin, pool, backend, batch, meta)
            if i == last:  # only the sampled rows feed the head: skip the rest's MLP
                if batch.sample_rows.numel() == 0:
                    return torch.empty(0, self.cfg.vocab_size, device=x.device)  # [0, V]
                x = x.index_select(0, batch.sample_rows)  # [R, hidden]
            x = x + layer.mlp(layer.post_norm(x))
        x = self.norm(x)  # [R, hidden]
        return self.lm_head(x).float()  # [R, V]


def _check_shapes(cfg: ModelConfig, w: dict[str, torch.Tensor]) -> None:
    h, d, i = cfg.hidden_size, cfg.head_dim, cfg.intermediate_size
    want: dict[str, tuple[int, ...]] = {
        "model.embed_tokens.weight": (cfg.vocab_size, h),
        "model.norm.weight": (h,),
    }
    for n in range(cfg.num_layers):
        p = f"model.layers.{n}"
        want |= {
            f"{p}.input_layernorm.weight": (h,),
            f"{p}.post_attention_layernorm.weight": (h,),
            f"{p}.self_attn.q_proj.weight": (cfg.num_heads * d, h),
            f"{p}.self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
            f"{p}.self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
            f"{p}.self_attn.o_proj.weight": (h, cfg.num_heads * d),
            f"{p}.mlp.gate_proj.weight": (i, h),
            f"{p}.mlp.up_proj.weight": (i, h),
            f"{p}.mlp.down_proj.weight": (h, i),
        }
    if not cfg.tie_word_embeddings:
        want["lm_head.weight"] = (cfg.vocab_size, h)
    for name, shape in want.items():
        t = w.get(name)
        if t is None:
            raise ModelLoadError(f"missing tensor {name}")
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"tensor {name}: shape {tuple(t.shape)}, expected {shape}")
