"""The Llama decoder (Touvron et al. 2023) over a flattened, paged batch, with the
variations of the families built from its parts (``ModelConfig.architecture``): Qwen2's
q/k/v projection bias, Qwen3's per-head QK-norm, Qwen3-MoE's routed experts
(``houchu.model.moe``) in place of the dense MLP, DeepSeek-V2/V3's multi-head latent
attention (``houchu.model.mla``, over a pool of latents) with DeepSeekMoE, Mistral's
sliding windows and Gemma 2/3's blocks (``houchu.model.structure``: local and global
layers, (1 + w) norms around attention and the MLP, GeGLU, a scaled embedding,
soft-capping, a RoPE base per layer type; parts in ``houchu.model.block_parts`` and
``houchu.model.attention_window``).

Per block: RMSNorm (Zhang & Sennrich 2019) → attention with RoPE (Su et al. 2021) and
grouped-query KV heads (Ainslie et al. 2023) → residual → RMSNorm → SwiGLU MLP
(Shazeer 2020) → residual. The q/k/v projections are fused into one matrix and the
gate/up projections into another (fewer, larger matmuls; same arithmetic). Numerics
follow Hugging Face's ``LlamaForCausalLM`` (RMSNorm in fp32, rotate-half RoPE) so logits
match it.
"""

from __future__ import annotations

import dataclasses

import torch
import torch.nn.functional as F
from torch import nn

from houchu.model.attention import AttentionBackend
from houchu.model.attention_window import layer_attention
from houchu.model.autotune import DecodeRoute
from houchu.model.batch import StepBatch
from houchu.model.block_parts import OffsetRMSNorm, apply_norm, gelu_tanh_mul, softcap
from houchu.model.config import ModelConfig, ModelLoadError
from houchu.model.fused_cpu import FusedDecode
from houchu.model.kv_pool import KVPool
from houchu.model.linear import Linear, LinearBase, onednn_available
from houchu.model.mla import MLAAttention, prepare_mla
from houchu.model.moe import MoEMLP
from houchu.model.ops import TorchOps
from houchu.model.qlinear import fuse_weights, make_linear
from houchu.model.quant import Int4Weight, QuantSpec
from houchu.model.rope import RopeTable, rope_cos_sin, rope_inv_freq

Weights = dict[str, "torch.Tensor | Int4Weight"]

#: positions the RoPE table covers at most (8192 × head_dim × 2 values)
ROPE_TABLE_MAX = 8192


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
        norm = _norm_kind(cfg)
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
        self.mla = MLAAttention(cfg, w, a, lin, dtype) if cfg.mla is not None else None
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
            _param(torch.cat([w.pop(f"{a}.{n}_proj.bias") for n in "qkv"]).to(dtype))
            if cfg.attention_bias
            else None
        )
        # Qwen3 with attention_bias: the output projection's bias, [hidden]
        self.o_bias = _param(w.pop(f"{a}.o_proj.bias").to(dtype)) if cfg.o_proj_bias else None
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


class LlamaModel(nn.Module):
    """A Llama causal LM over paged KV.

    Build with ``LlamaModel.from_tensors``; run with ``forward(batch, pool, backend)``.
    With ``prepack`` on CPU the dense matmul weights switch to oneDNN's packed layout (see
    ``houchu.model.linear``); a tied LM head then keeps a packed copy of the embedding.
    ``quant`` selects quantized layers (``houchu.model.qlinear``); the embedding stays dense.
    ``ops`` is the kernel set (``houchu.model.ops``), TorchOps unless the runner swaps it.
    """

    def __init__(
        self,
        cfg: ModelConfig,
        w: Weights,
        device: torch.device | str = "cpu",
        prepack: bool = True,
        quant: QuantSpec | None = None,
    ) -> None:
        super().__init__()
        self.cfg = cfg
        self.quant = quant or QuantSpec()
        dev = torch.device(device)
        dtype = w["model.embed_tokens.weight"].dtype
        self.ops: TorchOps = TorchOps()
        self.fused: FusedDecode | None = None  # fused decode layers, set by the runner
        self.route: DecodeRoute | None = None  # measured decode paths (gpu.autotune)
        self.layers = nn.ModuleList(
            DecoderLayer(
                cfg, w, f"model.layers.{i}", self.quant, dev, dtype, i in cfg.moe_layers, i
            )
            for i in range(cfg.num_layers)
        )
        #: each layer's window, score scale and soft-cap, for the attention backend
        self.attention = layer_attention(cfg)
        self.norm = _norm_kind(cfg)(w.pop("model.norm.weight"), cfg.rms_norm_eps)
        self.embed = _param(w.pop("model.embed_tokens.weight"))  # [V, hidden]
        self.tied = cfg.tie_word_embeddings
        head = self.embed if self.tied else w.pop("lm_head.weight")  # [V, hidden]
        if self.quant.mode == "none":
            self.lm_head: LinearBase = Linear(head)
        else:
            self.lm_head = make_linear(head.data, self.quant, dev, dtype=dtype, head=True)
        inv = rope_inv_freq(cfg, w.get("rope_freqs"))
        self.register_buffer("inv_freq", inv, persistent=False)  # [D/2] fp32
        #: Gemma 3's local layers' RoPE (their own base, no scaling), or None
        local = None
        if cfg.rope_local_theta:
            local_cfg = dataclasses.replace(
                cfg, rope_theta=cfg.rope_local_theta, rope_type="default", rope_factor=1.0
            )
            local = rope_inv_freq(local_cfg)  # [D/2] fp32
        self.register_buffer("inv_freq_local", local, persistent=False)
        self._rope_tables: dict[int, RopeTable] = {}  # per slot, built on first use
        self.to(dev)
        self._num_params = sum(p.numel() for p in self.parameters()) + sum(
            m.out_features * m.in_features
            for m in self.linears()
            if not isinstance(m, Linear) and not (m is self.lm_head and self.tied)
        )
        self._bytes_at: dict[tuple[int, int], int] = {}  # weight_bytes_at's memo
        self.prepacked = prepack and dev.type == "cpu" and onednn_available(self.dtype)
        if self.prepacked:
            for m in self.modules():
                if isinstance(m, Linear):
                    m.prepack_onednn(keep_dense=m is self.lm_head and self.tied)

    @classmethod
    def from_tensors(
        cls,
        cfg: ModelConfig,
        tensors: Weights,
        device: torch.device | str = "cpu",
        prepack: bool = True,
        quant: QuantSpec | None = None,
    ) -> LlamaModel:
        """Build the model from Hugging Face-named tensors (as the loaders return them).

        The dict is consumed: per-projection tensors are dropped once fused.

        Raises:
            ModelLoadError: a required tensor is missing or has the wrong shape.
            ValueError: an int4 group size that does not divide a layer's input width.
        """
        _check_shapes(cfg, tensors)
        return cls(cfg, tensors, device, prepack, quant)

    @property
    def dtype(self) -> torch.dtype:
        """The model dtype (embedding, norms, residual stream, attention)."""
        return self.embed.dtype

    def num_params(self) -> int:
        """Scalars in the model's weights (a tied head counted once)."""
        return self._num_params

    def linears(self) -> list[LinearBase]:
        """Every projection, LM head last."""
        return [m for m in self.modules() if isinstance(m, LinearBase)]

    def weight_bytes(self) -> tuple[int, int]:
        """``(bytes, bf16_bytes)``: matmul weight bytes one decode step reads, as stored
        and as they would be in bfloat16 (the lever ledger's baseline); a MoE layer counts
        the experts one token runs (``MoEMLP.active_params_per_token``), an MLA layer its
        dense up-projections."""
        ls = self.linears()
        dense = sum(m.active_params_per_token() for m in self.modules() if isinstance(m, MoEMLP))
        # MLA's up-projections, kept dense for the absorbed form: [H, dn, r] and [H, dv, r]
        dense += sum(
            m.w_uk.numel() + m.w_uv.numel() for m in self.modules() if isinstance(m, MLAAttention)
        )
        stored = sum(m.weight_bytes() for m in ls) + dense * self.embed.element_size()
        return stored, sum(m.bf16_bytes() for m in ls) + 2 * dense

    def weight_bytes_at(self, rows: int, head_rows: int) -> int:
        """Matmul weight bytes a step of ``rows`` tokens sampling ``head_rows`` of them
        reads (layers pick their kernel, and so their weight copy, by row count)."""
        key = (rows, head_rows)
        if key not in self._bytes_at:
            *body, head = self.linears()
            self._bytes_at[key] = sum(m.weight_bytes_at(rows) for m in body) + (
                head.weight_bytes_at(head_rows)
            )
        return self._bytes_at[key]

    def embed_and_rope(
        self, token_ids: torch.Tensor, positions: torch.Tensor, max_pos: int | None = None
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """token_ids, positions: ``[T]`` int64 -> ``(x [T, hidden], cos [T, 1, D],
        sin [T, 1, D])`` in the model dtype (with a second RoPE setting, Gemma 3's, cos and
        sin are ``[2, T, 1, D]``: global, local). ``max_pos``, when given, bounds the
        positions: below the model's trained context (and ``ROPE_TABLE_MAX``) cos and sin
        are then looked up in a table (the same values as computing them). Gemma scales
        the embedding by sqrt(hidden) (rounded to the model dtype, as HF does)."""
        x = F.embedding(token_ids, self.embed)  # [T, hidden]
        if self.cfg.gemma_blocks:
            x = x * torch.tensor(self.cfg.hidden_size**0.5, dtype=x.dtype)
        cos, sin = self._rope(0, self.inv_freq, positions, max_pos, x)
        if self.inv_freq_local is not None:
            cos_l, sin_l = self._rope(1, self.inv_freq_local, positions, max_pos, x)
            return x, torch.stack((cos, cos_l)), torch.stack((sin, sin_l))
        return x, cos, sin

    def _rope(
        self,
        slot: int,
        inv_freq: torch.Tensor,
        positions: torch.Tensor,
        max_pos: int | None,
        x: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos, sin ``[T, 1, D]`` of one RoPE setting (see ``embed_and_rope``)."""
        n = min(self.cfg.max_position, ROPE_TABLE_MAX)
        if max_pos is not None and max_pos < n:
            table = self._rope_tables.get(slot)
            if table is None or table.cos.dtype != x.dtype or table.cos.device != x.device:
                table = RopeTable(inv_freq, x.dtype, n)
                self._rope_tables[slot] = table
            return table.lookup(positions)
        return rope_cos_sin(positions, inv_freq, x.dtype)  # [T, 1, D] each

    def head(self, x: torch.Tensor) -> torch.Tensor:
        """Final norm and LM head: x ``[R, hidden]`` -> ``[R, vocab]`` float32 logits
        (soft-capped where the model says: Gemma 2)."""
        logits = self.lm_head(apply_norm(self.norm, x, self.ops)).float()
        return softcap(logits, self.cfg.final_softcap)

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
        max_pos = max(batch.kv_lens, default=0) - 1
        x, cos, sin = self.embed_and_rope(batch.token_ids, batch.positions, max_pos)
        if self.cfg.mla is None:
            meta = backend.prepare(batch, self.attention)
        else:
            meta = prepare_mla(batch)
        last, ops = len(self.layers) - 1, self.ops
        first = 0  # layers [0, first) ran fused
        fused = self.fused.bind(batch, pool, meta) if self.fused is not None else None
        if fused is not None:
            # decode rows in order: the last layer too when every row is sampled
            first = last + (batch.sample_rows.numel() == batch.num_tokens)
            if first > last:
                return fused(first, x, cos, sin, head=True)  # [R, V]
            x = fused(first, x, cos, sin) if first else x  # [T, hidden]
        for i in range(first, last + 1):
            layer = self.layers[i]
            if layer.mla is not None:  # the latent pool; attention on torch ops
                h = ops.rms_norm(x, layer.input_norm.weight, layer.eps)
                o = layer.mla(h, cos, sin, i, pool, batch, meta, ops)  # [T, H, dv]
            else:
                q, k, v = layer.pre(x, cos, sin, ops)
                o = backend.forward(i, q, k, v, pool, batch, meta)  # [T, H, D]
            if i < last:
                x = layer.post(x, o, ops)
            elif batch.sample_rows.numel() == 0:  # KV written; nothing to sample
                return torch.empty(0, self.cfg.vocab_size, device=x.device)  # [0, V]
            else:  # only the sampled rows feed the last MLP and the head
                x = layer.post(x, o, ops, batch.sample_rows)  # [R, hidden]
        return self.head(x)  # [R, V]


def _norm_kind(cfg: ModelConfig) -> type[nn.Module]:
    """The RMSNorm of the model's blocks: Gemma's (1 + w) or Llama's."""
    return OffsetRMSNorm if cfg.gemma_blocks else RMSNorm


def _check_shapes(cfg: ModelConfig, w: Weights) -> None:
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
        }
        if cfg.mla is None:
            want |= {
                f"{p}.self_attn.q_proj.weight": (cfg.num_heads * d, h),
                f"{p}.self_attn.k_proj.weight": (cfg.num_kv_heads * d, h),
                f"{p}.self_attn.v_proj.weight": (cfg.num_kv_heads * d, h),
                f"{p}.self_attn.o_proj.weight": (h, cfg.num_heads * d),
            }
        else:  # MLA's own projections are checked by MLAAttention
            want[f"{p}.self_attn.o_proj.weight"] = (h, cfg.num_heads * cfg.mla.v_head_dim)
        if n in cfg.moe_layers:
            mi = cfg.moe_intermediate_size
            want[f"{p}.mlp.gate.weight"] = (cfg.num_experts, h)
            for e in range(cfg.num_experts):
                q = f"{p}.mlp.experts.{e}"
                want |= {
                    f"{q}.gate_proj.weight": (mi, h),
                    f"{q}.up_proj.weight": (mi, h),
                    f"{q}.down_proj.weight": (h, mi),
                }
            if cfg.n_shared_experts:
                si, q = cfg.n_shared_experts * mi, f"{p}.mlp.shared_experts"
                want |= {
                    f"{q}.gate_proj.weight": (si, h),
                    f"{q}.up_proj.weight": (si, h),
                    f"{q}.down_proj.weight": (h, si),
                }
        else:
            want |= {
                f"{p}.mlp.gate_proj.weight": (i, h),
                f"{p}.mlp.up_proj.weight": (i, h),
                f"{p}.mlp.down_proj.weight": (h, i),
            }
        if cfg.attention_bias:
            want |= {
                f"{p}.self_attn.q_proj.bias": (cfg.num_heads * d,),
                f"{p}.self_attn.k_proj.bias": (cfg.num_kv_heads * d,),
                f"{p}.self_attn.v_proj.bias": (cfg.num_kv_heads * d,),
            }
        if cfg.o_proj_bias:
            want[f"{p}.self_attn.o_proj.bias"] = (h,)
        if cfg.qk_norm:
            want |= {f"{p}.self_attn.q_norm.weight": (d,), f"{p}.self_attn.k_norm.weight": (d,)}
        if cfg.gemma_blocks:
            want |= {f"{p}.{n}_feedforward_layernorm.weight": (h,) for n in ("pre", "post")}
    if not cfg.tie_word_embeddings:
        want["lm_head.weight"] = (cfg.vocab_size, h)
    for name, shape in want.items():
        t = w.get(name)
        if t is None:
            raise ModelLoadError(f"missing tensor {name}")
        if tuple(t.shape) != shape:
            raise ModelLoadError(f"tensor {name}: shape {tuple(t.shape)}, expected {shape}")
