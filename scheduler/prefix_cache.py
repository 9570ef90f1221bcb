"""The radix prefix cache as the batcher uses it, on or off.

``PrefixCache`` wraps the ``kvcache.radix_tree.RadixTree`` of the device pool with
what a request needs of it: start from its longest cached prefix, index its pages as
they are computed, evict to make room. ``NoPrefixCache`` (``--disable-radix-cache``)
does none of it, so the batcher never checks which it holds.
"""

from __future__ import annotations

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.cache_tiers.radix_tree import RadixTree
from houchu.scheduler.no_tiers import Tiers
from houchu.scheduler.request import Request
from houchu.transport.stats import PrefixStats


class PrefixCache:
    """The radix tree over one device pool.

    Args:
        allocator: the pool's allocator.
        tiers: the KV tiers, which copy the tree's pages to the host and hash them with
            their fingerprint (``NoTiers``: no fingerprint, no copies).
        window: the model's sliding window when every layer has one (0: none); the
            tree may then free cached pages behind every window (``RadixTree``).
    """

    def __init__(self, allocator: PageAllocator, tiers: Tiers, window: int = 0) -> None:
        self.allocator = allocator
        self.window = window
        self.tree = RadixTree(allocator, tiers.fingerprint, window)
        tiers.watch(self.tree)

    def match(self, req: Request) -> None:
        """Start a request that holds no pages from its longest cached prefix (at most
        all tokens but one: the last one must be computed to sample from)."""
        if req.page_table:
            return
        pages, node = self.tree.match(req.all_ids(), req.num_tokens - 1)
        # pages before the window (HOLLOW) are never read: placeholders, no reference
        dead = self.tree.window_start(len(pages))
        self.allocator.share(pages[dead:])
        req.page_table = [0] * dead + pages[dead:]
        req.num_dead_pages = dead
        req.num_computed = req.num_tree_pages = len(pages)
        req.num_computed *= self.allocator.page_size
        req.tree_node = node
        if req.num_preemptions == 0:
            req.cached_tokens = req.num_computed

    def index(self, req: Request) -> None:
        """Put ``req``'s newly completed full pages into the tree, so that other requests
        (and this one, if it is preempted) can reuse them."""
        num_full = req.num_computed // self.allocator.page_size
        if num_full <= req.num_tree_pages:
            return
        full = req.page_table[:num_full]
        node = req.tree_node or self.tree.root
        req.tree_node = self.tree.insert(req.all_ids(), full, req.num_tree_pages, node)
        req.page_table[:num_full] = full
        req.num_tree_pages = num_full

    def evict(self, num_pages: int) -> None:
        """Free up to ``num_pages`` cached pages no request uses, least recently used
        first."""
        self.tree.evict(num_pages)

    def forget_saved(self) -> None:
        """The host tier lost its copies: every cached page may be written back again."""
        self.tree.forget_saved()

    def renew(self, allocator: PageAllocator, tiers: Tiers) -> PrefixCache:
        """An empty cache over a new pool (the runner was replaced)."""
        return PrefixCache(allocator, tiers, self.window)

    def stats(self) -> PrefixStats:
        """Pages cached and evicted since start; ``radix_cache``: 1."""
        return PrefixStats(
            num_pages_cached=self.tree.num_pages,
            num_pages_evicted=self.tree.num_evicted,
            num_pages_hollowed=self.tree.num_hollowed,
            radix_cache=1,
        )


class NoPrefixCache:
    """The radix cache off: every request computes its whole prompt."""

    tree = None  # no radix tree to inspect

    def match(self, req: Request) -> None:
        """Nothing is cached: the request starts from position 0."""

    def index(self, req: Request) -> None:
        """Nothing is indexed."""

    def evict(self, num_pages: int) -> None:
        """Nothing to evict."""

    def forget_saved(self) -> None:
        """Nothing was saved."""

    def renew(self, allocator: PageAllocator, tiers: Tiers) -> NoPrefixCache:
        """Still off: itself."""
        return self

    def stats(self) -> PrefixStats:
        """No pages cached or evicted; ``radix_cache``: 0."""
        return PrefixStats(num_pages_cached=0, num_pages_evicted=0, radix_cache=0)


def prefix_cache(
    on: bool, allocator: PageAllocator, tiers: Tiers, window: int = 0
) -> PrefixCache | NoPrefixCache:
    """The prefix cache over ``allocator``'s pool: a radix tree when ``on`` (``window``:
    the model's sliding window when every layer has one, else 0)."""
    return PrefixCache(allocator, tiers, window) if on else NoPrefixCache()
