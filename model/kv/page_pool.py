"""What every paged KV pool shares: its geometry, its size in bytes, budget sizing.

Paged KV (Kwon et al. 2023, "PagedAttention"): a pool is cut into ``num_pages`` pages of
``page_size`` token slots per layer, plus ``scratch_pages`` past them that padded rows of a
graph-captured step write to (the scheduler never sees those). ``KVPool``
(``houchu.model.kv.pool``) stores K and V in its pages, ``LatentKVPool``
(``houchu.model.kv.mla_pool``) an MLA model's latents.
"""

from __future__ import annotations

from abc import ABC, abstractmethod

import torch


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
