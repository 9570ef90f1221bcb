"""The scheduler's domain logic: admit, plan, apply results, finish — no sockets.

The scheduler actor (``actors/scheduler.py``) drives it, through its methods only::

    core.add(request)              # TokenizedRequest arrived
    plan = core.next_plan()        # when no step is in flight, or (overlap) while one
                                   # is and core.can_plan_ahead()
    events = core.apply(result)    # StepResult arrived -> TokenEvents for the tokenizer
    core.abort(rid)                # client gone
    core.finish(rid)               # a stop string matched in its text

The core is a composition of small parts, each of which is a real object or a null one
when its feature is off (never None):

- ``Batcher`` (``scheduler.batcher``): the waiting queue, the running set, the next plan;
- ``PrefixCache`` / ``NoPrefixCache`` (``scheduler.prefix_cache``): the radix tree;
- ``TierClient`` / ``NoTiers`` (``scheduler.tiers``, ``scheduler.no_tiers``): the KV tiers;
- ``SpecScheduler`` / ``NoSpeculation`` (``scheduler.speculation``): speculative decoding;
- ``StepTracker`` (``scheduler.steps``): the steps in flight;
- ``Planner`` (``scheduler.planner``): the next plan, launched as a step in flight;
- ``ResultApplier`` (``scheduler.results``): what a result does to its requests;
- ``SchedulerLedger``, ``OverlapLedger``, ``SchedulerCounters``: levers and totals;
- ``admit`` (``scheduler.admission``): whether a request may join the queue;
- ``pool_stats`` (``scheduler.pool_stats``): the KV pool's part of ``stats``;
- a telemetry sink (``NullTelemetry`` when off).

Results come back in plan order. With the overlap scheduler a plan is built while one
earlier step is still in flight; what that step holds is kept per step (``Slot``s) and
as an overlay on each request (``scheduler.overlap``).

When a peer is replaced (``houchu.actors.supervisor``): the runner — ``fail_all``, then
``reset_pool`` on its new, empty pool (counters, the tiers' client and the speculation
controller are kept); the tokenizer — ``abort_all``; the KV-tier manager —
``reset_tiers``.
"""

from __future__ import annotations

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.cache_tiers.radix_tree import RadixTree
from houchu.options.batching_options import BatchingOptions
from houchu.options.speculation_options import SpeculativeOptions
from houchu.scheduler.admission import Overloaded, Rejected, admit
from houchu.scheduler.batcher import Batcher
from houchu.scheduler.counters import SchedulerCounters
from houchu.scheduler.ledger import SchedulerLedger
from houchu.scheduler.no_tiers import NoTiers, Tiers
from houchu.scheduler.overlap import OverlapLedger
from houchu.scheduler.planner import Planner
from houchu.scheduler.pool_stats import pool_stats
from houchu.scheduler.prefix_cache import prefix_cache
from houchu.scheduler.request import Request
from houchu.scheduler.results import ResultApplier
from houchu.scheduler.speculation import speculation
from houchu.scheduler.steps import StepTracker
from houchu.scheduler.telemetry_sink import NullTelemetry, TelemetrySink
from houchu.scheduler.tiers import TierClient, TierReply
from houchu.scheduler.window_pages import WindowPages
from houchu.transport.failures import unavailable
from houchu.transport.messages import (
    Failure,
    RunnerInfo,
    StepPlan,
    StepResult,
    TokenEvent,
    TokenizedRequest,
)
from houchu.transport.spec_messages import DraftReply, DraftRequest
from houchu.transport.stats import EngineStats

__all__ = ["Overloaded", "Rejected", "SchedulerCore"]


class SchedulerCore:
    """Continuous-batching scheduler over a paged KV pool with a radix prefix cache.

    Args:
        runner: the runner's pool geometry, context length and model size.
        config: batching limits and switches (``--disable-radix-cache``: no prefix reuse).
        telemetry: where lifecycle events and lever samples go (None: nowhere).
        tiers: the host / SSD KV tiers' client, or None (off; they need the radix cache).
        spec: speculative decoding settings, or None (off).
        overlap: the actor plans a step while the previous one runs (only reported in
            the stats here; ``can_plan_ahead`` says when that is allowed).

    Raises:
        ValueError: ``spec`` is invalid.
    """

    def __init__(
        self,
        runner: RunnerInfo,
        config: BatchingOptions,
        telemetry: TelemetrySink | None = None,
        tiers: TierClient | None = None,
        spec: SpeculativeOptions | None = None,
        overlap: bool = False,
    ) -> None:
        self.runner = runner
        self.telemetry: TelemetrySink = telemetry or NullTelemetry()
        radix_cache = not config.disable_radix_cache
        self.tiers: Tiers = (tiers or NoTiers()) if radix_cache else NoTiers()
        self.allocator = PageAllocator(runner.num_pages, runner.page_size)
        self.prefix = prefix_cache(radix_cache, self.allocator, self.tiers, runner.sliding_window)
        self.batcher = Batcher(
            self.allocator,
            config,
            self.prefix,
            self.tiers,
            WindowPages(runner.sliding_window, runner.page_size),
        )
        self.spec = speculation(spec, runner.max_context, config.max_running_requests)
        self.steps = StepTracker()
        self.ledger = SchedulerLedger(runner)
        self.overlap = OverlapLedger(overlap)
        self.counters = SchedulerCounters()
        self._wire()

    def _wire(self) -> None:
        """(Re)build the plan and result sides over the current parts and runner."""
        b, sp, led, ov, tel = self.batcher, self.spec, self.ledger, self.overlap, self.telemetry
        self.planner = Planner(self.runner, b, self.steps, sp, led, ov, tel)
        self.results = ResultApplier(self.runner, b, sp, led, ov, tel, self.counters)

    @property
    def tree(self) -> RadixTree | None:
        """The radix tree, for inspection (None: the radix cache is off)."""
        return self.prefix.tree

    # ------------------------------------------------------------------ inputs

    def add(self, msg: TokenizedRequest) -> None:
        """Queue a tokenized request.

        Raises:
            Rejected: prompt + max_tokens exceed the context window or the whole KV pool.
            Overloaded: the waiting queue already holds ``max_queued_tokens`` prompt tokens.
        """
        # refused or not, it is not waited for any more
        self.batcher.groups.arrived(msg.prefill_group, msg.prefill_group_size)
        req = admit(msg, self.runner, self.batcher, self.counters)
        self.counters.prompt_tokens += len(msg.prompt_ids)
        self.batcher.add(req)
        self.telemetry.event(req.rid, "queued", prompt_tokens=req.num_prompt)

    def abort(self, rid: str) -> bool:
        """Drop a request wherever it is (its client is gone); its pages return to the
        pool now (the pages already indexed by the radix tree stay cached).

        Returns False if the request is unknown (already finished)."""
        req = self._drop(rid)
        if req is None:
            return False
        self.counters.aborted += 1
        self.telemetry.event(rid, "aborted", completion_tokens=len(req.output_ids))
        return True

    def finish(self, rid: str) -> bool:
        """A stop string matched in the request's text: it is finished ("stop"); its
        pages return to the pool as for ``abort``.

        Returns False if the request is unknown (it already ended by itself)."""
        req = self._drop(rid)
        if req is None:
            return False
        self.counters.finished += 1
        self.telemetry.event(
            rid, "finished", finish_reason="stop", completion_tokens=len(req.output_ids)
        )
        return True

    def _drop(self, rid: str) -> Request | None:
        """Take ``rid`` out wherever it is; None if unknown. Results of steps in flight
        for it are discarded (``is_aborted``)."""
        req = self.batcher.get(rid)
        if req is None:
            return None
        req.is_aborted = True
        self.results.leave(req)
        return req

    def knows(self, rid: str) -> bool:
        """Whether request ``rid`` is queued or running."""
        return self.batcher.knows(rid)

    # ------------------------------------------------------------------ steps

    @property
    def has_work(self) -> bool:
        """Requests are queued or running, or releases wait for the next plan."""
        return self.batcher.has_work

    @property
    def num_in_flight(self) -> int:
        """Steps planned whose results have not been applied (2 at most)."""
        return len(self.steps)

    def is_in_flight(self, step_id: int) -> bool:
        """Whether ``step_id`` was planned and its result has not been applied (a result
        for any other step id is stale: it comes from a runner that was replaced)."""
        return step_id in self.steps

    def at_runner_s(self) -> float:
        """Seconds the oldest step in flight has been at the runner (0: none)."""
        return self.steps.at_runner_s()

    def can_plan_ahead(self) -> bool:
        """Whether the next plan may be built with one step in flight
        (``Planner.can_plan_ahead``)."""
        return self.planner.can_plan_ahead()

    def next_plan(self) -> StepPlan | None:
        """The next step's plan, or None when idle (``Planner.next_plan``).

        Raises:
            RuntimeError: two steps are in flight.
        """
        return self.planner.next_plan()

    def apply(self, result: StepResult) -> list[TokenEvent]:
        """Apply a step's result (``ResultApplier.apply``); returns the events to send
        to the tokenizer."""
        slots = self.steps.land(result)
        self.tiers.on_step_done(result.step_id, result.error is None)
        events = self.results.apply(result, slots)
        for req in self.results.jumped:  # forced tokens: the next step feeds them
            self.steps.void_samples(req)
        return events

    def record_work(self, t0: float, t1: float, overlapped: bool) -> None:
        """The actor worked on a result or a plan from ``t0`` to ``t1`` (time.time());
        ``overlapped``: a step was in flight all along (``OverlapLedger.record_work``)."""
        self.overlap.record_work(t0, t1, overlapped)

    # ------------------------------------------------------------------ KV tiers

    def on_tier_reply(self, msg: TierReply) -> None:
        """A message of the KV-tier manager: slots granted, a lookup answered, counters."""
        self.tiers.receive(msg)

    def group_wait_s(self) -> float | None:
        """Seconds until a queued choice of ``n > 1`` stops waiting for the rest of its
        request (None: none waits; ``PrefillGroups.wake_in``)."""
        return self.batcher.groups.wake_in()

    def is_looking_up(self) -> bool:
        """Lower-tier lookups are outstanding (they time out: look now and then)."""
        return self.tiers.is_looking_up

    def tier_messages(self) -> list:
        """The messages for the KV-tier manager queued since the last call."""
        return self.tiers.drain()

    # ------------------------------------------------------------------ speculation

    def draft_request(self) -> DraftRequest | None:
        """Proposals to ask the draft actor for before the next plan (None: none)."""
        return self.spec.draft_request(self.batcher.running.values())

    def attach_drafts(self, reply: DraftReply, seconds: float) -> None:
        """The draft's answer (``seconds`` after asking): proposals for the next plan."""
        self.spec.on_reply(reply, self.batcher.running.get, seconds)

    def on_draft_stats(self, reply: DraftReply) -> None:
        """A draft reply nobody waits for: keep only its pool counters."""
        self.spec.on_pool_stats(reply)

    def abandon_drafts(self) -> None:
        """The awaited proposals did not come in time: plan without them."""
        self.spec.abandon()

    def draft_release(self) -> DraftRequest | None:
        """A request releasing the draft state of requests that left (None: none)."""
        return self.spec.release_request()

    def on_draft_down(self) -> None:
        """The draft actor was replaced: resend every running request's tokens."""
        self.spec.resync(self.batcher.running.values())

    def calibration_tokens(self) -> int:
        """The longest pass calibration may time: the context or the step budget."""
        return min(self.runner.max_context, self.batcher.config.max_batch_tokens)

    def lend_pages(self, num_tokens: int) -> list[int]:
        """Free pages for ``num_tokens`` positions, for calibration passes ([]: the pool
        has not that many free); give them back with ``return_pages``."""
        need = self.allocator.pages_for(num_tokens)
        return self.allocator.allocate(need) if self.allocator.can_allocate(need) else []

    def return_pages(self, pages: list[int]) -> None:
        """Give back pages from ``lend_pages``."""
        self.allocator.free(pages)

    def seed_spec_costs(self, times: dict[int, float]) -> None:
        """Timed target passes (tokens -> seconds) for speculation's cost model."""
        self.spec.calibrate(times)

    # ------------------------------------------------------------------ recovery

    def fail_all(self, failure: Failure) -> list[TokenEvent]:
        """Fail every request, running or waiting, with ``failure``; forget the steps in
        flight (their host-slot copies are returned unused). Returns the error events to
        send."""
        for step_id in self.steps.lose_all():
            self.tiers.on_step_done(step_id, False)
        requests = [*self.batcher.running.values(), *self.batcher.waiting]
        return self.results.fail(requests, failure)

    def abort_all(self) -> int:
        """Abort every request (their pages return to the pool); returns how many."""
        rids = [*self.batcher.running, *(r.rid for r in self.batcher.waiting)]
        return sum(self.abort(rid) for rid in rids)

    def reset_pool(self, runner: RunnerInfo) -> None:
        """Start over on a new runner's empty KV pool: a fresh page allocator and radix
        tree (call ``fail_all`` first). Step ids keep counting up.

        Raises:
            RuntimeError: requests are still queued or running.
        """
        allocator = PageAllocator(runner.num_pages, runner.page_size)
        prefix = self.prefix.renew(allocator, self.tiers)
        self.batcher.restart(allocator, prefix)
        self.batcher.window.window = runner.sliding_window  # the counters keep adding up
        self.batcher.window.page_size = runner.page_size
        self.runner, self.allocator, self.prefix = runner, allocator, prefix
        self.tiers.drop_saves()  # the device pages they would copy are gone
        self._wire()

    def restart_pool(self) -> None:
        """The runner died: start over on an empty pool of the same geometry until its
        replacement's ``RunnerInfo`` comes (``on_runner_info``)."""
        self.reset_pool(self.runner)

    def on_runner_info(self, runner: RunnerInfo) -> list[TokenEvent]:
        """A replacement runner is ready. With a pool of the geometry planned for (the
        same pages, page size, context and window; its threads and measured decode
        paths may differ), the requests queued meanwhile keep their place; with another,
        they fail (503, retry) and planning starts over on its pool (``reset_pool``).
        Returns the error events to send."""
        if _pool_geometry(runner) == _pool_geometry(self.runner):
            self.runner = runner
            return []
        events = self.fail_all(
            unavailable("the model runner restarted with another KV pool; retry")
        )
        self.reset_pool(runner)
        return events

    def reset_tiers(self) -> None:
        """The KV-tier manager was replaced: drop grants, pins and pending lookups (they
        become misses); every cached page may be written back again."""
        self.tiers.reset()
        self.prefix.forget_saved()

    # ------------------------------------------------------------------ stats

    def engine_stats(self) -> EngineStats:
        """Counters for the stats endpoint, one typed part each (pages are KV pages of
        ``page_size`` tokens; ``houchu.transport.stats``)."""
        return EngineStats(
            pool=pool_stats(self.runner, self.batcher, self.allocator),
            counters=self.counters.stats(),
            prefix=self.prefix.stats(),
            window=self.batcher.window.stats(),
            steps=self.steps.stats(),
            ledger=self.ledger.stats(),
            overlap=self.overlap.stats(),
            tiers=self.tiers.stats(),
            spec=self.spec.stats(),
        )

    def stats(self) -> dict[str, float | int | str]:
        """``engine_stats`` as ``/stats`` serves it: one flat JSON object."""
        return self.engine_stats().flat()


def _pool_geometry(r: RunnerInfo) -> tuple[int, ...]:
    """What planning on a runner's pool depends on: pages, page size (tokens), the
    context limit, bytes per token and the sliding window."""
    return (r.num_pages, r.page_size, r.max_context, r.kv_bytes_per_token, r.sliding_window)
