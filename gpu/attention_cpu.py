"""Attention backend on houchu's C++ CPU kernels (``houchu.gpu.cpu_kernels``).

Decode rows attend in place over the paged pool through their page tables
(``torch.ops.houchu_cpu.paged_decode_attention``: no gather into a padded copy, no mask
tensor, one call per layer); prefill chunks and speculative verification run through the
torch backend's SDPA path (``TorchSDPABackend``), which this class extends. Its kernel
set is ``houchu.gpu.ops.CpuOps`` (fused RMSNorm, RoPE, SiLU·mul). An fp8 pool, which the
C++ kernel does not read, decodes through the torch path.
"""

from __future__ import annotations

import math

import torch

from houchu.gpu.attention import TorchSDPABackend, _TorchMeta
from houchu.gpu.kv_pool import KVPool


class CpuBackend(TorchSDPABackend):
    """C++ paged decode attention; torch SDPA for prefill chunks. CPU only.

    Raises (at construction):
        houchu.gpu.cpu_kernels.CpuKernelsUnavailable: the kernels cannot be built here.
    """

    name = "cpu"
    ops_name = "cpu"

    def __init__(self) -> None:
        from houchu.gpu import cpu_kernels

        self.build_s = cpu_kernels.load()

    def _decode(self, layer: int, q: torch.Tensor, pool: KVPool, meta: _TorchMeta) -> torch.Tensor:
        """Batched one-token attention. q: ``[B, H, D]`` -> ``[B, H, D]``."""
        if pool.k.dtype not in (q.dtype, torch.int8):
            return super()._decode(layer, q, pool, meta)
        scales = (pool.k_scale[layer], pool.v_scale[layer]) if pool.quantized else (None, None)
        return torch.ops.houchu_cpu.paged_decode_attention(
            q,
            pool.k[layer],  # [P, page_size, Hkv, D]
            pool.v[layer],
            *scales,  # [P, page_size, Hkv] float16 each, or None
            meta.decode_pages,  # [B, n_pages] int64
            meta.decode_lens,  # [B] int32
            1.0 / math.sqrt(q.shape[-1]),
        )
