"""The scheduler core's results: apply a step's sampled tokens, finish requests, fail a
step's requests when it failed.

Results come back in plan order, possibly one step late (the overlap scheduler, see
``houchu.scheduler.overlap``): a step's requests are its ``Slot``s as planned, and a
request may have finished, been aborted or been preempted since.

``SchedulerCore`` inherits these methods; they use its batcher, allocator, ledgers and
telemetry.
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING

from houchu.scheduler.overlap import Slot
from houchu.scheduler.request import Request, Status
from houchu.spec.scheduling import free_pages_past
from houchu.transport.messages import Failure, SeqOutput, StepResult, TokenEvent
from houchu.transport.telemetry import StepRecord

if TYPE_CHECKING:
    from houchu.scheduler.core import SchedulerCore


class Results:
    """Mixin of ``SchedulerCore``: what to do with a step's result."""

    def apply(self: SchedulerCore, result: StepResult) -> list[TokenEvent]:
        """Apply a step's sampled tokens; finish requests; return events to send.

        Requests that finished or were aborted since the step was planned get nothing
        (their tokens are discarded); one preempted since keeps the token sampled for it
        (it is recomputed with it later)."""
        slots = self._in_flight.pop(result.step_id, [])
        sent_at = self._sent_at.pop(result.step_id, time.time())
        now = time.time()
        for slot in slots:
            slot.leave()
        self.num_steps += 1
        self.busy_s += result.duration_s
        self.overlap.on_executed(result.started_at, result.duration_s)
        self._record_step(result, slots, sent_at, now)
        if self.tiers is not None:
            self.tiers.on_step_done(result.step_id, result.error is None)
        if result.error is not None:
            return self._fail([s.req for s in slots], result.error)
        sampled: dict[str, list[SeqOutput]] = {}
        for o in result.outputs:  # several per request when proposals were verified
            sampled.setdefault(o.rid, []).append(o)
        events: list[TokenEvent] = []
        for slot in slots:
            req = slot.req
            if req.status is Status.FINISHED:
                if req.finish_reason is not None:  # finished by the step before: overlap
                    self.overlap.on_discarded(len(sampled.get(req.rid, ())))
                continue  # finished or aborted while the step ran
            running = req.status is Status.RUNNING  # else preempted while the step ran
            if running and req.is_prefilling:
                req.num_chunks += 1
                self.telemetry.event(req.rid, "prefill_chunk", start=req.num_computed,
                                     tokens=slot.num_tokens)  # fmt: skip
            num_draft = slot.num_draft
            req.spec.num_draft = 0
            outs = sampled.get(req.rid, [])[: num_draft + 1]
            # the step computed its real tokens and the proposals the runner accepted
            computed = slot.num_tokens - num_draft + max(len(outs) - 1, 0)
            if not outs:
                if running:
                    req.num_computed += computed
                    self.batcher.index_computed(req)
                continue  # a prefill chunk that is not the last
            if not req.output_ids:
                self.telemetry.event(req.rid, "first_token", t=now)
            self.ledger.on_token(req, now)
            kept, reason = self._take(req, outs)
            self.num_generated_tokens += len(kept)
            if running:
                req.num_computed = min(req.num_computed + computed, req.num_tokens)
                if num_draft:
                    self.spec.on_verified(req, num_draft, len(outs), len(kept))
                    free_pages_past(req, self.allocator, req.num_tokens)  # rejected ones
                self.batcher.index_computed(req)
            events.append(self._event(req, kept, reason))
            if reason is not None:
                req.finish_reason = reason
                self._leave(req)
                self.num_finished += 1
                self.telemetry.event(req.rid, "finished", finish_reason=reason,
                                     completion_tokens=len(req.output_ids))  # fmt: skip
        for sample in self.overlap.samples(now):
            self.telemetry.lever(sample)
        return events

    def _record_step(
        self: SchedulerCore, result: StepResult, slots: list[Slot], sent_at: float, now: float
    ) -> None:
        prefill = sum(s.num_tokens for s in slots if s.prefill)
        decode = sum(s.num_tokens for s in slots) - prefill
        phase = "mixed" if prefill and decode else ("prefill" if prefill else "decode")
        # from the runner's start when known (a plan sent ahead waits for the step before)
        t = result.started_at or sent_at
        self.telemetry.step(
            StepRecord(result.step_id, t, now - t, len(slots), prefill, decode, phase)
        )
        sample = self.ledger.on_step([s.req for s in slots], prefill + decode, now)
        if sample is not None:
            self.telemetry.lever(sample)
        if self.spec is not None and decode and not prefill and result.error is None:
            self.spec.observe_step(result.num_tokens, result.duration_s)

    def _take(
        self: SchedulerCore, req: Request, outs: list[SeqOutput]
    ) -> tuple[list[SeqOutput], str | None]:
        """Append ``outs``' tokens to ``req`` up to the first that finishes it (EOS, stop
        token, ``max_tokens``, context): the tokens kept and the finish reason, if any."""
        for i, out in enumerate(outs):
            req.output_ids.append(out.token_id)
            reason = req.check_finished(self.runner.max_context)
            if reason is not None:
                return outs[: i + 1], reason
        return outs, None

    def _event(
        self: SchedulerCore, req: Request, outs: list[SeqOutput], reason: str | None
    ) -> TokenEvent:
        ev = TokenEvent(
            rid=req.rid,
            token_ids=[o.token_id for o in outs],
            finish_reason=reason,
            prompt_tokens=req.num_prompt,
            cached_tokens=req.cached_tokens,
        )
        if outs[0].logprob is not None:
            ev.logprobs = [o.logprob for o in outs]
            ev.top_logprobs = [o.top_logprobs or [] for o in outs]
        return ev

    def _fail(self: SchedulerCore, scheduled: list[Request], failure: Failure) -> list[TokenEvent]:
        """Fail the requests of ``scheduled`` still running or waiting with ``failure``;
        their error events."""
        events = []
        for req in scheduled:
            if req.status is Status.FINISHED:
                continue
            if self.spec is not None:
                self.spec.on_leave(req)  # its draft state is released too
            self.batcher.remove(req)
            self.num_failed += 1
            self.telemetry.event(req.rid, "failed", error=failure.message)
            events.append(
                TokenEvent(rid=req.rid, token_ids=[], finish_reason="error", failure=failure)
            )
        return events
