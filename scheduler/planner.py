"""Planning the next step: the batcher's plan, launched as a step in flight, and what
the recorder hears about the requests it admits or preempts."""

from __future__ import annotations

import time

from houchu.scheduler.batcher import Batcher
from houchu.scheduler.ledger import SchedulerLedger
from houchu.scheduler.overlap import OverlapLedger, Slot
from houchu.scheduler.request import Request
from houchu.scheduler.speculation import Speculation
from houchu.scheduler.steps import StepTracker
from houchu.scheduler.telemetry_sink import TelemetrySink
from houchu.transport.levers import TIER_LEVERS, Unit, Verb
from houchu.transport.messages import RunnerInfo, StepPlan
from houchu.transport.telemetry import LeverSample


class Planner:
    """Builds plans and launches them as steps in flight.

    Holds no state of its own: it works on the parts of one ``SchedulerCore`` (which
    builds a new one when the runner is replaced).

    Args:
        runner: the runner's KV geometry (for the KV tiers' lever samples).
        batcher: the waiting queue and running set.
        steps: the steps in flight.
        spec: speculation's bookkeeping (``NoSpeculation`` when off).
        ledger: the scheduler's lever ledger.
        overlap: the overlap scheduler's ledger.
        telemetry: where lifecycle events and lever samples go.
    """

    def __init__(
        self,
        runner: RunnerInfo,
        batcher: Batcher,
        steps: StepTracker,
        spec: Speculation,
        ledger: SchedulerLedger,
        overlap: OverlapLedger,
        telemetry: TelemetrySink,
    ) -> None:
        self.runner = runner
        self.batcher = batcher
        self.steps = steps
        self.spec = spec
        self.ledger = ledger
        self.overlap = overlap
        self.telemetry = telemetry

    def can_plan_ahead(self) -> bool:
        """Whether the next plan may be built now, with one step in flight (overlap).

        Not when no step or two are in flight, when the step in flight verifies
        proposals (how many it accepts is unknown until it returns), or when speculation
        may propose for the next step (proposals need every token known; such steps run
        without overlap): with speculation on, only while the decoding batch is larger
        than the size at which speculation is off."""
        if len(self.steps) != 1 or any(s.num_draft for s in self.steps.only()):
            return False
        running = self.batcher.running.values()
        decoding = sum(1 for r in running if not r.plan_prefilling)
        return not self.spec.blocks_overlap(decoding)

    def next_plan(self) -> StepPlan | None:
        """The next step's plan, launched as a step in flight, or None when idle. It may
        be built while one step is in flight (see ``can_plan_ahead``); never while two
        are. Emits "preempted" for each request preempted to make room, and "resumed" or
        "scheduled" for each one admitted.

        Raises:
            RuntimeError: two steps are in flight.
        """
        if len(self.steps) > 1:
            raise RuntimeError("two steps are in flight: apply a result before planning")
        waiting_before = {r.rid for r in self.batcher.waiting}
        plan, scheduled = self.batcher.schedule()
        preempted = self.batcher.take_preempted()
        for req in preempted:
            self.telemetry.event(req.rid, "preempted", tokens=req.num_tokens)
        if plan is None:
            return None
        self.spec.ask_runner(plan.work, scheduled)  # in-runner proposals (MTP)
        for req, w in zip(scheduled, plan.work, strict=True):
            req.give_pages(w)  # the runner keeps page tables between steps
        slots = [
            Slot(req, len(w.token_ids), w.sample, w.num_draft, req.plan_prefilling)
            for req, w in zip(scheduled, plan.work, strict=True)
        ]
        self.overlap.on_planned(ahead=len(self.steps) > 0)
        self.steps.launch(plan.step_id, slots)
        for req in scheduled:
            if req.rid in waiting_before or req in preempted:  # preempted, then re-admitted
                self._on_admitted(req)
        return plan

    def _on_admitted(self, req: Request) -> None:
        if req.num_preemptions:
            req.recomputing = True
            self.telemetry.event(
                req.rid,
                "resumed",
                cached_tokens=req.num_computed,
                recompute_tokens=req.num_tokens - req.num_computed,
            )
            return
        if req.cached_tokens:
            tier = (
                max(req.tier_pages, key=req.tier_pages.__getitem__) if req.tier_pages else "device"
            )
            self.telemetry.event(
                req.rid, "prefix_matched", cached_tokens=req.cached_tokens, tier=tier
            )
        for tier, pages in req.tier_pages.items():
            page_bytes = self.runner.page_size * self.runner.kv_bytes_per_token
            self.telemetry.lever(
                LeverSample(
                    lever=TIER_LEVERS[tier],
                    verb=Verb.SKIP,
                    saved=float(pages * self.runner.page_size),
                    saved_unit=Unit.TOKENS,
                    spent=float(pages * page_bytes),
                    spent_unit=Unit.BYTES,
                    t=time.time(),
                    rid=req.rid,
                )
            )
        self.telemetry.event(req.rid, "scheduled")
        for sample in self.ledger.on_admitted(req):
            self.telemetry.lever(sample)
