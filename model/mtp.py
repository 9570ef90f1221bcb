"""Multi-token prediction (MTP) layers: DeepSeek-V3's next-n prediction module, as a
speculative proposer's model part.

A checkpoint with ``num_nextn_predict_layers = 1`` stores one extra module as layer index
``num_hidden_layers`` (``model.layers.{N}.*`` in the Hugging Face safetensors; DeepSeek-V3
paper, section 2.2, "Multi-Token Prediction"; the layout of SGLang's ``deepseek_nextn.py``
and vLLM's ``deepseek_mtp.py``)::

    enorm, hnorm          RMSNorm [hidden] each
    eh_proj               [hidden, 2·hidden]
    a full decoder block  (MLA attention, MoE or dense MLP) with its own KV
    shared_head.norm      RMSNorm [hidden]
    shared_head.head      [vocab, hidden] (the target's LM head; optional here)
    embed_tokens          [vocab, hidden] (the target's embedding; optional here)

At position i it combines the target's final hidden state ``h_i`` (after the final norm,
as both references feed it) with the embedding of the next token ``t_{i+1}``::

    x_i = eh_proj([enorm(embed(t_{i+1})); hnorm(h_i)])     # [hidden]
    g_i = shared_head.norm(block(x_i))                     # attends over x_0 .. x_i
    logits_i = head(g_i)                                   # a guess of t_{i+2}

Further proposals chain the same layer on its own output: ``g_i`` takes the place of the
target's hidden state for the next position (vLLM's reuse of one MTP layer for k > 1).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from houchu.model.attention.base import AttentionBackend
from houchu.model.attention.mla import prepare_mla
from houchu.model.attention.window import layer_attention
from houchu.model.batch import StepBatch
from houchu.model.block_parts import apply_norm
from houchu.model.config.core import ModelConfig, ModelLoadError
from houchu.model.config.hf import config_from_hf
from houchu.model.decoder_layer import DecoderLayer, RMSNorm
from houchu.model.kv.pool import KVPool
from houchu.model.linear.dense import Linear, LinearBase
from houchu.model.llama import LlamaModel, attend
from houchu.model.quant.functions import QuantSpec
from houchu.model.weights.hf import safetensors_files

Weights = dict[str, torch.Tensor]


class MTPUnavailable(ValueError):
    """The checkpoint has no next-token-prediction layer houchu can load."""


def mtp_layer_index(path: str | Path) -> int:
    """The layer index of the checkpoint's first MTP module (``num_hidden_layers``).

    Raises:
        MTPUnavailable: a GGUF file, a folder whose config houchu cannot read or that
            declares no ``num_nextn_predict_layers`` (``ModelConfig.has_mtp``), or one
            whose safetensors lack the module's weights (``model.layers.{N}.eh_proj.weight``;
            transformers' ``from_config`` and ``save_pretrained`` drop them, for instance).
    """
    p = Path(path)
    if not p.is_dir():
        raise MTPUnavailable(
            f"{path}: --speculative mtp needs a Hugging Face folder (safetensors) whose "
            "checkpoint has next-token-prediction layers"
        )
    try:
        cfg = config_from_hf(p)
    except ModelLoadError as e:
        raise MTPUnavailable(str(e)) from e
    declared, n = cfg.mtp_layers, cfg.num_layers
    if not cfg.has_mtp:
        raise MTPUnavailable(
            f"{path}: the checkpoint has no MTP layers (config.json declares no "
            "num_nextn_predict_layers); use --speculative ngram or draft instead"
        )
    want = f"model.layers.{n}.eh_proj.weight"
    if not any(want in _names(f) for f in safetensors_files(p)):
        raise MTPUnavailable(
            f"{path}: config.json declares num_nextn_predict_layers={declared} but the "
            f"safetensors hold no {want} (the MTP weights were not saved); use "
            "--speculative ngram or draft instead"
        )
    return n


def _names(f: Path) -> set[str]:
    from safetensors import safe_open

    with safe_open(str(f), framework="pt", device="cpu") as st:
        return set(st.keys())


def load_mtp_tensors(path: str | Path, layer: int, dtype: torch.dtype) -> Weights:
    """The MTP module's tensors (``model.layers.{layer}.*``, Hugging Face names), CPU,
    ``dtype``, contiguous; only these are read from the safetensors files."""
    from safetensors import safe_open

    prefix = f"model.layers.{layer}."
    out: Weights = {}
    for f in safetensors_files(Path(path)):
        with safe_open(str(f), framework="pt", device="cpu") as st:
            for name in st.keys():  # noqa: SIM118 (safe_open is not a dict)
                if name.startswith(prefix) and not name.endswith("rotary_emb.inv_freq"):
                    out[name] = st.get_tensor(name).to(dtype).contiguous()
    return out


class MTPLayer(nn.Module):
    """One MTP module (see the module docstring) over a KV pool of its own.

    Args:
        target: the target model (its RoPE, kernels, and the embedding and LM head the
            module shares with it when the checkpoint does not repeat them).
        w: the module's tensors (``load_mtp_tensors``; consumed).
        layer: its layer index in the checkpoint (``num_hidden_layers``).
    Raises:
        KeyError: a tensor of the module is missing.
    """

    def __init__(self, target: LlamaModel, w: Weights, layer: int) -> None:
        super().__init__()
        cfg, p = target.cfg, f"model.layers.{layer}"
        dtype, dev = target.dtype, target.embed.device
        self.cfg, self.layer = cfg, layer
        self.enorm = RMSNorm(w.pop(f"{p}.enorm.weight"), cfg.rms_norm_eps)
        self.hnorm = RMSNorm(w.pop(f"{p}.hnorm.weight"), cfg.rms_norm_eps)
        self.eh_proj = Linear(w.pop(f"{p}.eh_proj.weight"))  # [hidden, 2·hidden]
        moe = f"{p}.mlp.gate.weight" in w
        self.block = DecoderLayer(cfg, w, p, QuantSpec(), dev, dtype, moe, layer)
        self.head_norm = RMSNorm(w.pop(f"{p}.shared_head.norm.weight"), cfg.rms_norm_eps)
        head = w.pop(f"{p}.shared_head.head.weight", None)  # [V, hidden]
        self.head: LinearBase = Linear(head) if head is not None else target.lm_head
        embed = w.pop(f"{p}.embed_tokens.weight", None)  # [V, hidden]
        self.embed = nn.Parameter(embed, requires_grad=False) if embed is not None else None
        self.target_embed = target.embed
        #: the block's attention settings (its window, scale, soft-cap), as layer 0
        self.attention = layer_attention(cfg)[-1:] if cfg.num_layers else ()
        self.to(dev)

    def pool_config(self) -> ModelConfig:
        """The config of a one-layer KV pool for this module's block."""
        import dataclasses

        return dataclasses.replace(self.cfg, num_layers=1)

    def forward(
        self,
        batch: StepBatch,
        hidden: torch.Tensor,
        target: LlamaModel,
        pool: KVPool,
        backend: AttentionBackend,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One pass of the module.

        Args:
            batch: its rows; row r's token is the next token ``t_{i+1}`` of position
                ``batch.positions[r] = i``, whose KV goes to layer 0 of ``pool``.
            hidden: ``[T, hidden]`` the previous hidden state of each row (the target's
                ``h_i`` after its final norm, or this module's own ``g`` when chaining).
            target: the target model (RoPE tables, kernels).
            pool: the module's one-layer KV pool.
            backend: the attention backend (a non-MLA block).
        Returns:
            ``(g [R, hidden] model dtype, logits [R, vocab] float32)`` for
            ``batch.sample_rows``.
        """
        ops = target.ops
        max_pos = max(batch.kv_lens, default=0) - 1
        _, cos, sin = target.embed_and_rope(batch.token_ids, batch.positions, max_pos)
        table = self.embed if self.embed is not None else self.target_embed
        e = F.embedding(batch.token_ids, table)  # [T, hidden]
        both = torch.cat([apply_norm(self.enorm, e, ops), apply_norm(self.hnorm, hidden, ops)], -1)
        x = self.eh_proj(both)  # [T, hidden]
        meta = prepare_mla(batch) if self.cfg.is_mla else backend.prepare(batch, self.attention)
        o = attend(self.block, 0, x, cos, sin, pool, batch, backend, meta, ops)
        x = self.block.post(x, o, ops, batch.sample_rows)  # [R, hidden]
        g = apply_norm(self.head_norm, x, ops)  # [R, hidden]
        return g, self.head(g).float()


def load_mtp_layer(target: LlamaModel, path: str | Path) -> MTPLayer:
    """The MTP module of the checkpoint at ``path`` (a Hugging Face folder), built beside
    ``target`` (its device and dtype; its embedding and LM head shared where the
    checkpoint does not repeat them), its CPU kernels prepared.

    Raises:
        MTPUnavailable: the checkpoint has no MTP layer (``mtp_layer_index``).
        KeyError: a tensor of the module is missing.
    """
    layer = mtp_layer_index(path)
    with torch.inference_mode():
        mtp = MTPLayer(target, load_mtp_tensors(path, layer, target.dtype), layer)
        for m in mtp.modules():
            if hasattr(m, "prepare_cpu_gemv"):
                m.prepare_cpu_gemv()
    return mtp
