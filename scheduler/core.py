"""The scheduler's domain logic: admit, plan, apply results, finish — no sockets.

The scheduler actor (``actors/scheduler.py``) drives it::

    core.add(request)              # TokenizedRequest arrived
    plan = core.next_plan()        # when no step is in flight, or (overlap) while one
                                   # is and core.can_plan_ahead()
    events = core.apply(result)    # StepResult arrived -> TokenEvents for the tokenizer
    core.abort(rid)                # client gone
    core.finish(rid)               # a stop string matched in its text

Results come back in plan order. With the overlap scheduler a plan is built while one
earlier step is still in flight; what that step holds is kept per step (``Slot``s) and
as an overlay on each request (``scheduler.overlap``).
"""

from __future__ import annotations

import time
from typing import Protocol

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.cache_tiers.radix_tree import RadixTree
from houchu.scheduler.batcher import BatchConfig, Batcher
from houchu.scheduler.ledger import SchedulerLedger
from houchu.scheduler.overlap import OverlapLedger, Slot
from houchu.scheduler.recovery import Recovery
from houchu.scheduler.request import Request
from houchu.scheduler.results import Results
from houchu.scheduler.tiers import TierClient
from houchu.spec.scheduling import SpecConfig, SpecScheduler
from houchu.transport.failures import Failed, bad_request, overloaded
from houchu.transport.limits import RunnerLimits
from houchu.transport.messages import (
    RunnerInfo,
    StepPlan,
    TokenizedRequest,
)
from houchu.transport.spec_messages import DraftReply, DraftRequest
from houchu.transport.telemetry import LeverSample, StepRecord


class Rejected(Failed):
    """A request the scheduler refuses, with the ``Failure`` its client gets (``status``
    400: it can never be served, e.g. it cannot fit in the whole KV pool)."""


class Overloaded(Rejected):
    """A request refused for now: the waiting queue is full (HTTP 429, retry later)."""


class TelemetrySink(Protocol):
    """Where lifecycle events and lever samples go (``transport.telemetry.Telemetry``)."""

    def event(
        self, rid: str, kind: str, t: float | None = None, **data: float | int | str
    ) -> None: ...
    def step(self, record: StepRecord) -> None: ...
    def lever(self, sample: LeverSample) -> None: ...


class NullTelemetry:
    """A sink that keeps nothing (telemetry off, and unit tests)."""

    def event(self, rid: str, kind: str, t: float | None = None, **data: float | int | str) -> None:
        pass

    def step(self, record: StepRecord) -> None:
        pass

    def lever(self, sample: LeverSample) -> None:
        pass


class SchedulerCore(Results, Recovery):
    """Continuous-batching scheduler over a paged KV pool with a radix prefix cache.

    Applying results comes from ``houchu.scheduler.results``; recovery from a peer's
    restart (fail or abort everything, start over on a new runner's pool) from
    ``houchu.scheduler.recovery``.

    Args:
        runner: the runner's pool geometry, context length and model size.
        config: batching limits.
        radix_cache: reuse cached prefixes (``--disable-radix-cache`` turns it off).
        tiers: the host / SSD KV tiers' client, or None (they need the radix cache).
        telemetry: where lifecycle events and lever samples go.
        spec: speculative decoding settings, or None (off).
        overlap: the actor plans a step while the previous one runs (only reported in
            the stats here; ``can_plan_ahead`` says when that is allowed).
    """

    def __init__(
        self,
        runner: RunnerInfo,
        config: BatchConfig,
        radix_cache: bool = True,
        telemetry: TelemetrySink | None = None,
        tiers: TierClient | None = None,
        spec: SpecConfig | None = None,
        overlap: bool = False,
    ) -> None:
        self.runner = runner
        self.allocator = PageAllocator(runner.num_pages, runner.page_size)
        fingerprint = tiers.fingerprint if tiers is not None else None
        self.tree = RadixTree(self.allocator, fingerprint) if radix_cache else None
        self.tiers = tiers if radix_cache else None
        self.batcher = Batcher(self.allocator, config, self.tree, self.tiers)
        self.ledger = SchedulerLedger(runner)
        self.telemetry = telemetry or NullTelemetry()
        self.spec = None
        if spec is not None:
            self.spec = SpecScheduler(spec, runner.max_context, config.max_running)
        self._in_flight: dict[int, list[Slot]] = {}  # step id -> its requests' shares
        self.overlap = OverlapLedger(overlap)
        self._sent_at: dict[int, float] = {}
        self.num_steps = 0
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_finished = 0
        self.num_aborted = 0
        self.num_refused = 0
        self.num_failed = 0
        self.busy_s = 0.0
        self.started = time.time()

    # ------------------------------------------------------------------ inputs

    def add(self, msg: TokenizedRequest) -> None:
        """Queue a tokenized request.

        Raises:
            Rejected: prompt + max_tokens exceed the context window or the whole KV pool.
            Overloaded: the waiting queue already holds ``max_queued_tokens`` prompt tokens.
        """
        limits = RunnerLimits.of(self.runner)
        num_prompt, max_tokens = len(msg.prompt_ids), msg.sampling.max_tokens
        failure = limits.context_failure(max_tokens, num_prompt) or limits.kv_failure(
            num_prompt, max_tokens
        )
        if failure is not None:
            raise Rejected(failure)
        if self.batcher.get(msg.rid) is not None:
            raise Rejected(bad_request(f"request id {msg.rid!r} is already queued"))
        self._check_queue(len(msg.prompt_ids))
        req = Request(msg.rid, msg.prompt_ids, msg.sampling, msg.stop_ids, msg.arrival_time)
        self.num_prompt_tokens += len(msg.prompt_ids)
        self.batcher.add(req)
        self.telemetry.event(req.rid, "queued", prompt_tokens=req.num_prompt)

    def _check_queue(self, num_prompt: int) -> None:
        """Raise Overloaded when ``num_prompt`` more tokens would overfill the waiting
        queue (an empty queue takes any request that fits the context)."""
        bound = self.batcher.config.max_queued_tokens
        waiting = self.batcher.waiting
        if bound is None or not waiting:
            return
        queued = sum(r.num_prompt for r in waiting)
        if queued + num_prompt > bound:
            self.num_refused += 1
            raise Overloaded(
                overloaded(
                    f"the scheduler's queue holds {queued} prompt tokens (limit {bound}); "
                    "retry later"
                )
            )

    def abort(self, rid: str) -> bool:
        """Drop a request wherever it is (its client is gone); its pages return to the
        pool now (the pages already indexed by the radix tree stay cached).

        Returns False if the request is unknown (already finished)."""
        req = self._drop(rid)
        if req is None:
            return False
        self.num_aborted += 1
        self.telemetry.event(rid, "aborted", completion_tokens=len(req.output_ids))
        return True

    def finish(self, rid: str) -> bool:
        """A stop string matched in the request's text: it is finished ("stop"); its
        pages return to the pool as for ``abort``.

        Returns False if the request is unknown (it already ended by itself)."""
        req = self._drop(rid)
        if req is None:
            return False
        self.num_finished += 1
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
        self._leave(req)
        return req

    @property
    def has_work(self) -> bool:
        return self.batcher.has_work

    @property
    def num_in_flight(self) -> int:
        """Steps planned whose results have not been applied."""
        return len(self._in_flight)

    def can_plan_ahead(self) -> bool:
        """Whether the next plan may be built now, with one step in flight (overlap).

        Not when no step or two are in flight, when the step in flight verifies
        proposals (how many it accepts is unknown until it returns), or when speculation
        may propose for the next step (proposals need every token known; such steps run
        without overlap): with speculation on, only while the decoding batch is larger
        than the size at which speculation is off."""
        if len(self._in_flight) != 1:
            return False
        (slots,) = self._in_flight.values()
        if any(s.num_draft for s in slots):
            return False
        if self.spec is not None:
            running = self.batcher.running.values()
            decoding = sum(1 for r in running if not r.plan_prefilling)
            if decoding and decoding <= self.spec.controller.cutoff:
                return False
        return True

    def next_plan(self) -> StepPlan | None:
        """The next step's plan, or None when idle. It may be built while one step is in
        flight (see ``can_plan_ahead``); never while two are."""
        if len(self._in_flight) > 1:
            raise RuntimeError("two steps are in flight: apply a result before planning")
        waiting_before = {r.rid for r in self.batcher.waiting}
        plan, scheduled = self.batcher.schedule()
        if plan is None:
            return None
        slots = [
            Slot(req, len(w.token_ids), w.sample, w.num_draft, req.plan_prefilling)
            for req, w in zip(scheduled, plan.work, strict=True)
        ]
        for slot in slots:
            slot.enter()
        self.overlap.steps_ahead += bool(self._in_flight)
        self._in_flight[plan.step_id] = slots
        self._sent_at[plan.step_id] = time.time()
        for req in scheduled:
            if req.rid in waiting_before:
                self._on_admitted(req)
        return plan

    def _on_admitted(self, req: Request) -> None:
        if req.num_preemptions:
            self.telemetry.event(req.rid, "resumed", cached_tokens=req.num_computed)
            return
        if req.cached_tokens:
            tier = max(req.tier_pages, key=req.tier_pages.get) if req.tier_pages else "device"
            self.telemetry.event(req.rid, "prefix_matched", cached_tokens=req.cached_tokens,
                                 tier=tier)  # fmt: skip
        for tier, pages in req.tier_pages.items():
            page_bytes = self.runner.page_size * self.runner.kv_bytes_per_token
            self.telemetry.lever(
                LeverSample(f"kv_tier_{tier}", "skip", float(pages * self.runner.page_size), "tokens",
                            float(pages * page_bytes), "bytes", time.time(), req.rid)
            )  # fmt: skip
        self.telemetry.event(req.rid, "scheduled")
        for sample in self.ledger.on_admitted(req):
            self.telemetry.lever(sample)

    # ------------------------------------------------------------------ leaving

    def _leave(self, req: Request) -> None:
        """Take ``req`` out of the batch, accounting what paging saved for it."""
        held = len(req.page_table) * self.runner.page_size * self.runner.kv_bytes_per_token
        for sample in self.ledger.on_finished(req, held):
            self.telemetry.lever(sample)
        if self.spec is not None:
            for sample in self.spec.on_leave(req):
                self.telemetry.lever(sample)
        self.batcher.remove(req)

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, float | int | str]:
        """Counters for the stats endpoint (pages are KV pages of ``page_size`` tokens)."""
        up = max(time.time() - self.started, 1e-9)
        running = self.batcher.running.values()
        bpt = self.runner.kv_bytes_per_token
        reserved = sum(len(r.page_table) for r in running) * self.runner.page_size * bpt
        max_len = sum(
            min(r.num_prompt + r.sampling.max_tokens, self.runner.max_context) for r in running
        )
        return {
            "model": self.runner.model_name,
            "num_running": len(self.batcher.running),
            "num_waiting": len(self.batcher.waiting),
            "num_waiting_tokens": sum(r.num_prompt for r in self.batcher.waiting),
            "num_refused_queue_full": self.num_refused,
            "num_pages_total": self.allocator.num_pages,
            "num_pages_free": self.allocator.num_free,
            "num_pages_used": self.allocator.num_used,
            "num_pages_cached": self.tree.num_pages if self.tree else 0,
            "num_pages_evicted": self.tree.num_evicted if self.tree else 0,
            "radix_cache": int(self.tree is not None),
            "page_size": self.allocator.page_size,
            "kv_bytes_per_token": bpt,
            "kv_bytes_reserved": reserved,
            "kv_bytes_max_length": max_len * bpt,
            "max_context": self.runner.max_context,
            "cpu_isa": self.runner.cpu_isa,
            "decode_paths": self.runner.decode_paths,
            "num_steps": self.num_steps,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "num_finished": self.num_finished,
            "num_aborted": self.num_aborted,
            "num_failed": self.num_failed,
            "num_preemptions": self.batcher.num_preemptions,
            "busy_fraction": self.busy_s / up,
            **self.ledger.stats(),
            **self.overlap.stats(),
            **(self.tiers.stats() if self.tiers is not None else {}),
            **(self.spec.stats() if self.spec is not None else {"speculative": "off"}),
        }

    # ------------------------------------------------------------------ speculation

    def draft_request(self) -> DraftRequest | None:
        """Proposals to ask the draft actor for before the next plan (None: none)."""
        if self.spec is None:
            return None
        return self.spec.draft_request(self.batcher.running.values())

    def attach_drafts(self, reply: DraftReply, seconds: float) -> None:
        """The draft's answer (``seconds`` after asking): proposals for the next plan."""
        self.spec.on_reply(reply, self.batcher.running.get, seconds)
