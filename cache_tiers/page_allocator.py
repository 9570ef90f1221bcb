"""The device KV page allocator: which pages of the pool are free, and who holds the rest.

Pages are identified by their index in the runner's KV pool (``0 .. num_pages - 1``); each
page holds ``page_size`` consecutive token positions of one sequence. A page may be held
by several owners at once (a shared prefix), so the allocator counts references: a page
returns to the free list when its last reference is dropped. Check, then act:
``can_allocate(n)`` then ``allocate(n)``.

Pure Python; the KV tensors themselves live in ``model/kv/pool.py``.
"""

from __future__ import annotations

from collections import deque


class OutOfPages(Exception):
    """``allocate`` was asked for more pages than are free."""


class PageAllocator:
    """Reference-counted free list over ``num_pages`` KV pages.

    Args:
        num_pages: pages in the pool (> 0).
        page_size: tokens per page (> 0); used only for token arithmetic.
    Raises:
        ValueError: for a non-positive size.
    """

    def __init__(self, num_pages: int, page_size: int) -> None:
        if num_pages <= 0 or page_size <= 0:
            raise ValueError(f"need num_pages > 0 and page_size > 0, got {num_pages}, {page_size}")
        self.num_pages = num_pages
        self.page_size = page_size
        self._free: deque[int] = deque(range(num_pages))
        self._refs = [0] * num_pages

    @property
    def num_free(self) -> int:
        """Pages with no reference."""
        return len(self._free)

    @property
    def num_used(self) -> int:
        return self.num_pages - len(self._free)

    def pages_for(self, num_tokens: int) -> int:
        """Pages needed to hold ``num_tokens`` positions."""
        return -(-num_tokens // self.page_size)

    def can_allocate(self, n: int) -> bool:
        return n <= len(self._free)

    def allocate(self, n: int) -> list[int]:
        """Take ``n`` free pages, each with one reference.

        Raises:
            OutOfPages: fewer than ``n`` pages are free (nothing is taken then).
        """
        if n > len(self._free):
            raise OutOfPages(f"asked for {n} pages, {len(self._free)} free")
        pages = [self._free.popleft() for _ in range(n)]
        for p in pages:
            self._refs[p] = 1
        return pages

    def share(self, pages: list[int]) -> None:
        """Add one reference to each of ``pages`` (already held by someone)."""
        for p in pages:
            if self._refs[p] <= 0:
                raise ValueError(f"page {p} is free and cannot be shared")
            self._refs[p] += 1

    def free(self, pages: list[int]) -> None:
        """Drop one reference from each of ``pages``; unreferenced pages become free.

        Raises:
            ValueError: a page that is already free (a double free is a bug upstream).
        """
        for p in pages:
            if self._refs[p] <= 0:
                raise ValueError(f"double free of page {p}")
            self._refs[p] -= 1
            if self._refs[p] == 0:
                self._free.append(p)

    def ref_count(self, page: int) -> int:
        return self._refs[page]
