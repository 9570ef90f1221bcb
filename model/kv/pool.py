"""The device KV pool: one allocation holding every sequence's keys and values in pages.

Paged KV (Kwon et al. 2023, "PagedAttention"): the pool is cut into ``num_pages`` pages
of ``page_size`` token slots; a sequence's page table lists the pages holding its
positions (page i holds positions i*page_size .. (i+1)*page_size - 1), so sequences need
not be contiguous and pages can be shared. The scheduler owns page allocation; the pool
reserves nothing (page 0 is an ordinary page).

KV quantization (``kv_dtype`` "int8" or "fp8"): keys and values are stored as int8
(symmetric, ``scale = absmax / 127``) or float8_e4m3fn (``scale = absmax / 448``) with one
float16 scale per token and KV head (``[L, P, page_size, Hkv]``), so appending a token
never rescales what a page already holds; reads dequantize to the model dtype. A token's
K+V then costs ``2·L·Hkv·(D + 2)`` bytes instead of ``2·L·Hkv·D·2`` in bf16: 1.94x the
tokens in the same pool at D = 64. Quantized KV: Hooper et al. 2024 "KVQuant" and
vLLM's fp8 KV cache use the same per-head symmetric form.
"""

from __future__ import annotations

import torch

from houchu.model.config.core import ModelConfig
from houchu.model.kv.page_pool import PagePool, kv_page_bytes, kv_storage_dtype, pages_in_budget

_QMAX = {torch.int8: 127.0, torch.float8_e4m3fn: 448.0}
_SCALE_MIN = 2.0**-14  # smallest normal float16: scales never underflow


def quantize_kv(x: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-(token, head) symmetric quantization.

    Args:
        x: ``[T, Hkv, D]`` float keys or values.
        dtype: torch.int8 or torch.float8_e4m3fn.
    Returns:
        ``(q [T, Hkv, D] dtype, scale [T, Hkv] float16)`` with ``x ≈ q * scale``.
    """
    qmax = _QMAX[dtype]
    xf = x.float()
    scale = (xf.abs().amax(-1) / qmax).clamp(_SCALE_MIN, 65504.0).half()  # [T, Hkv]
    y = (xf / scale.float()[..., None]).clamp(-qmax, qmax)
    return (y.round() if dtype == torch.int8 else y).to(dtype), scale


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """``q [..., D] * scale [...]`` in ``dtype`` (the inverse of ``quantize_kv``)."""
    return (q.to(torch.float32) * scale.float()[..., None]).to(dtype)


class KVPool(PagePool):
    """Keys and values of all layers.

    Attributes:
        k, v: ``[num_layers, num_pages, page_size, num_kv_heads, head_dim]`` in the
            storage dtype (the model dtype, or int8 / float8_e4m3fn), zero-initialised (so
            masked padding never reads NaN).
        k_scale, v_scale: ``[num_layers, num_pages, page_size, num_kv_heads]`` float16
            (quantized pools only, else None).
        dtype: the model dtype reads return.
        num_pages, page_size: pool geometry.
        scratch_pages: extra pages past ``num_pages`` (page ``num_pages`` onwards) that
            padded rows of a graph-captured step write to; the scheduler never sees them.

    Raises:
        ValueError: fewer than one page, or a page of fewer than one token.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        kv_dtype: str = "auto",
        scratch_pages: int = 0,
    ) -> None:
        super().__init__(
            num_layers=num_layers,
            num_pages=num_pages,
            page_size=page_size,
            dtype=dtype,
            scratch_pages=scratch_pages,
        )
        shape = (num_layers, num_pages + scratch_pages, page_size, num_kv_heads, head_dim)
        self.kv_dtype = kv_dtype
        store = kv_storage_dtype(kv_dtype, dtype)
        self.quantized = store != dtype
        self.k = torch.zeros(shape, dtype=store, device=device)  # [L, P, ps, Hkv, D]
        self.v = torch.zeros(shape, dtype=store, device=device)  # [L, P, ps, Hkv, D]
        self.k_scale: torch.Tensor | None = None
        self.v_scale: torch.Tensor | None = None
        if self.quantized:
            self.k_scale = torch.zeros(shape[:-1], dtype=torch.float16, device=device)
            self.v_scale = torch.zeros(shape[:-1], dtype=torch.float16, device=device)
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim

    @classmethod
    def for_model(
        cls,
        cfg: ModelConfig,
        *,
        page_size: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        num_pages: int | None = None,
        memory_bytes: int = 1 << 30,
        kv_dtype: str = "auto",
        scratch_pages: int = 0,
    ) -> KVPool:
        """Size a pool for ``cfg``: ``num_pages`` if given, else as many pages as fit in
        ``memory_bytes`` (bytes, K and V of all layers together, scales included). An MLA
        model (``cfg.mla``) gets a ``houchu.model.kv.mla_pool.LatentKVPool`` (its latents, not K/V).

        Raises:
            ValueError: the budget holds not even one page, an unknown ``kv_dtype``, or a
                quantized ``kv_dtype`` for an MLA model.
        """
        if cfg.is_mla:
            from houchu.model.kv.mla_pool import LatentKVPool

            if kv_dtype != "auto":
                raise ValueError(f"MLA's latent KV cache is stored in {dtype}, not {kv_dtype}")
            return LatentKVPool.for_model(  # type: ignore[return-value]
                cfg,
                page_size=page_size,
                dtype=dtype,
                device=device,
                num_pages=num_pages,
                memory_bytes=memory_bytes,
                scratch_pages=scratch_pages,
            )
        if num_pages is None:
            num_pages = pages_in_budget(
                memory_bytes, kv_page_bytes(cfg, page_size, dtype, kv_dtype)
            )
        return cls(
            num_layers=cfg.num_layers,
            num_pages=num_pages,
            page_size=page_size,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dtype=dtype,
            device=device,
            kv_dtype=kv_dtype,
            scratch_pages=scratch_pages,
        )

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K + V per token slot, all layers (scales included)."""
        per_head = self.head_dim * self.k.element_size() + (2 if self.quantized else 0)
        return 2 * self.num_layers * self.num_kv_heads * per_head

    @property
    def bf16_bytes_per_token(self) -> int:
        """What a token's K + V would cost in bfloat16 (the lever ledger's baseline)."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * 2

    def page_tensors(self) -> list[torch.Tensor]:
        """Every tensor holding page data, each ``[L, P, ...]`` (page dimension 1): K and
        V, then their scales in a quantized pool (for copies to and from host tiers)."""
        scales = [self.k_scale, self.v_scale] if self.quantized else []
        return [self.k, self.v, *scales]

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a step's new keys and values (quantizing them in a quantized pool).

        Args:
            layer: layer index.
            slots: ``[T]`` int64, slot = page * page_size + offset, all distinct.
            k, v: ``[T, Hkv, D]`` in the model dtype.
        """
        hkv, d = self.num_kv_heads, self.head_dim
        kf, vf = self.k[layer].view(-1, hkv, d), self.v[layer].view(-1, hkv, d)
        if self.quantized:
            kq, ks = quantize_kv(k, self.k.dtype)
            vq, vs = quantize_kv(v, self.v.dtype)
            # byte views: index_copy_ has no float8 kernel on every device
            kf.view(torch.uint8).index_copy_(0, slots, kq.view(torch.uint8))
            vf.view(torch.uint8).index_copy_(0, slots, vq.view(torch.uint8))
            self.k_scale[layer].view(-1, hkv).index_copy_(0, slots, ks)
            self.v_scale[layer].view(-1, hkv).index_copy_(0, slots, vs)
        else:
            kf.index_copy_(0, slots, k)
            vf.index_copy_(0, slots, v)

    def _read(self, layer: int, pages: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """K and V of ``pages`` ``[n]``: each ``[n, page_size, Hkv, D]`` in the model dtype."""
        if not self.quantized:
            return self.k[layer].index_select(0, pages), self.v[layer].index_select(0, pages)
        st = self.k.dtype  # byte views: index_select has no float8 kernel on every device
        k = self.k[layer].view(torch.uint8).index_select(0, pages).view(st)
        v = self.v[layer].view(torch.uint8).index_select(0, pages).view(st)
        k = dequantize_kv(k, self.k_scale[layer].index_select(0, pages), self.dtype)
        v = dequantize_kv(v, self.v_scale[layer].index_select(0, pages), self.dtype)
        return k, v

    def gather(
        self, layer: int, page_table: torch.Tensor, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's keys and values for positions 0..kv_len-1.

        Args:
            page_table: ``[n_pages]`` int64 (n_pages * page_size >= kv_len).
        Returns:
            ``(k, v)``, each ``[kv_len, Hkv, D]`` in the model dtype (a copy).
        """
        n = -(-kv_len // self.page_size)
        k, v = self._read(layer, page_table[:n])
        return k.flatten(0, 1)[:kv_len], v.flatten(0, 1)[:kv_len]

    def gather_padded(
        self, layer: int, page_tables: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Several sequences' keys and values, padded to the same number of pages.

        Args:
            page_tables: ``[B, n_pages]`` int64 (padding entries may be any valid page).
        Returns:
            ``(k, v)``, each ``[B, n_pages * page_size, Hkv, D]`` in the model dtype (a
            copy; positions past a sequence's length hold whatever the padding pages hold:
            mask them).
        """
        b, n = page_tables.shape
        k, v = self._read(layer, page_tables.reshape(-1))
        shape = (b, n * self.page_size, self.num_kv_heads, self.head_dim)
        return k.view(shape), v.view(shape)
