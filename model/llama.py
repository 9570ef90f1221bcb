"""The Llama decoder (Touvron et al. 2023) over a flattened, paged batch, with the
variations of the families built from its parts (``ModelConfig.architecture``): Qwen2's
q/k/v projection bias, Qwen3's per-head QK-norm, Qwen3-MoE's routed experts
(``houchu.model.moe``) in place of the dense MLP, DeepSeek-V2/V3's multi-head latent
attention (``houchu.model.attention.mla``, over a pool of latents) with DeepSeekMoE, Mistral's
sliding windows and Gemma 2/3's blocks (``houchu.model.config.structure``: local and global
layers, (1 + w) norms around attention and the MLP, GeGLU, a scaled embedding,
soft-capping, a RoPE base per layer type; parts in ``houchu.model.block_parts`` and
``houchu.model.attention.window``).

Per block: RMSNorm (Zhang & Sennrich 2019) → attention with RoPE (Su et al. 2021) and
grouped-query KV heads (Ainslie et al. 2023) → residual → RMSNorm → SwiGLU MLP
(Shazeer 2020) → residual. The q/k/v projections are fused into one matrix and the
gate/up projections into another (fewer, larger matmuls; same arithmetic). Numerics
follow Hugging Face's ``LlamaForCausalLM`` (RMSNorm in fp32, rotate-half RoPE) so logits
match it.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Protocol

import torch
import torch.nn.functional as F
from torch import nn

from houchu.model.attention.base import AttentionBackend
from houchu.model.attention.mla import MLAAttention, prepare_mla
from houchu.model.attention.window import layer_attention
from houchu.model.batch import StepBatch
from houchu.model.block_parts import apply_norm, softcap
from houchu.model.config.core import ModelConfig
from houchu.model.decoder_layer import DecoderLayer, frozen_param, norm_kind
from houchu.model.kv.pool import KVPool
from houchu.model.linear.decode_route import DecodeRoute
from houchu.model.linear.dense import Linear, LinearBase, onednn_available
from houchu.model.linear.factory import make_linear
from houchu.model.linear.quantized import Int4Linear
from houchu.model.moe import MoEMLP
from houchu.model.ops import TorchOps
from houchu.model.quant.functions import QuantSpec
from houchu.model.rope import RopeTable, rope_cos_sin, rope_inv_freq
from houchu.model.weights.shapes import HEAD_STORED, Weights, check_shapes


class FusedLayers(Protocol):
    """Decode layers fused into one call, which the runner may give the model
    (``houchu.cpu.fused_layers.FusedDecode``: the C++ kernels of the CPU)."""

    def bind(
        self, batch: StepBatch, pool: KVPool, meta: object
    ) -> Callable[..., torch.Tensor] | None:
        """This step's ``fn(layers, x, cos, sin, head=False)``, or None where the fused
        kernel does not apply (see ``FusedDecode.bind``)."""


#: positions the RoPE table covers at most (8192 × head_dim × 2 values)
ROPE_TABLE_MAX = 8192


class LlamaModel(nn.Module):
    """A Llama causal LM over paged KV.

    Build with ``LlamaModel.from_tensors``; run with ``forward(batch, pool, backend)``.
    With ``prepack`` on CPU the dense matmul weights switch to oneDNN's packed layout (see
    ``houchu.model.linear.dense``); a tied LM head then keeps a packed copy of the embedding.
    ``quant`` selects quantized layers (``houchu.model.linear.quantized``); the embedding stays dense.
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
        #: lines for the start-up output about how the weights were loaded (GPTQ's)
        self.load_notes: list[str] = []
        dev = torch.device(device)
        dtype = w["model.embed_tokens.weight"].dtype
        self.ops: TorchOps = TorchOps()
        self.fused: FusedLayers | None = None  # fused decode layers, set by the runner
        self.route: DecodeRoute | None = None  # measured decode paths (gpu.autotune)
        self.layers = nn.ModuleList(
            DecoderLayer(
                cfg, w, f"model.layers.{i}", self.quant, dev, dtype, i in cfg.moe_layers, i
            )
            for i in range(cfg.num_layers)
        )
        #: each layer's window, score scale and soft-cap, for the attention backend
        self.attention = layer_attention(cfg)
        self.norm = norm_kind(cfg)(w.pop("model.norm.weight"), cfg.rms_norm_eps)
        self.embed = frozen_param(w.pop("model.embed_tokens.weight"))  # [V, hidden]
        self.tied = cfg.tie_word_embeddings
        head = self.embed if self.tied else w.pop("lm_head.weight")  # [V, hidden]
        stored = w.pop(HEAD_STORED, None)  # a GGUF head as stored (Int4Weight), or None
        if self.quant.mode == "none":
            self.lm_head: LinearBase = Linear(head)
        else:
            hw = stored if stored is not None else head.data
            self.lm_head = make_linear(hw, self.quant, dev, dtype=dtype, head=True)
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
        self._finish(prepack)

    def _finish(self, prepack: bool) -> None:
        """Count the parameters, clear the weight-bytes memo and, with ``prepack`` on a
        CPU with oneDNN, switch the dense layers to its packed layout."""
        self._num_params = sum(p.numel() for p in self.parameters()) + sum(
            m.out_features * m.in_features
            for m in self.linears()
            if not isinstance(m, Linear) and not (m is self.lm_head and self.tied)
        )
        self._bytes_at: dict[tuple[int, int], int] = {}  # weight_bytes_at's memo
        cpu = self.embed.device.type == "cpu"
        self.prepacked = prepack and cpu and onednn_available(self.dtype)
        if self.prepacked:
            for m in self.modules():
                if isinstance(m, Linear) and m.weight is not None:
                    m.prepack_onednn(keep_dense=m is self.lm_head and self.tied)

    def quantize_linears(
        self, quant: QuantSpec, make: Callable[[str, Linear], LinearBase], prepack: bool
    ) -> None:
        """Replace every dense projection but the LM head, as built with
        ``QuantSpec("none")`` and ``prepack=False``, by ``make(module name, layer)``
        (e.g. GPTQ's int4 layer), and the LM head by ``quant``'s (int8 under int4, as
        ``make_linear`` builds it); then finish as the constructor does.

        Raises:
            RuntimeError: the model was prepacked or is already quantized.
        """
        if self.quant.mode != "none" or getattr(self, "prepacked", False):
            raise RuntimeError("quantize_linears needs a dense model built with prepack=False")
        for name, m in list(self.named_modules()):
            if isinstance(m, Linear) and m is not self.lm_head:
                parent, _, attr = name.rpartition(".")
                setattr(self.get_submodule(parent), attr, make(name, m))
        head = self.lm_head.weight
        assert head is not None
        dev = self.embed.device
        self.lm_head = make_linear(head.data, quant, dev, dtype=self.dtype, head=True)
        self.quant = quant
        self._finish(prepack)

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
        check_shapes(cfg, tensors)
        return cls(cfg, tensors, device, prepack, quant)

    @property
    def dtype(self) -> torch.dtype:
        """The model dtype (embedding, norms, residual stream, attention)."""
        return self.embed.dtype

    def num_params(self) -> int:
        """Scalars in the model's weights (a tied head counted once)."""
        return self._num_params

    def linears(self) -> list[LinearBase]:
        """Every projection (the routed experts' included), LM head last."""
        return [m for m in self.modules() if isinstance(m, LinearBase)]

    @property
    def rounded_int4(self) -> bool:
        """Whether some int4 projection was rounded from float weights (False: every one
        is a GGUF tensor served as stored, or none is int4)."""
        return any(isinstance(m, Int4Linear) and not m.stored for m in self.linears())

    def _moes(self) -> list[MoEMLP]:
        """The MoE layers (empty for a dense model)."""
        return [m for m in self.modules() if isinstance(m, MoEMLP)]

    def _dense_path_linears(self) -> list[LinearBase]:
        """``linears()`` without the routed experts' (which ``MoEMLP`` counts: only the
        experts a token runs), LM head last."""
        experts = {id(x) for m in self._moes() for x in m.expert_linears()}
        return [m for m in self.linears() if id(m) not in experts]

    def weight_bytes(self) -> tuple[int, int]:
        """``(bytes, bf16_bytes)``: matmul weight bytes one decode step reads, as stored
        and as they would be in bfloat16 (the lever ledger's baseline); a MoE layer counts
        its router and the ``top_k`` experts one token runs, as stored (int4 bytes when
        int4: ``MoEMLP.weight_bytes``), an MLA layer its dense up-projections."""
        ls = self._dense_path_linears()
        moe = [m.weight_bytes() for m in self._moes()]
        # MLA's up-projections, kept dense for the absorbed form: [H, dn, r] and [H, dv, r]
        dense = sum(
            m.w_uk.numel() + m.w_uv.numel() for m in self.modules() if isinstance(m, MLAAttention)
        )
        stored = sum(m.weight_bytes() for m in ls) + dense * self.embed.element_size()
        bf16 = sum(m.bf16_bytes() for m in ls) + 2 * dense
        return stored + sum(b[0] for b in moe), bf16 + sum(b[1] for b in moe)

    def weight_bytes_at(self, rows: int, head_rows: int) -> int:
        """Matmul weight bytes a step of ``rows`` tokens sampling ``head_rows`` of them
        reads (layers pick their kernel, and so their weight copy, by row count; a MoE
        layer counts the experts expected to get tokens: ``MoEMLP.weight_bytes_at``)."""
        key = (rows, head_rows)
        if key not in self._bytes_at:
            *body, head = self._dense_path_linears()
            self._bytes_at[key] = (
                sum(m.weight_bytes_at(rows) for m in body)
                + sum(m.weight_bytes_at(rows) for m in self._moes())
                + head.weight_bytes_at(head_rows)
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
        return self.logits_at(apply_norm(self.norm, x, self.ops))

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
        if self.cfg.is_mla:
            meta = prepare_mla(batch)
        else:
            meta = backend.prepare(batch, self.attention)
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
            o = attend(layer, i, x, cos, sin, pool, batch, backend, meta, ops)
            if i < last:
                x = layer.post(x, o, ops)
            elif batch.sample_rows.numel() == 0:  # KV written; nothing to sample
                return torch.empty(0, self.cfg.vocab_size, device=x.device)  # [0, V]
            else:  # only the sampled rows feed the last MLP and the head
                x = layer.post(x, o, ops, batch.sample_rows)  # [R, hidden]
        return self.head(x)  # [R, V]

    def final_hidden(
        self, batch: StepBatch, pool: KVPool, backend: AttentionBackend
    ) -> torch.Tensor:
        """Run every block over all new tokens of ``batch`` (writing their K/V into
        ``pool``, eagerly: no fused layers, no compiled step) and return each row's final
        hidden state after the final norm, ``[T, hidden]`` in the model dtype: what
        ``forward`` feeds its LM head, for every row instead of only the sampled ones
        (an MTP layer reads it: ``houchu.model.mtp``). ``logits_at`` turns rows of it
        into ``forward``'s logits."""
        max_pos = max(batch.kv_lens, default=0) - 1
        x, cos, sin = self.embed_and_rope(batch.token_ids, batch.positions, max_pos)
        meta = prepare_mla(batch) if self.cfg.is_mla else backend.prepare(batch, self.attention)
        for i, layer in enumerate(self.layers):
            o = attend(layer, i, x, cos, sin, pool, batch, backend, meta, self.ops)
            x = layer.post(x, o, self.ops)  # [T, hidden]
        return apply_norm(self.norm, x, self.ops)  # [T, hidden]

    def logits_at(self, hidden: torch.Tensor) -> torch.Tensor:
        """The LM head over final hidden states (``final_hidden``'s rows), ``[R, hidden]``
        -> ``[R, vocab]`` float32 logits, soft-capped where the model says (Gemma 2)."""
        return softcap(self.lm_head(hidden).float(), self.cfg.final_softcap)


def attend(
    layer: DecoderLayer,
    i: int,
    x: torch.Tensor,
    cos: torch.Tensor,
    sin: torch.Tensor,
    pool: KVPool,
    batch: StepBatch,
    backend: AttentionBackend,
    meta: object,
    ops: TorchOps,
) -> torch.Tensor:
    """The attention half of decoder block ``layer`` over x ``[T, hidden]``, its K/V (or
    MLA latents) written to layer ``i`` of ``pool``: the attention output ``[T, H, D]``
    (``[T, H, dv]`` for MLA), which ``layer.post`` finishes."""
    if layer.mla is not None:  # the latent pool; attention on torch ops
        h = ops.rms_norm(x, layer.input_norm.weight, layer.eps)
        return layer.mla(h, cos, sin, i, pool, batch, meta, ops)  # [T, H, dv]
    q, k, v = layer.pre(x, cos, sin, ops)
    return backend.forward(i, q, k, v, pool, batch, meta)  # [T, H, D]
