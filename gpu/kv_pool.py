"""The device KV pool: one allocation holding every sequence's keys and values in pages.

Paged KV (Kwon et al. 2023, "PagedAttention"): the pool is cut into ``num_pages`` pages
of ``page_size`` token slots; a sequence's page table lists the pages holding its
positions (page i holds positions i*page_size .. (i+1)*page_size - 1), so sequences need
not be contiguous and pages can be shared. The scheduler owns page allocation; the pool
reserves nothing (page 0 is an ordinary page).
"""

from __future__ import annotations

import torch

from houchu.gpu.config import ModelConfig


class KVPool:
    """Keys and values of all layers.

    Attributes:
        k, v: ``[num_layers, num_pages, page_size, num_kv_heads, head_dim]`` in the model
            dtype, zero-initialised (so masked padding never reads NaN).
        num_pages, page_size: pool geometry.

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
    ) -> None:
        if num_pages < 1 or page_size < 1:
            raise ValueError(
                f"KV pool needs >= 1 page of >= 1 token, got {num_pages} x {page_size}"
            )
        shape = (num_layers, num_pages, page_size, num_kv_heads, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)  # [L, P, ps, Hkv, D]
        self.v = torch.zeros(shape, dtype=dtype, device=device)  # [L, P, ps, Hkv, D]
        self.num_layers, self.num_pages, self.page_size = num_layers, num_pages, page_size
        self.num_kv_heads, self.head_dim = num_kv_heads, head_dim
        # per-layer flat views [P * ps, Hkv, D] for slot-indexed writes
        self._k_flat = [self.k[i].view(-1, num_kv_heads, head_dim) for i in range(num_layers)]
        self._v_flat = [self.v[i].view(-1, num_kv_heads, head_dim) for i in range(num_layers)]

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
    ) -> KVPool:
        """Size a pool for ``cfg``: ``num_pages`` if given, else as many pages as fit in
        ``memory_bytes`` (bytes, K and V of all layers together).

        Raises:
            ValueError: the budget holds not even one page.
        """
        per_page = page_size * cfg.kv_bytes_per_token(torch.empty((), dtype=dtype).element_size())
        if num_pages is None:
            num_pages = memory_bytes // per_page
            if num_pages < 1:
                raise ValueError(
                    f"KV budget of {memory_bytes} bytes is less than one page ({per_page} bytes)"
                )
        return cls(
            num_layers=cfg.num_layers,
            num_pages=num_pages,
            page_size=page_size,
            num_kv_heads=cfg.num_kv_heads,
            head_dim=cfg.head_dim,
            dtype=dtype,
            device=device,
        )

    @property
    def num_tokens(self) -> int:
        """Token slots in the pool."""
        return self.num_pages * self.page_size

    @property
    def bytes_per_token(self) -> int:
        """Bytes of K + V per token slot, all layers."""
        return 2 * self.num_layers * self.num_kv_heads * self.head_dim * self.k.element_size()

    @property
    def num_bytes(self) -> int:
        """Bytes the pool occupies."""
        return self.num_tokens * self.bytes_per_token

    def write(self, layer: int, slots: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store a step's new keys and values.

        Args:
            layer: layer index.
            slots: ``[T]`` int64, slot = page * page_size + offset, all distinct.
            k, v: ``[T, Hkv, D]`` in the pool dtype.
        """
        self._k_flat[layer].index_copy_(0, slots, k)
        self._v_flat[layer].index_copy_(0, slots, v)

    def gather(
        self, layer: int, page_table: torch.Tensor, kv_len: int
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """One sequence's keys and values for positions 0..kv_len-1.

        Args:
            page_table: ``[n_pages]`` int64 (n_pages * page_size >= kv_len).
        Returns:
            ``(k, v)``, each ``[kv_len, Hkv, D]`` (a copy).
        """
        n = -(-kv_len // self.page_size)
        pages = page_table[:n]
        k = self.k[layer].index_select(0, pages).flatten(0, 1)[:kv_len]  # [kv_len, Hkv, D]
        v = self.v[layer].index_select(0, pages).flatten(0, 1)[:kv_len]  # [kv_len, Hkv, D]
        return k, v

    def gather_padded(
        self, layer: int, page_tables: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Several sequences' keys and values, padded to the same number of pages.

        Args:
            page_tables: ``[B, n_pages]`` int64 (padding entries may be any valid page).
        Returns:
            ``(k, v)``, each ``[B, n_pages * page_size, Hkv, D]`` (a copy; positions past a
            sequence's length hold whatever the padding pages hold: mask them).
        """
        b, n = page_tables.shape
        flat = page_tables.reshape(-1)
        k = self.k[layer].index_select(0, flat).view(b, n * self.page_size, *self.k.shape[3:])
        v = self.v[layer].index_select(0, flat).view(b, n * self.page_size, *self.v.shape[3:])
        return k, v
