"""What a step's result does to its requests: tokens appended and sent on, requests
finished, or failed when the step failed.

Results come back in plan order, possibly one step late (the overlap scheduler, see
``houchu.scheduler.overlap``): a step's requests are its ``Slot``s as planned, and a
request may have finished, been aborted or been preempted since.
"""

from __future__ import annotations

import time

from houchu.scheduler.batcher import Batcher
from houchu.scheduler.counters import SchedulerCounters
from houchu.scheduler.ledger import SchedulerLedger
from houchu.scheduler.overlap import OverlapLedger, Slot
from houchu.scheduler.request import Request, Status
from houchu.scheduler.speculation import Speculation
from houchu.scheduler.telemetry_sink import TelemetrySink
from houchu.transport.messages import Failure, RunnerInfo, SeqOutput, StepResult, TokenEvent


class ResultApplier:
    """Applies step results to the scheduler's requests, and takes requests out.

    Holds no state of its own: it works on the parts of one ``SchedulerCore`` (which
    builds a new one when the runner is replaced).

    Args:
        runner: the runner's context length and KV geometry.
        batcher: the waiting queue and running set.
        spec: speculation's bookkeeping (``NoSpeculation`` when off).
        ledger: the scheduler's lever ledger.
        overlap: the overlap scheduler's ledger.
        telemetry: where lifecycle events and lever samples go.
        counters: the scheduler's totals.
    """

    def __init__(
        self,
        runner: RunnerInfo,
        batcher: Batcher,
        spec: Speculation,
        ledger: SchedulerLedger,
        overlap: OverlapLedger,
        telemetry: TelemetrySink,
        counters: SchedulerCounters,
    ) -> None:
        self.runner = runner
        self.batcher = batcher
        self.spec = spec
        self.ledger = ledger
        self.overlap = overlap
        self.telemetry = telemetry
        self.counters = counters
        #: requests that got forced tokens in the result applied last and go on (a later
        #: step in flight that samples for one draws nothing: ``StepTracker.void_samples``)
        self.jumped: list[Request] = []

    def apply(self, result: StepResult, slots: list[Slot]) -> list[TokenEvent]:
        """Apply a step's sampled tokens to its ``slots``' requests; finish requests;
        return the events to send to the tokenizer.

        Requests that finished or were aborted since the step was planned get nothing
        (their tokens are discarded); one preempted since keeps the token sampled for it
        (it is recomputed with it later)."""
        now = time.time()
        self.jumped = []
        self.counters.steps += 1
        self.counters.busy_s += result.duration_s
        self.counters.allreduce_s += result.allreduce_s
        self.overlap.on_executed(result.started_at, result.duration_s)
        self._account_step(result, slots, now)
        if result.error is not None:
            return self.fail([s.req for s in slots], result.error)
        events = self._fail_alone(result, slots)
        self._take_prompt_logprobs(result, slots)
        sampled: dict[str, list[SeqOutput]] = {}
        for o in result.outputs:  # several per request when proposals were verified
            sampled.setdefault(o.rid, []).append(o)
        events += [ev for slot in slots for ev in self._apply_one(slot, sampled, now)]
        self.spec.on_runner_proposals(result, self.batcher.running.get)  # MTP's, if any
        for sample in self.overlap.samples(now):
            self.telemetry.lever(sample)
        return events

    def _fail_alone(self, result: StepResult, slots: list[Slot]) -> list[TokenEvent]:
        """Fail the requests the step failed on their own (``StepResult.failures``: a
        grammar the runner could not compile or follow) before their tokens are taken:
        what the step sampled for them is discarded, the rest of the batch goes on."""
        if not result.failures:
            return []
        events = []
        for slot in slots:
            failure = result.failures.get(slot.req.rid)
            if failure is not None:
                events += self.fail([slot.req], failure)
        return events

    def _take_prompt_logprobs(self, result: StepResult, slots: list[Slot]) -> None:
        """Keep the prompt tokens the step scored on their requests (sent with each
        request's first event)."""
        if not result.prompt_logprobs:
            return
        reqs = {s.req.rid: s.req for s in slots}
        for plp in result.prompt_logprobs:
            req = reqs.get(plp.rid)
            if req is None or req.status is Status.FINISHED:
                continue
            if req.prompt_logprobs is None:
                req.prompt_logprobs = plp
            else:
                req.prompt_logprobs.extend(plp)

    def _apply_one(
        self, slot: Slot, sampled: dict[str, list[SeqOutput]], now: float
    ) -> list[TokenEvent]:
        """One request's share of the step: its event, if it gets one."""
        req = slot.req
        if req.status is Status.FINISHED:
            if req.finish_reason is not None:  # finished by the step before: overlap
                self.overlap.on_discarded(len(sampled.get(req.rid, ())))
            return []  # finished or aborted while the step ran
        running = req.status is Status.RUNNING  # else preempted while the step ran
        if running and req.is_prefilling:
            req.num_chunks += 1
            self.telemetry.event(
                req.rid, "prefill_chunk", start=req.num_computed, tokens=slot.num_tokens
            )
        num_draft = slot.num_draft
        req.spec.num_draft = 0
        got = sampled.get(req.rid, [])
        outs = [o for o in got if not o.forced][: num_draft + 1]
        forced = [o for o in got if o.forced]  # jump-forward: no KV yet, fed next step
        # the step computed its real tokens and the proposals the runner accepted
        computed = slot.num_tokens - num_draft + max(len(outs) - 1, 0)
        if not outs:
            if running:
                req.num_computed += computed
                self.batcher.index_computed(req)
            return []  # a prefill chunk that is not the last
        if not req.output_ids:
            self.telemetry.event(req.rid, "first_token", t=now)
        elif req.recomputing:  # its KV is rebuilt: it decodes again
            req.recomputing = False
            self.telemetry.event(req.rid, "decode", t=now, tokens=len(req.output_ids))
        self.ledger.on_token(req, now)
        kept, reason = self._take(req, outs + forced)
        self.counters.generated_tokens += len(kept)
        num_forced = max(len(kept) - len(outs), 0)
        self.counters.jump_forward_tokens += num_forced
        if num_forced and reason is None:
            self.jumped.append(req)
        if running:
            req.num_computed = min(req.num_computed + computed, req.num_tokens)
            if num_draft:
                self.spec.on_verified(req, num_draft, len(outs), len(kept) - num_forced)
                self.batcher.free_rejected(req)
            self.batcher.index_computed(req)
        event = _event(req, kept, reason)
        if reason is not None:
            req.finish_reason = reason
            self.leave(req)
            self.counters.finished += 1
            self.telemetry.event(
                req.rid, "finished", finish_reason=reason, completion_tokens=len(req.output_ids)
            )
        return [event]

    def _account_step(self, result: StepResult, slots: list[Slot], now: float) -> None:
        """The step's share of the ledger (continuous batching) and of speculation's cost
        model. The runner reports the step itself (its ``StepRecord``)."""
        prefill = sum(s.num_tokens for s in slots if s.prefill)
        decode = sum(s.num_tokens for s in slots) - prefill
        for sample in self.ledger.on_step([s.req for s in slots], prefill + decode, now):
            self.telemetry.lever(sample)
        if decode and not prefill and result.error is None:
            # the runner's MTP passes are the draft's cost, not the target's
            self.spec.observe_step(result.num_tokens, result.duration_s - result.draft_s)

    def _take(self, req: Request, outs: list[SeqOutput]) -> tuple[list[SeqOutput], str | None]:
        """Append ``outs``' tokens to ``req`` up to the first that finishes it (EOS, stop
        token, ``max_tokens``, context): the tokens kept and the finish reason, if any.
        With ``max_tokens`` 0 (the prompt alone, its logprobs computed) the token sampled
        after the prompt is not kept."""
        if req.sampling.max_tokens == 0:
            return [], "length"
        for i, out in enumerate(outs):
            req.output_ids.append(out.token_id)
            reason = req.check_finished(self.runner.max_context)
            if reason is not None:
                return outs[: i + 1], reason
        return outs, None

    def leave(self, req: Request) -> None:
        """Take ``req`` out of the batch (finished or aborted), accounting what paging
        and speculation did for it."""
        r = self.runner
        held = (len(req.page_table) - req.num_dead_pages) * r.page_size * r.kv_bytes_per_token
        for sample in self.ledger.on_finished(req, held):
            self.telemetry.lever(sample)
        for sample in self.spec.on_leave(req):
            self.telemetry.lever(sample)
        self.batcher.remove(req)

    def fail(self, requests: list[Request], failure: Failure) -> list[TokenEvent]:
        """Fail ``requests`` (those not finished yet) with ``failure``; returns their
        error events."""
        events = []
        for req in requests:
            if req.status is Status.FINISHED:
                continue
            self.spec.on_leave(req)  # its draft state is released too
            self.batcher.remove(req)
            self.counters.failed += 1
            self.telemetry.event(req.rid, "failed", error=failure.message)
            events.append(
                TokenEvent(rid=req.rid, token_ids=[], finish_reason="error", failure=failure)
            )
        return events


def _event(req: Request, outs: list[SeqOutput], reason: str | None) -> TokenEvent:
    """The tokenizer's event for ``outs``, the tokens just kept for ``req``."""
    ev = TokenEvent(
        rid=req.rid,
        token_ids=[o.token_id for o in outs],
        finish_reason=reason,
        prompt_tokens=req.num_prompt,
        cached_tokens=req.cached_tokens,
        prompt_logprobs=req.prompt_logprobs,
    )
    req.prompt_logprobs = None  # sent
    if outs and outs[0].logprob is not None:
        # every token of a request that asked has one (jump-forward is off for it)
        logprobs = [o.logprob for o in outs if o.logprob is not None]
        if len(logprobs) == len(outs):
            ev.logprobs = logprobs
            ev.top_logprobs = [o.top_logprobs or [] for o in outs]
    return ev
