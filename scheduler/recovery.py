"""The scheduler core's recovery from a peer's restart (``houchu.actors.supervisor``).

- model runner replaced: ``fail_all`` (every request fails; steps in flight are lost),
  then ``reset_pool`` with the new runner's ``RunnerInfo`` (its KV pool is empty, so the
  page allocator and the radix tree start over; counters, the lower-tier client and the
  speculation controller are kept);
- tokenizer replaced: ``abort_all`` (nobody can receive their text any more);
- KV-tier manager replaced: ``reset_tiers`` (grants, pins and pending lookups are void).

``SchedulerCore`` inherits these methods; they use its batcher, allocator, tree and tiers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.cache_tiers.radix_tree import RadixTree
from houchu.scheduler.batcher import Batcher
from houchu.transport.messages import Failure, RunnerInfo, TokenEvent

if TYPE_CHECKING:
    from houchu.scheduler.core import SchedulerCore


class Recovery:
    """Mixin of ``SchedulerCore``: what to do when a peer actor was replaced."""

    def is_in_flight(self: SchedulerCore, step_id: int) -> bool:
        """Whether ``step_id`` was planned and its result has not been applied (a result
        for any other step id is stale: it comes from a runner that was replaced)."""
        return step_id in self._in_flight

    def fail_all(self: SchedulerCore, failure: Failure) -> list[TokenEvent]:
        """Fail every request, running or waiting, with ``failure``; forget the steps in
        flight (their host-slot copies are returned unused). Returns the error events to
        send."""
        for step_id in list(self._in_flight):
            del self._in_flight[step_id]
            self._sent_at.pop(step_id, None)
            if self.tiers is not None:
                self.tiers.on_step_done(step_id, False)
        requests = [*self.batcher.running.values(), *self.batcher.waiting]
        return self._fail(requests, failure)

    def abort_all(self: SchedulerCore) -> int:
        """Abort every request (their pages return to the pool); returns how many."""
        rids = [*self.batcher.running, *(r.rid for r in self.batcher.waiting)]
        return sum(self.abort(rid) for rid in rids)

    def reset_pool(self: SchedulerCore, runner: RunnerInfo) -> None:
        """Start over on a new runner's empty KV pool: a fresh page allocator, radix tree
        and batcher (call ``fail_all`` first). Step ids keep counting up.

        Raises:
            RuntimeError: requests are still queued or running.
        """
        old = self.batcher
        if old.running or old.waiting:
            raise RuntimeError("reset_pool with requests still queued or running")
        self.runner = runner
        self.allocator = PageAllocator(runner.num_pages, runner.page_size)
        if self.tree is not None:
            fingerprint = self.tiers.fingerprint if self.tiers is not None else None
            self.tree = RadixTree(self.allocator, fingerprint)
        if self.tiers is not None:
            self.tiers.drop_saves()  # the device pages they would copy are gone
        self.batcher = Batcher(self.allocator, old.config, self.tree, self.tiers)
        self.batcher.num_preemptions = old.num_preemptions
        self.batcher._step_ids = old._step_ids  # noqa: SLF001 (unique step ids per scheduler)

    def reset_tiers(self: SchedulerCore) -> None:
        """The KV-tier manager was replaced: drop grants, pins and pending lookups (they
        become misses); every cached page may be written back again."""
        if self.tiers is None:
            return
        self.tiers.reset()
        if self.tree is not None:
            self.tree.forget_saved()
