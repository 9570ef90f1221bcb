"""Sliding-window page release: a model whose every layer attends only the last W
positions (``RunnerInfo.sliding_window``; Mistral) never reads a request's KV older than
its window again, so the request stops holding those pages.

The next position a request computes, ``num_computed``, attends positions
``num_computed - W + 1 ..`` and every later one attends later positions still, so the
pages wholly before ``num_computed - W + 1`` are dead for it. The request drops its
reference to each: a page nobody else holds returns to the free list ("freed"); a page
the radix tree (or another request sharing the prefix) holds stays there ("cached"). The
tree frees it under memory pressure even while this request runs: it hollows the node
(``kvcache.radix_tree``), and a later request matching that prefix resumes at the deepest
prefix whose own window still holds KV. Dead entries stay in
the page table as placeholders (``Request.num_dead_pages`` leading ones) so that page
``i`` still holds positions ``i * page_size ..``; attention never reads them.
"""

from __future__ import annotations

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.scheduler.request import Request
from houchu.transport.stats import WindowStats


class WindowPages:
    """Releases the pages outside every window of a request.

    Args:
        window: tokens every layer attends, the query's own included (0: the model has
            a layer that reads everything; nothing is released).
        page_size: tokens per page.
    """

    def __init__(self, window: int, page_size: int) -> None:
        self.window = window
        self.page_size = page_size
        self.pages_released = 0  # references requests dropped
        self.pages_freed = 0  # of those, pages that went back to the free list

    def release(self, req: Request, allocator: PageAllocator) -> int:
        """Drop ``req``'s references to its pages before its window; returns how many.

        Call after ``req.num_computed`` grew (and its full pages were indexed)."""
        if not self.window:
            return 0
        dead = min(
            max(0, req.num_computed - self.window + 1) // self.page_size, len(req.page_table)
        )
        if dead <= req.num_dead_pages:
            return 0
        pages = req.page_table[req.num_dead_pages : dead]
        self.pages_freed += sum(allocator.ref_count(p) == 1 for p in pages)
        allocator.free(pages)
        self.pages_released += len(pages)
        req.window_pages_released += len(pages)
        req.num_dead_pages = dead
        return len(pages)

    def stats(self) -> WindowStats:
        """``sliding_window``, pages released, freed, and left to the radix cache."""
        return WindowStats(
            sliding_window=self.window,
            window_pages_released=self.pages_released,
            window_pages_freed=self.pages_freed,
            window_pages_cached=self.pages_released - self.pages_freed,
        )
