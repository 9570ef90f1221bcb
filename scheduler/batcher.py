"""Continuous batching: which requests run in the next step, and with how many tokens.

Each step the ``Batcher`` builds one ``StepPlan``: first one decode token for every running
request that is decoding, then prefill chunks for running requests still prefilling, then
newly admitted requests, until the per-step token budget is spent (Orca-style iteration-
level scheduling, Yu et al. OSDI 2022; chunked prefill as in Sarathi-Serve, Agrawal et al.
2024). When a decode needs a page and none is free, the newest running request is
preempted: its pages are freed and it is recomputed later from its prompt plus the tokens
it already produced, so its output does not change.

Planning looks through the steps in flight (overlap scheduler, ``scheduler.overlap``): a
request's next work starts at ``plan_computed``, and a token sampled by a step in flight
is sent as a placeholder the runner resolves.
"""

from __future__ import annotations

import itertools
from collections import deque

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.cache_tiers.radix_tree import Node, RadixTree
from houchu.options.batching import BatchingOptions
from houchu.scheduler.request import Request, Status
from houchu.scheduler.tiers import TierClient
from houchu.spec.scheduling import add_drafts
from houchu.transport.messages import PageCopy, SeqInit, SeqWork, StepPlan

#: The token id sent in place of a token the scheduler has not seen yet.
PLACEHOLDER_TOKEN = -1


class Batcher:
    """The waiting queue, the running set and the plan of the next step.

    Args:
        allocator: the device page allocator (shared with nobody else).
        config: batching limits (``--max-batch-tokens``, ``--chunked-prefill-size``,
            ``--max-running-requests``, ``--max-queued-tokens``).
    """

    def __init__(
        self,
        allocator: PageAllocator,
        config: BatchingOptions,
        tree: RadixTree | None = None,
        tiers: TierClient | None = None,
    ) -> None:
        self.allocator = allocator
        self.config = config
        self.tree = tree
        self.tiers = tiers
        if tiers is not None and tree is not None:
            tree.on_evict = self._on_evict
            if tiers.write_through:
                tree.on_insert = self._on_insert
        self.waiting: deque[Request] = deque()
        self.running: dict[str, Request] = {}  # insertion order = admission order
        self.pending_release: list[str] = []
        self.num_preemptions = 0
        self._step_ids = itertools.count()

    # ------------------------------------------------------------------ queue changes

    def add(self, req: Request) -> None:
        """Queue a new request (FIFO)."""
        self.waiting.append(req)

    def get(self, rid: str) -> Request | None:
        if rid in self.running:
            return self.running[rid]
        return next((r for r in self.waiting if r.rid == rid), None)

    def remove(self, req: Request) -> None:
        """Take a request out (finished, aborted or failed): free its pages and drop the
        runner's state for it in the next plan."""
        if req.status is Status.RUNNING:
            self.running.pop(req.rid, None)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._drop_pages(req)
        if self.tiers is not None:
            self.tiers.forget(req.rid)
        req.status = Status.FINISHED
        if req.is_registered:
            self.pending_release.append(req.rid)
            req.is_registered = False

    @property
    def has_work(self) -> bool:
        return bool(self.running or self.waiting or self.pending_release)

    # ------------------------------------------------------------------ planning

    def schedule(self) -> tuple[StepPlan | None, list[Request]]:
        """Build the next step's plan.

        Returns:
            (plan, scheduled requests in plan order); plan is None when there is nothing
            to run or release.
        """
        budget = self.config.max_batch_tokens
        work: list[SeqWork] = []
        scheduled: list[Request] = []
        init: list[SeqInit] = []

        for req in list(self.running.values()):
            if req.status is not Status.RUNNING or req.plan_prefilling or req.ends_when_applied:
                continue
            if not self._reserve(req, req.plan_computed + 1, preempt=True):
                continue  # req itself was preempted
            work.append(self._work(req, 1))
            scheduled.append(req)
            budget -= 1
        budget = add_drafts(work, scheduled, self.allocator, budget)  # speculative decoding

        for req in list(self.running.values()):
            if budget <= 0:
                break
            if req.plan_prefilling and req not in scheduled:
                n = self._chunk(req, budget)
                if not self._reserve(req, req.plan_computed + n, preempt=False):
                    break
                work.append(self._work(req, n))
                scheduled.append(req)
                budget -= n

        loads: list[PageCopy] = []
        for req in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if self.tiers is not None and self.tiers.is_pending(req.rid):
                continue  # its lower-tier lookup is in flight; others may go first
            if req.is_in_flight:
                continue  # preempted while in a step in flight: its tokens are not all known
            self._match_prefix(req)
            if self._start_lookup(req):
                continue
            n, num_loaded = self._plan_prefix(req, budget)
            if not self._reserve(req, req.plan_computed + n, preempt=False):
                self._drop_pages(req)  # give the matched prefix back; retry next step
                break
            loads += self._take_loads(req, num_loaded)
            self.waiting.remove(req)
            req.status = Status.RUNNING
            self.running[req.rid] = req
            if not req.is_registered:
                init.append(SeqInit(rid=req.rid, sampling=req.sampling, prompt_ids=req.prompt_ids))
                req.is_registered = True
            work.append(self._work(req, n))
            scheduled.append(req)
            budget -= n

        release, self.pending_release = self.pending_release, []
        has_saves = self.tiers is not None and bool(self.tiers.saves)
        if not work and not release and not has_saves:
            return None, []
        plan = StepPlan(step_id=next(self._step_ids), work=work, init=init, release=release)
        if self.tiers is not None:
            plan.kv_saves, plan.kv_loads = self.tiers.plan_copies(plan.step_id, loads)
        return plan, scheduled

    def _chunk(self, req: Request, budget: int) -> int:
        n = req.plan_tokens - req.plan_computed
        if self.config.chunked_prefill_size > 0:
            n = min(n, self.config.chunked_prefill_size, budget)
        return n

    def _work(self, req: Request, n: int) -> SeqWork:
        start = req.plan_computed
        placeholder = start >= req.num_tokens  # the token a step in flight samples
        if placeholder and n != 1:
            raise RuntimeError(f"request {req.rid!r}: {n} tokens planned after a pending one")
        ids = [PLACEHOLDER_TOKEN] if placeholder else req.all_ids()[start : start + n]
        sample = start + n == req.plan_tokens
        req.num_scheduled = n
        return SeqWork(
            rid=req.rid,
            token_ids=ids,
            start_pos=start,
            page_table=list(req.page_table),
            sample=sample,
            use_last_sampled=placeholder,
        )

    def _reserve(self, req: Request, num_tokens: int, *, preempt: bool) -> bool:
        """Make ``req``'s page table cover ``num_tokens`` positions.

        With ``preempt``, free pages by preempting the newest running requests (possibly
        ``req`` itself). Returns False when ``req`` could not get its pages.
        """
        need = self.allocator.pages_for(num_tokens) - len(req.page_table)
        if need <= 0:
            return True
        if not self.allocator.can_allocate(need) and self.tree is not None:
            self.tree.evict(need - self.allocator.num_free)
        while not self.allocator.can_allocate(need):
            if not preempt:
                return False
            victim = next(reversed(self.running.values()))
            self.preempt(victim)
            if victim is req:
                return False
        req.page_table.extend(self.allocator.allocate(need))
        return True

    def preempt(self, req: Request) -> None:
        """Free ``req``'s pages and queue it first, to be recomputed (its runner state —
        sampling generator and penalty counts — is kept)."""
        self.running.pop(req.rid, None)
        self._drop_pages(req)
        req.status = Status.WAITING
        req.is_tier_checked = False  # its pages may have been written back: look again
        req.num_preemptions += 1
        self.num_preemptions += 1
        self.waiting.appendleft(req)

    # ------------------------------------------------------------------ prefix cache

    def _match_prefix(self, req: Request) -> None:
        """Start a request that holds no pages from its longest cached prefix (at most
        all tokens but one: the last one must be computed to sample from)."""
        if self.tree is None or req.page_table:
            return
        pages, node = self.tree.match(req.all_ids(), req.num_tokens - 1)
        self.allocator.share(pages)
        req.page_table = pages
        req.num_computed = req.num_tree_pages = len(pages)
        req.num_computed *= self.allocator.page_size
        req.tree_node = node
        if req.num_preemptions == 0:
            req.cached_tokens = req.num_computed

    def index_computed(self, req: Request) -> None:
        """Put ``req``'s newly completed full pages into the radix tree, so that other
        requests (and this one, if it is preempted) can reuse them."""
        if self.tree is None:
            return
        num_full = req.num_computed // self.allocator.page_size
        if num_full <= req.num_tree_pages:
            return
        full = req.page_table[:num_full]
        node = req.tree_node or self.tree.root
        req.tree_node = self.tree.insert(req.all_ids(), full, req.num_tree_pages, node)
        req.page_table[:num_full] = full
        req.num_tree_pages = num_full

    # ------------------------------------------------------------------ lower tiers

    def _start_lookup(self, req: Request) -> bool:
        """Ask the tier manager for the full pages after the device hit, once per
        admission. True when a lookup was started (the request waits for its answer)."""
        if self.tiers is None or req.is_tier_checked:
            return False
        first = len(req.page_table)
        last = (req.num_tokens - 1) // self.allocator.page_size
        if last <= first:
            return False
        req.is_tier_checked = True
        self.tiers.start_lookup(req.rid, req.all_ids(), first, last)
        self._drop_pages(req)
        return True

    def _plan_prefix(self, req: Request, budget: int) -> tuple[int, int]:
        """(tokens to compute this step, pages to load from a lower tier). Sets
        ``num_computed`` past the pages to load; ``_drop_pages`` undoes it."""
        num_loaded = 0
        if self.tiers is not None:
            num_loaded = self.tiers.num_usable(req.rid, len(req.page_table))
            req.num_computed += num_loaded * self.allocator.page_size
        return self._chunk(req, budget), num_loaded

    def _take_loads(self, req: Request, num_loaded: int) -> list[PageCopy]:
        """Commit the lower-tier hit: copies into the request's freshly reserved pages."""
        if self.tiers is None:
            return []
        first = req.num_computed // self.allocator.page_size - num_loaded  # device-hit pages
        slots, tiers = self.tiers.take(req.rid, first)
        for t in tiers:
            self.tiers.pages_loaded[t] += 1
            req.tier_pages[t] = req.tier_pages.get(t, 0) + 1
        if req.num_preemptions == 0:
            req.cached_tokens = req.num_computed
        return [PageCopy(req.page_table[first + i], s) for i, s in enumerate(slots)]

    def _on_evict(self, node: Node) -> None:
        """Write-back: a cached page leaves the device; copy it to the host tier."""
        if not node.is_saved:
            self.tiers.save(node.page, node.hash)
            node.is_saved = True

    def _on_insert(self, node: Node) -> None:
        """Write-through: every newly cached page is copied to the host tier."""
        node.is_saved = self.tiers.save(node.page, node.hash)

    def _drop_pages(self, req: Request) -> None:
        if req.page_table:
            self.allocator.free(req.page_table)
        req.page_table = []
        req.num_computed = req.num_tree_pages = 0
        req.tree_node = None
