"""What every paged KV pool shares: its geometry, its size in bytes, budget sizing.

Paged KV (Kwon et al. 2023, "PagedAttention"): a pool is cut into ``num_pages`` pages of
``page_size`` token slots per layer, plus ``scratch_pages`` past them that padded rows of a
graph-captured step write to (the scheduler never sees those). ``KVPool``
(``houchu.model.kv.pool``) stores K and V in its pages, ``LatentKVPool``
(``houchu.model.kv.mla_pool``) an MLA model's latents.

``kv_page_bytes`` is the one owner of what a page costs: the pools size themselves with it,
the runner sizes its pool from GPU memory with it (``houchu.gpu.memory``) and the launcher
sizes the host tier's slots with it (``houchu.actors.kv_tier_setup``).
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch

from houchu.model.config.core import ModelConfig

#: ``--kv-cache-dtype`` values: the model dtype, int8 or float8_e4m3fn with float16 scales.
KV_DTYPES = ("auto", "int8", "fp8")
#: Bytes of one quantization scale (float16, one per token, layer, KV head, K and V each).
_SCALE_BYTES = 2


def kv_storage_dtype(kv_dtype: str, model_dtype: torch.dtype) -> torch.dtype:
    """The element dtype of the pool for ``--kv-cache-dtype`` ("auto" = model dtype).

    Raises:
        ValueError: unknown name.
    """
    if kv_dtype == "auto":
        return model_dtype
    if kv_dtype == "int8":
        return torch.int8
    if kv_dtype == "fp8":
        return torch.float8_e4m3fn
    raise ValueError(f"KV cache dtype must be one of {KV_DTYPES}, got {kv_dtype!r}")


def kv_token_bytes(cfg: ModelConfig, dtype: torch.dtype, kv_dtype: str = "auto") -> int:
    """Bytes one token's KV takes in the device pool, all layers (bytes).

    K plus V (``ModelConfig.kv_bytes_per_token``) at the storage dtype of ``kv_dtype``
    (``kv_storage_dtype``), plus one float16 scale per layer, KV head, K and V when that
    dtype is quantized (int8 / fp8). An MLA model (``cfg.mla``) stores its latents
    ``[c, k_pe]`` in the model dtype ``dtype`` whatever ``kv_dtype`` says (the runner
    notes at start-up that ``--kv-cache-dtype`` does not apply to it).

    Raises:
        ValueError: unknown ``kv_dtype``.
    """
    if cfg.is_mla:
        return cfg.kv_bytes_per_token(_element_size(dtype))
    store = kv_storage_dtype(kv_dtype, dtype)
    per_token = cfg.kv_bytes_per_token(_element_size(store))
    if store != dtype:
        per_token += 2 * cfg.num_layers * cfg.num_kv_heads * _SCALE_BYTES
    return per_token


def kv_page_bytes(
    cfg: ModelConfig, page_size: int, dtype: torch.dtype, kv_dtype: str = "auto"
) -> int:
    """Bytes of one KV page over all layers (bytes, scales included): ``page_size`` tokens
    (token slots) of ``kv_token_bytes``. A page of the device pool, a host-tier slot and an
    SSD-tier page all hold exactly this many bytes.

    Args:
        cfg: the model's configuration.
        page_size: tokens per page.
        dtype: the model dtype (what the runner resolved "auto" to on its device).
        kv_dtype: ``--kv-cache-dtype`` ("auto", "int8", "fp8").
    Raises:
        ValueError: unknown ``kv_dtype``.
    """
    return page_size * kv_token_bytes(cfg, dtype, kv_dtype)


def _element_size(dtype: torch.dtype) -> int:
    """Bytes of one element of ``dtype``."""
    return torch.empty((), dtype=dtype).element_size()


def pages_in_budget(memory_bytes: int, per_page: int) -> int:
    """How many pages of ``per_page`` bytes fit in ``memory_bytes`` bytes.

    Raises:
        ValueError: the budget holds not even one page.
    """
    num_pages = memory_bytes // per_page
    if num_pages < 1:
        raise ValueError(
            f"KV budget of {memory_bytes} bytes is less than one page ({per_page} bytes)"
        )
    return num_pages


class PagePool(ABC):
    """The geometry of a paged KV pool and the sizes that follow from it.

    Attributes:
        num_layers: decoder layers, each with its own pages.
        num_pages, page_size: pages the scheduler allocates, token slots per page.
        scratch_pages: extra pages past ``num_pages`` (page ``num_pages`` onwards).
        dtype: the model dtype reads return.

    Raises:
        ValueError: fewer than one page, or a page of fewer than one token.
    """

    def __init__(
        self,
        *,
        num_layers: int,
        num_pages: int,
        page_size: int,
        dtype: torch.dtype,
        scratch_pages: int = 0,
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"KV pool needs >= 1 page of >= 1 token, got {num_pages} x {page_size}"
            )
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.scratch_pages, self.dtype = scratch_pages, dtype

    @property
    def num_tokens(self) -> int:
        """Token slots in the pool (scratch pages not counted)."""
        return self.num_pages * self.page_size

    @property
    @abstractmethod
    def bytes_per_token(self) -> int:
        """Bytes stored per token slot, all layers."""

    @property
    def num_bytes(self) -> int:
        """Bytes the scheduler's pages occupy (scratch pages not counted)."""
        return self.num_tokens * self.bytes_per_token

    @abstractmethod
    def page_tensors(self) -> list[torch.Tensor]:
        """Every tensor holding page data, each ``[L, P, ...]`` (page dimension 1), for
        copies to and from host tiers."""
