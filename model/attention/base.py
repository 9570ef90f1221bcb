"""Attention backends: causal attention of each sequence's new queries over its paged KV.

A backend is chosen once at startup (``houchu.runner.backends.make_backend``). Per step, the model calls
``prepare(batch)`` once (indices and masks shared by every layer), then per layer
``forward``, which stores the new K/V in the pool and attends. Grouped-query attention
(GQA, Ainslie et al. 2023): query head h reads KV head h // (H / Hkv), as in Hugging
Face's ``repeat_kv``. Scaled dot-product attention: Vaswani et al. 2017.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import torch

from houchu.model.attention.window import LayerAttention
from houchu.model.batch import StepBatch
from houchu.model.kv.pool import KVPool


class AttentionBackend(ABC):
    """Interface of an attention implementation over the paged KV pool.

    ``ops_name`` names the kernel set (``houchu.runner.backends.make_ops``) the model uses with
    this backend; ``supports_static`` says whether it implements ``decode_static`` (a
    decode step whose every shape is fixed, for CUDA-graph capture).
    """

    name: str = "abstract"
    ops_name: str = "torch"
    supports_static: bool = False

    @abstractmethod
    def prepare(self, batch: StepBatch, layers: tuple[LayerAttention, ...] = ()) -> Any:
        """Per-step metadata shared by all layers (opaque to the model); ``layers``: each
        layer's window, scale and soft-cap (empty: plain causal attention in all)."""

    @abstractmethod
    def forward(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pool: KVPool,
        batch: StepBatch,
        meta: Any,
    ) -> torch.Tensor:
        """Write this step's K/V for ``layer`` and attend.

        Args:
            layer: layer index.
            q: ``[T, H, D]`` RoPE-rotated queries (model dtype).
            k: ``[T, Hkv, D]`` RoPE-rotated new keys.
            v: ``[T, Hkv, D]`` new values.
            pool: the KV pool (written at ``batch.slot_mapping``).
            batch: the step.
            meta: what ``prepare(batch)`` returned.
        Returns:
            ``[T, H, D]``: for each token, softmax(q·Kᵀ/√D)·V over its sequence's positions
            0..its own position (with the layer's ``LayerAttention`` given to ``prepare``:
            its scale, soft-cap, and only the last ``window`` positions).
        """

    def decode_static(
        self,
        layer: int,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        pool: KVPool,
        slots: torch.Tensor,
        block_table: torch.Tensor,
        seq_lens: torch.Tensor,
    ) -> torch.Tensor:
        """One-token-per-sequence attention with every shape fixed (graph-capturable):
        store k/v at ``slots`` and attend each row over its first ``seq_lens`` positions.

        Args:
            q: ``[B, H, D]``; k, v: ``[B, Hkv, D]``.
            slots: ``[B]`` int64 KV slots of the new tokens.
            block_table: ``[B, max_pages]`` int32 pages of each row.
            seq_lens: ``[B]`` int32 tokens each row attends over (its new one included).
        Returns:
            ``[B, H, D]``.
        Raises:
            NotImplementedError: the backend has no static path.
        """
        raise NotImplementedError(f"{self.name} has no static decode path")
