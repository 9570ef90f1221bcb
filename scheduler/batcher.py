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
from houchu.options.batching_options import BatchingOptions
from houchu.scheduler.groups import PrefillGroups
from houchu.scheduler.no_tiers import Tiers
from houchu.scheduler.prefix_cache import NoPrefixCache, PrefixCache
from houchu.scheduler.request import Request, Status
from houchu.scheduler.window_pages import WindowPages
from houchu.speculative.scheduling import add_drafts, free_pages_past
from houchu.transport.messages import PageCopy, Phase, SeqInit, SeqWork, StepPlan

#: The token id sent in place of a token the scheduler has not seen yet.
PLACEHOLDER_TOKEN = -1


class Batcher:
    """The waiting queue, the running set and the plan of the next step.

    Args:
        allocator: the device page allocator (shared with nobody else).
        config: batching limits (``--max-batch-tokens``, ``--chunked-prefill-size``,
            ``--max-running-requests``, ``--max-queued-tokens``).
        prefix: the radix prefix cache over the allocator's pool (or ``NoPrefixCache``).
        tiers: the KV tiers' client (or ``NoTiers``).
        window: releases pages outside every sliding window (None: the model has none).
    """

    def __init__(
        self,
        allocator: PageAllocator,
        config: BatchingOptions,
        prefix: PrefixCache | NoPrefixCache,
        tiers: Tiers,
        window: WindowPages | None = None,
    ) -> None:
        self.allocator = allocator
        self.window = window or WindowPages(0, allocator.page_size)
        self.config = config
        self.prefix = prefix
        self.tiers = tiers
        self.groups = PrefillGroups(prefix.tree is not None, allocator.page_size)
        self.waiting: deque[Request] = deque()
        self.running: dict[str, Request] = {}  # insertion order = admission order
        self.pending_release: list[str] = []
        self.num_preemptions = 0
        self._preempted: list[Request] = []  # since the last take_preempted()
        self._step_ids = itertools.count()

    def restart(self, allocator: PageAllocator, prefix: PrefixCache | NoPrefixCache) -> None:
        """Start over on a new, empty device pool (the runner was replaced). Step ids
        keep counting up and preemptions keep adding up; releases for the old runner
        are dropped.

        Raises:
            RuntimeError: requests are still queued or running.
        """
        if self.running or self.waiting:
            raise RuntimeError("restart with requests still queued or running")
        self.allocator, self.prefix = allocator, prefix
        self.groups = PrefillGroups(prefix.tree is not None, allocator.page_size)
        self.pending_release = []

    # ------------------------------------------------------------------ queue changes

    def add(self, req: Request) -> None:
        """Queue a new request (FIFO)."""
        self.waiting.append(req)
        self.groups.add(req)

    def get(self, rid: str) -> Request | None:
        """The queued or running request ``rid`` (None: unknown, or it left)."""
        if rid in self.running:
            return self.running[rid]
        return next((r for r in self.waiting if r.rid == rid), None)

    def knows(self, rid: str) -> bool:
        """Whether ``rid`` is queued or running."""
        return rid in self.running or any(r.rid == rid for r in self.waiting)

    def remove(self, req: Request) -> None:
        """Take a request out (finished, aborted or failed): free its pages and drop the
        runner's state for it in the next plan."""
        if req.status is Status.RUNNING:
            self.running.pop(req.rid, None)
        elif req in self.waiting:
            self.waiting.remove(req)
        self._drop_pages(req)
        self.tiers.forget(req.rid)
        self.groups.remove(req)
        req.status = Status.FINISHED
        if req.is_registered:
            self.pending_release.append(req.rid)
            req.unregister()

    @property
    def has_work(self) -> bool:
        """Requests are queued or running, or releases wait for the next plan."""
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
                if n <= 0:
                    continue  # a group's first choice: its shared pages are in flight
                if not self._reserve(req, req.plan_computed + n, preempt=False):
                    break
                work.append(self._work(req, n))
                scheduled.append(req)
                budget -= n

        loads: list[PageCopy] = []
        for req in list(self.waiting):
            if budget <= 0 or len(self.running) >= self.config.max_running_requests:
                break
            if self.tiers.is_pending(req.rid):
                continue  # its lower-tier lookup is in flight; others may go first
            if req.is_in_flight:
                continue  # preempted while in a step in flight: its tokens are not all known
            if self.groups.is_held(req):
                continue  # another choice of its request prefills the shared prompt
            if req.sampling.prompt_logprobs is None:  # else its whole prompt is computed
                self.prefix.match(req)
                if self.tiers.begin_lookup(req):
                    self._drop_pages(req)  # matched again once the answer is in
                    continue
            n, num_loaded = self._plan_prefix(req, budget)
            if not self._reserve(req, req.plan_computed + n, preempt=False):
                self._drop_pages(req)  # give the matched prefix back; retry next step
                break
            loads += self._take_loads(req, num_loaded)
            if not req.is_registered:
                self.groups.on_admitted(req)
            self.waiting.remove(req)
            req.status = Status.RUNNING
            self.running[req.rid] = req
            if not req.is_registered:
                init.append(
                    SeqInit(
                        rid=req.rid,
                        sampling=req.sampling,
                        prompt_ids=req.prompt_ids,
                        stop_ids=sorted(req.stop_ids),
                    )
                )
                req.is_registered = True
            work.append(self._work(req, n))
            scheduled.append(req)
            budget -= n

        release, self.pending_release = self.pending_release, []
        if not work and not release and not self.tiers.has_saves:
            return None, []
        plan = StepPlan(step_id=next(self._step_ids), work=work, init=init, release=release)
        plan.kv_saves, plan.kv_loads = self.tiers.plan_copies(plan.step_id, loads)
        return plan, scheduled

    def _chunk(self, req: Request, budget: int) -> int:
        """Prefill tokens to plan for ``req`` now (0: none until a step in flight is
        applied; ``PrefillGroups.prefill_stop``)."""
        n = req.plan_tokens - req.plan_computed
        if self.config.chunked_prefill_size > 0:
            n = min(n, self.config.chunked_prefill_size, budget)
        stop = self.groups.prefill_stop(req)
        if stop is not None:
            n = min(n, stop - req.plan_computed)
        return n

    def _work(self, req: Request, n: int) -> SeqWork:
        start = req.plan_computed
        placeholder = start >= req.num_tokens  # the token a step in flight samples
        if placeholder and n != 1:
            raise RuntimeError(f"request {req.rid!r}: {n} tokens planned after a pending one")
        ids = [PLACEHOLDER_TOKEN] if placeholder else req.all_ids()[start : start + n]
        sample = start + n == req.plan_tokens
        # one new token at or past the prompt is decode; prompt chunks and recomputation
        # (after a preemption, or of jump-forward's forced tokens) are prefill
        decode = n == 1 and start >= req.num_prompt
        return SeqWork(
            rid=req.rid,
            token_ids=ids,
            start_pos=start,
            sample=sample,  # its pages: Request.give_pages, once the plan is built
            use_last_sampled=placeholder,
            phase=Phase.DECODE if decode else Phase.PREFILL,
        )

    def _reserve(self, req: Request, num_tokens: int, *, preempt: bool) -> bool:
        """Make ``req``'s page table cover ``num_tokens`` positions.

        With ``preempt``, free pages by preempting the newest running requests (possibly
        ``req`` itself). Returns False when ``req`` could not get its pages.
        """
        need = self.allocator.pages_for(num_tokens) - len(req.page_table)
        if need <= 0:
            return True
        if not self.allocator.can_allocate(need):
            self.prefix.evict(need - self.allocator.num_free)
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
        self._preempted.append(req)
        self.waiting.appendleft(req)

    def take_preempted(self) -> list[Request]:
        """The requests preempted since the last call, in order."""
        out, self._preempted = self._preempted, []
        return out

    # ------------------------------------------------------------------ after a step

    def index_computed(self, req: Request) -> None:
        """Put ``req``'s newly completed full pages into the prefix cache, so that other
        requests (and this one, if it is preempted) can reuse them; then release its pages
        outside every sliding window (``scheduler.window_pages``)."""
        self.prefix.index(req)
        self.window.release(req, self.allocator)

    def free_rejected(self, req: Request) -> None:
        """Free ``req``'s pages past its tokens: those of proposals the runner rejected."""
        free_pages_past(req, self.allocator, req.num_tokens)

    # ------------------------------------------------------------------ lower tiers

    def _plan_prefix(self, req: Request, budget: int) -> tuple[int, int]:
        """(tokens to compute this step, pages to load from a lower tier). Sets
        ``num_computed`` past the pages to load; ``_drop_pages`` undoes it."""
        num_loaded = self.tiers.num_usable(req.rid, len(req.page_table))
        req.num_computed += num_loaded * self.allocator.page_size
        return self._chunk(req, budget), num_loaded

    def _take_loads(self, req: Request, num_loaded: int) -> list[PageCopy]:
        """Commit the lower-tier hit: copies into the request's freshly reserved pages."""
        first = req.num_computed // self.allocator.page_size - num_loaded  # device-hit pages
        slots, tiers = self.tiers.take(req.rid, first)
        for t in tiers:
            req.tier_pages[t] = req.tier_pages.get(t, 0) + 1
        if req.num_preemptions == 0:
            req.cached_tokens = req.num_computed
        return [PageCopy(req.page_table[first + i], s) for i, s in enumerate(slots)]

    def _drop_pages(self, req: Request) -> None:
        if req.page_table:
            self.allocator.free(req.page_table[req.num_dead_pages :])
        req.page_table = []
        req.num_computed = req.num_tree_pages = req.num_dead_pages = 0
        req.tree_node = None
