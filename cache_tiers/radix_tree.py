"""The radix prefix index: page-aligned token prefixes -> the KV pages that hold them.

Each edge of the tree is exactly one page of token ids (``page_size`` of them), so a node
at depth ``d`` stands for the prefix of ``d`` full pages and owns the KV page of its last
``page_size`` tokens. This is the page-granular radix tree of SGLang's RadixAttention
(Zheng et al., "SGLang: Efficient Execution of Structured Language Model Programs", 2024)
— with one page per edge, path compression buys nothing, since pages are the unit of
sharing anyway.

Ownership: the tree holds one allocator reference on every page it indexes; every
request holds one reference on every page of its page table. A page is therefore
*locked* while its reference count exceeds one, and only unlocked leaves are evicted,
least recently used first.

Regions of a request's tokens as seen by the tree::

    | matched (shared pages) | computed, full pages (inserted as they complete) | rest |
      0 .. m*ps-1              m*ps .. (num_computed // ps)*ps - 1                 partial
                                                                                   page,
                                                                                   never
                                                                                   indexed

Sliding windows (``window``: every layer of the model attends only the last ``window``
positions): a request resuming after ``m`` matched pages reads only the pages of its
window, so a cached page behind every window may lose its KV while the nodes after it
keep theirs. Such a node is *hollow* (its page freed, ``HOLLOW``); it stays in the tree
as the path to its children. Under memory pressure ``evict`` hollows unlocked interior
nodes too (a running request's pages behind its window, for one: it holds no reference
to them any more), least recently used and shallowest first; ``match`` then returns the
deepest prefix whose window holds no hollow page, with ``HOLLOW`` in place of every page
before that window (the caller takes no reference on them), and ``insert`` fills a
hollow node again. A tree without a window never hollows anything (SGLang's SWA radix
cache keeps such tombstones too).
"""

from __future__ import annotations

import heapq
import itertools
from collections.abc import Callable

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.cache_tiers.page_hash import page_hash

PageKey = tuple[int, ...]
#: The page of a hollow node (and of the entries before a window in ``match``'s pages).
HOLLOW = -1


class Node:
    """One cached page: ``key`` (page_size token ids) under ``parent``, stored in ``page``."""

    __slots__ = ("key", "page", "parent", "children", "last_access", "hash", "is_saved", "depth")

    def __init__(self, key: PageKey, page: int, parent: Node | None, h: bytes = b"") -> None:
        self.key = key
        self.page = page  # HOLLOW: its KV was freed (a page behind every window)
        self.parent = parent
        self.depth: int = parent.depth + 1 if parent is not None else 0
        self.children: dict[PageKey, Node] = {}
        self.last_access = 0
        self.hash = h  # chained page hash (page_hash.py), when the tree has a fingerprint
        self.is_saved = False  # a copy was written to the host tier

    @property
    def is_leaf(self) -> bool:
        return not self.children


class RadixTree:
    """Prefix index over the device KV pool.

    Args:
        allocator: the pool's allocator; the tree takes and drops references through it.
        fingerprint: model + KV layout fingerprint; when given, every node carries the
            chained hash of its page (the KV tiers' key).
        window: tokens every layer of the model attends, the query's own included (0:
            some layer reads everything; no node is ever hollowed).
    """

    def __init__(
        self, allocator: PageAllocator, fingerprint: bytes | None = None, window: int = 0
    ) -> None:
        self.allocator = allocator
        self.window = window
        self.page_size = allocator.page_size
        self.fingerprint = fingerprint
        self.root = Node((), -1, None, fingerprint or b"")
        #: called with each node about to be evicted (its page is still intact then)
        self.on_evict: Callable[[Node], None] | None = None
        #: called with each newly indexed node
        self.on_insert: Callable[[Node], None] | None = None
        self.num_pages = 0  # pages indexed by the tree
        self.num_evicted = 0
        self.num_hollowed = 0  # pages freed from interior nodes (behind every window)
        self._clock = itertools.count(1)

    def _keys(self, tokens: list[int], num_pages: int) -> list[PageKey]:
        ps = self.page_size
        return [tuple(tokens[i * ps : (i + 1) * ps]) for i in range(num_pages)]

    def window_start(self, num_pages: int) -> int:
        """The first page a request resuming after ``num_pages`` pages reads (0 without
        a window): its next position attends back to ``num_pages * page_size - window + 1``."""
        if not self.window:
            return 0
        return max(0, num_pages * self.page_size - self.window + 1) // self.page_size

    def match(self, tokens: list[int], max_tokens: int) -> tuple[list[int], Node]:
        """The longest cached page-aligned prefix of ``tokens`` no longer than ``max_tokens``
        whose window holds no hollow page.

        Returns (its pages in order, ``HOLLOW`` for those before its window; the node of
        its last page — the root when nothing matched). Marks the path as used now. The
        caller must ``allocator.share`` the pages (not the ``HOLLOW`` ones) before
        anything else can evict them.
        """
        node, path, now = self.root, [], next(self._clock)
        for key in self._keys(tokens, max_tokens // self.page_size):
            child = node.children.get(key)
            if child is None:
                break
            path.append(child)
            node = child
        m = len(path)
        while m and any(n.page == HOLLOW for n in path[self.window_start(m) : m]):
            m -= 1
        for n in path[:m]:
            n.last_access = now
        lo = self.window_start(m)
        pages = [HOLLOW] * lo + [n.page for n in path[lo:m]]
        return pages, path[m - 1] if m else self.root

    def insert(self, tokens: list[int], pages: list[int], start_page: int, node: Node) -> Node:
        """Index the full pages ``start_page ..`` of a sequence whose pages ``0 ..
        start_page - 1`` are already the path ending at ``node``.

        ``tokens`` covers at least ``len(pages) * page_size`` positions. Where the tree
        already holds another page for the same prefix (a concurrent request computed it
        too), that page replaces the caller's in ``pages`` (in place): the caller's page
        is freed once and the tree's is shared, since both hold identical KV.

        Returns the node of the last indexed page (pass it back on the next call).
        """
        now = next(self._clock)
        keys = self._keys(tokens, len(pages))
        for i in range(start_page, len(pages)):
            child = node.children.get(keys[i])
            if child is None:
                h = page_hash(node.hash, keys[i]) if self.fingerprint is not None else b""
                child = Node(keys[i], pages[i], node, h)
                node.children[keys[i]] = child
                self.allocator.share([pages[i]])  # the tree's own reference
                self.num_pages += 1
                if self.on_insert is not None:
                    self.on_insert(child)
            elif child.page == HOLLOW:  # its KV again, from this sequence
                child.page = pages[i]
                self.allocator.share([pages[i]])
                self.num_pages += 1
                if self.on_insert is not None:
                    self.on_insert(child)
            elif child.page != pages[i]:
                self.allocator.share([child.page])
                self.allocator.free([pages[i]])
                pages[i] = child.page
            child.last_access = now
            node = child
        return node

    def evict(self, num_pages: int) -> int:
        """Free up to ``num_pages`` pages: unlocked leaves (a parent becomes a leaf once
        its children are gone) and, with a window, unlocked interior nodes (hollowed),
        least recently used first, then shallowest. Returns pages freed."""
        nodes = self._all() if self.window else self._leaves()
        heap = [self._entry(n) for n in nodes if self._unlocked(n)]
        heapq.heapify(heap)
        freed = 0
        while heap and freed < num_pages:
            _, _, _, node = heapq.heappop(heap)
            assert node.parent is not None  # the root is never queued
            if node.page == HOLLOW or node.parent.children.get(node.key) is not node:
                continue  # hollowed or removed since it was queued
            if self.on_evict is not None:
                self.on_evict(node)
            self.allocator.free([node.page])
            self.num_pages -= 1
            freed += 1
            if not node.is_leaf:
                node.page = HOLLOW
                self.num_hollowed += 1
                continue
            self.num_evicted += 1
            parent = self._remove(node)
            if parent is not self.root and parent.is_leaf and self._unlocked(parent):
                heapq.heappush(heap, self._entry(parent))
        return freed

    def _remove(self, node: Node) -> Node:
        """Take the leaf ``node`` out, and the hollow ancestors it leaves childless;
        returns the first ancestor kept."""
        parent = node.parent
        assert parent is not None  # the root is never removed
        del parent.children[node.key]
        node.page = HOLLOW
        while parent is not self.root and parent.is_leaf and parent.page == HOLLOW:
            node, parent = parent, parent.parent
            assert parent is not None  # node is below the root
            del parent.children[node.key]
        return parent

    @staticmethod
    def _entry(n: Node) -> tuple[int, int, int, Node]:
        return (n.last_access, n.depth, id(n), n)

    def _unlocked(self, node: Node) -> bool:
        return node.page != HOLLOW and self.allocator.ref_count(node.page) == 1

    def _all(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            out.append(node)
            stack.extend(node.children.values())
        return out

    def _leaves(self) -> list[Node]:
        out, stack = [], list(self.root.children.values())
        while stack:
            node = stack.pop()
            if node.is_leaf:
                out.append(node)
            else:
                stack.extend(node.children.values())
        return out

    def forget_saved(self) -> None:
        """The host tier lost its copies (its manager was replaced): any cached page may
        be written back again when it is evicted."""
        stack = list(self.root.children.values())
        while stack:
            node = stack.pop()
            node.is_saved = False
            stack.extend(node.children.values())

    def pages(self) -> list[int]:
        """Every page the tree indexes, hollow nodes left out (for invariant checks)."""
        return [n.page for n in self._all() if n.page != HOLLOW]
