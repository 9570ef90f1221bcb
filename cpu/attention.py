"""Attention backend on houchu's C++ CPU kernels (``houchu.cpu.kernels``).

Decode rows attend in place over the paged pool through their page tables
(``cpu_kernels.ops().paged_decode_attention``: no gather into a padded copy, no mask
tensor, one call per layer); prefill chunks run through the tiled causal kernel
(``cpu_kernels.ops().prefill_attention``: no mask tensor, key blocks past the diagonal
skipped, about 3x torch's SDPA on bfloat16); speculative verification runs through the
torch backend's SDPA path (``TorchSDPABackend``), which this class extends. Its kernel
set is ``houchu.model.ops.CpuOps`` (fused RMSNorm, RoPE, SiLU·mul). An fp8 pool, which the
C++ kernel does not read, decodes through the torch path. Per-layer variants (``houchu.model.attention.window``): decode reads only
each row's window (the kernel's ``starts``: the first position attended, within pages
from the window's first page) with the layer's scale; prefill chunks read K/V from the
page holding their first query's window start and the kernel masks the keys before each
query's window (``window``); soft-capped layers (Gemma 2) run on torch ops (the C++
kernels do not soft-cap). At the NEON levels, whose prefill kernel has no tiled path yet,
prefill runs on torch's SDPA (``cpu_kernels.tiled_prefill``).
"""

from __future__ import annotations

import torch

from houchu.cpu import kernels as cpu_kernels
from houchu.model.attention.metadata import PrefillSeq, TorchMeta
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.attention.window import PLAIN, LayerAttention
from houchu.model.kv.pool import KVPool


class CpuBackend(TorchSDPABackend):
    """C++ paged decode and causal prefill attention; torch SDPA for verification. CPU only.

    Raises (at construction):
        houchu.cpu.kernels.CpuKernelsUnavailable: the kernels cannot be built here.
    """

    name = "cpu"
    ops_name = "cpu"

    def __init__(self) -> None:
        self.build_s = cpu_kernels.load()

    def _decode(
        self,
        layer: int,
        q: torch.Tensor,
        pool: KVPool,
        meta: TorchMeta,
        spec: LayerAttention = PLAIN,
    ) -> torch.Tensor:
        """Batched one-token attention. q: ``[B, H, D]`` -> ``[B, H, D]``."""
        if pool.k.dtype not in (q.dtype, torch.int8) or spec.softcap:
            return super()._decode(layer, q, pool, meta, spec)
        scales = (pool.k_scale[layer], pool.v_scale[layer]) if pool.quantized else (None, None)
        return cpu_kernels.ops().paged_decode_attention(
            q,
            pool.k[layer],  # [P, page_size, Hkv, D]
            pool.v[layer],
            *scales,  # [P, page_size, Hkv] float16 each, or None
            meta.decode_pages,  # [B, n_pages] int64
            meta.decode_lens,  # [B] int32
            spec.scale_for(q.shape[-1]),
            meta.decode_starts,  # [B] int32 or None
        )

    def _prefill(
        self,
        q: torch.Tensor,
        k: torch.Tensor,
        v: torch.Tensor,
        seq: PrefillSeq,
        spec: LayerAttention = PLAIN,
    ) -> torch.Tensor:
        """Causal attention of one sequence's new tokens. q: ``[n, H, D]``; k, v:
        ``[L - base, Hkv, D]`` (its KV from position ``seq.base``) -> ``[n, H, D]``."""
        if q.dtype not in (torch.float32, torch.bfloat16) or k.dtype != q.dtype or spec.softcap:
            return super()._prefill(q, k, v, seq, spec)
        if not cpu_kernels.tiled_prefill():  # NEON: torch's vectorized SDPA, not a scalar loop
            return super()._prefill(q, k, v, seq, spec)
        scale = spec.scale_for(q.shape[-1])
        start = seq.start - seq.base  # k, v begin at position base
        return cpu_kernels.ops().prefill_attention(q, k, v, start, scale, spec.window)
