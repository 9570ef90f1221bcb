"""Attention backend on FlashAttention-2 (Dao 2023) for CUDA GPUs, over houchu's paged
KV pool, through flash-attn's paged entry points (``block_table`` argument):

- every step: the new K/V go into the pool (``index_copy_``), then one
  ``flash_attn_varlen_func`` call attends all sequences' new queries over their pages,
  causal with the diagonal aligned to the end (flash-attn ≥ 2.1), so mixed prefill
  chunks and decodes share one launch;
- a decode step with fixed shapes (``decode_static``, for CUDA graphs):
  ``flash_attn_with_kvcache`` with ``cache_seqlens`` and ``block_table``.

flash-attn is imported lazily (it is the ``gpu`` extra). Its paged KV needs pages of a
multiple of 256 tokens and fp16/bf16 KV (no int8/fp8 pool); both are checked at startup.
A layer's sliding window, score scale and soft-cap go to flash-attn's ``window_size``,
``softmax_scale`` and ``softcap`` (the static decode path is plain: CUDA graphs are off
for such models).
"""

from __future__ import annotations

import functools
import importlib.util
import math

import torch

from houchu.model.attention.base import AttentionBackend
from houchu.model.attention.window import PLAIN, LayerAttention
from houchu.model.batch import StepBatch
from houchu.model.kv.pool import KVPool

FLASH_PAGE_MULTIPLE = 256


@functools.cache
def _installed() -> bool:
    return importlib.util.find_spec("flash_attn") is not None


@functools.cache
def flash_attn_importable() -> bool:
    """Whether ``import flash_attn`` works here (installed, and built for this torch and
    CUDA: an installed flash-attn built against another torch fails to import)."""
    if not _installed():
        return False
    try:
        import flash_attn  # noqa: F401
    except Exception:  # noqa: BLE001 (ImportError, OSError or a CUDA error from its .so)
        return False
    return True


def flash_attn_usable(page_size: int, kv_dtype: str) -> bool:
    """Whether flash-attn is installed and can serve this pool geometry and KV dtype."""
    return (
        _installed()
        and torch.cuda.is_available()
        and page_size % FLASH_PAGE_MULTIPLE == 0
        and kv_dtype == "auto"
    )


class FlashAttentionBackend(AttentionBackend):
    """flash-attn paged attention (CUDA, fp16/bf16 KV).

    Args:
        device: the CUDA device.
        page_size: tokens per KV page (a multiple of 256).
        kv_dtype: must be "auto".
    Raises:
        RuntimeError: flash-attn not installed, or no CUDA device.
        ValueError: page size or KV dtype flash-attn's paged kernels cannot take.
    """

    name = "flash-attn"
    supports_static = True

    def __init__(self, device: torch.device, page_size: int, kv_dtype: str) -> None:
        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            raise RuntimeError("the flash-attn backend needs a CUDA device")
        if not _installed():
            raise RuntimeError("flash-attn is not installed (pip install 'houchu[gpu]')")
        if page_size % FLASH_PAGE_MULTIPLE:
            raise ValueError(
                f"flash-attn's paged KV needs --page-size a multiple of "
                f"{FLASH_PAGE_MULTIPLE}, got {page_size}"
            )
        if kv_dtype != "auto":
            raise ValueError(
                f"flash-attn reads fp16/bf16 KV only; --kv-cache-dtype {kv_dtype} needs "
                "--attention-backend triton or torch"
            )
        import flash_attn  # noqa: F401 (fail here, at startup, if it cannot load)

        from houchu.gpu.triton.probe import triton_unusable

        self.ops_name = "triton" if triton_unusable(device) is None else "torch"

    def prepare(
        self, batch: StepBatch, layers: tuple[LayerAttention, ...] = ()
    ) -> dict[str, object]:
        dev = batch.token_ids.device
        q_lens = [batch.q_len(i) for i in range(batch.num_seqs)]
        cu_q = torch.tensor([0, *_cumsum(q_lens)], dtype=torch.int32, device=dev)
        cu_k = torch.tensor([0, *_cumsum(batch.kv_lens)], dtype=torch.int32, device=dev)
        return {
            "cu_q": cu_q,  # [S + 1] int32
            "cu_k": cu_k,  # [S + 1] int32
            "max_q": max(q_lens),
            "max_k": max(batch.kv_lens),
            "block_table": batch.page_tables.to(torch.int32),  # [S, max_pages]
            "layers": layers,  # each layer's window, scale and soft-cap
        }

    def forward(self, layer, q, k, v, pool, batch, meta):  # noqa: ANN001 (see base class)
        from flash_attn import flash_attn_varlen_func

        pool.write(layer, batch.slot_mapping, k, v)
        layers = meta["layers"]
        spec = layers[layer] if layers else PLAIN
        return flash_attn_varlen_func(
            q,  # [T, H, D]
            pool.k[layer],  # [P, ps, Hkv, D]
            pool.v[layer],
            meta["cu_q"],
            meta["cu_k"],
            meta["max_q"],
            meta["max_k"],
            softmax_scale=spec.scale_for(q.shape[-1]),
            causal=True,
            window_size=(spec.window - 1, 0) if spec.window else (-1, -1),
            softcap=spec.softcap,
            block_table=meta["block_table"],
        )  # [T, H, D]

    def decode_static(self, layer, q, k, v, pool: KVPool, slots, block_table, seq_lens):  # noqa: ANN001
        """See ``AttentionBackend.decode_static``."""
        from flash_attn import flash_attn_with_kvcache

        pool.write(layer, slots, k, v)
        o = flash_attn_with_kvcache(
            q[:, None],  # [B, 1, H, D]
            pool.k[layer],
            pool.v[layer],
            cache_seqlens=seq_lens,
            block_table=block_table,
            softmax_scale=1.0 / math.sqrt(q.shape[-1]),
            causal=True,
        )  # [B, 1, H, D]
        return o[:, 0]


def _cumsum(xs: list[int]) -> list[int]:
    out, s = [], 0
    for x in xs:
        s += x
        out.append(s)
    return out
