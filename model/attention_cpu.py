"""Attention backend on houchu's C++ CPU kernels (``houchu.model.cpu_kernels``).

Decode rows attend in place over the paged pool through their page tables
(``cpu_kernels.ops().paged_decode_attention``: no gather into a padded copy, no mask
tensor, one call per layer); prefill chunks run through the tiled causal kernel
(``cpu_kernels.ops().prefill_attention``: no mask tensor, key blocks past the diagonal
skipped, about 3x torch's SDPA on bfloat16); speculative verification runs through the
torch backend's SDPA path (``TorchSDPABackend``), which this class extends. Its kernel
set is ``houchu.model.ops.CpuOps`` (fused RMSNorm, RoPE, SiLU·mul). An fp8 pool, which the
C++ kernel does not read, decodes through the torch path.
"""

from __future__ import annotations

import math

import torch

from houchu.model import cpu_kernels
from houchu.model.attention import TorchSDPABackend, _PrefillSeq, _TorchMeta
from houchu.model.kv_pool import KVPool


class CpuBackend(TorchSDPABackend):
    """C++ paged decode and causal prefill attention; torch SDPA for verification. CPU only.

    Raises (at construction):
        houchu.model.cpu_kernels.CpuKernelsUnavailable: the kernels cannot be built here.
    """

    name = "cpu"
    ops_name = "cpu"

    def __init__(self) -> None:
        self.build_s = cpu_kernels.load()

    def _decode(self, layer: int, q: torch.Tensor, pool: KVPool, meta: _TorchMeta) -> torch.Tensor:
        """Batched one-token attention. q: ``[B, H, D]`` -> ``[B, H, D]``."""
        if pool.k.dtype not in (q.dtype, torch.int8):
            return super()._decode(layer, q, pool, meta)
        scales = (pool.k_scale[layer], pool.v_scale[layer]) if pool.quantized else (None, None)
        return cpu_kernels.ops().paged_decode_attention(
            q,
            pool.k[layer],  # [P, page_size, Hkv, D]
            pool.v[layer],
            *scales,  # [P, page_size, Hkv] float16 each, or None
            meta.decode_pages,  # [B, n_pages] int64
            meta.decode_lens,  # [B] int32
            1.0 / math.sqrt(q.shape[-1]),
        )

    def _prefill(
        self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq: _PrefillSeq
    ) -> torch.Tensor:
        """Causal attention of one sequence's new tokens. q: ``[n, H, D]``; k, v:
        ``[L, Hkv, D]`` (its whole KV, cached prefix first) -> ``[n, H, D]``."""
        if q.dtype not in (torch.float32, torch.bfloat16) or k.dtype != q.dtype:
            return super()._prefill(q, k, v, seq)
        return cpu_kernels.ops().prefill_attention(q, k, v, seq.start, 1.0 / math.sqrt(q.shape[-1]))
