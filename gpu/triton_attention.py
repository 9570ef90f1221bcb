"""Attention backend on Triton kernels: the KV page store (with int8 / fp8 quantization)
and paged decode attention (``houchu.gpu.triton.paged_attention``). Prefill chunks run through
the torch backend's SDPA path (``TorchSDPABackend``), which this class extends.

Runs on a CUDA device, or on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``,
for tests). Decode has a static path (``decode_static``), so CUDA graphs can capture it.
"""

from __future__ import annotations

import torch

from houchu.gpu.triton.ops import store_kv
from houchu.gpu.triton.paged_attention import paged_decode
from houchu.model.attention.metadata import TorchMeta
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.attention.window import PLAIN, LayerAttention
from houchu.model.kv.pool import KVPool


class TritonBackend(TorchSDPABackend):
    """Triton KV store and paged decode; torch SDPA for prefill chunks."""

    name = "triton"
    ops_name = "triton"
    supports_static = True

    @staticmethod
    def store(
        pool: KVPool, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Write new K/V ``[T, Hkv, D]`` at ``slots`` ``[T]`` with the fused store kernel."""
        store_kv(pool, layer, slots, k, v)

    def _decode(
        self,
        layer: int,
        q: torch.Tensor,
        pool: KVPool,
        meta: TorchMeta,
        spec: LayerAttention = PLAIN,
    ) -> torch.Tensor:
        """Batched one-token attention. q: ``[B, H, D]`` -> ``[B, H, D]``. A layer with a
        window, scale or soft-cap the kernel does not compute runs the torch path."""
        if not spec.is_plain or meta.decode_starts is not None:
            return super()._decode(layer, q, pool, meta, spec)
        return paged_decode(q, pool, layer, meta.decode_pages, meta.decode_lens)

    def decode_static(self, layer, q, k, v, pool, slots, block_table, seq_lens):  # noqa: ANN001
        """See ``AttentionBackend.decode_static``; reads only each row's live pages."""
        self.store(pool, layer, slots, k, v)
        return paged_decode(q, pool, layer, block_table, seq_lens)
