"""The scheduler's domain logic: admit, plan, apply results, finish — no sockets.

The scheduler actor (``actors/scheduler.py``) drives it::

    core.add(request)              # TokenizedRequest arrived
    plan = core.next_plan()        # when no step is in flight
    events = core.apply(result)    # StepResult arrived -> TokenEvents for the tokenizer
    core.abort(rid)                # client gone, or a stop string matched
"""

from __future__ import annotations

import time

from houchu.cache_tiers.page_allocator import PageAllocator
from houchu.scheduler.batcher import BatchConfig, Batcher
from houchu.scheduler.request import Request, Status
from houchu.transport.messages import (
    RunnerInfo,
    SeqOutput,
    StepPlan,
    StepResult,
    TokenEvent,
    TokenizedRequest,
)


class Rejected(Exception):
    """A request that can never be served (e.g. it cannot fit in the whole KV pool)."""


class SchedulerCore:
    """Continuous-batching scheduler over a paged KV pool.

    Args:
        runner: the runner's pool geometry and context length.
        config: batching limits.
    """

    def __init__(self, runner: RunnerInfo, config: BatchConfig) -> None:
        self.runner = runner
        self.allocator = PageAllocator(runner.num_pages, runner.page_size)
        self.batcher = Batcher(self.allocator, config)
        self._in_flight: dict[int, list[Request]] = {}
        self.num_steps = 0
        self.num_prompt_tokens = 0
        self.num_generated_tokens = 0
        self.num_finished = 0
        self.num_aborted = 0
        self.num_failed = 0
        self.busy_s = 0.0
        self.started = time.time()

    # ------------------------------------------------------------------ inputs

    def add(self, msg: TokenizedRequest) -> None:
        """Queue a tokenized request.

        Raises:
            Rejected: prompt + max_tokens exceed the context window or the whole KV pool.
        """
        need = min(len(msg.prompt_ids) + msg.sampling.max_tokens, self.runner.max_context)
        if len(msg.prompt_ids) >= self.runner.max_context:
            raise Rejected(
                f"prompt is {len(msg.prompt_ids)} tokens; this model's context window "
                f"is {self.runner.max_context} tokens"
            )
        capacity = self.runner.num_pages * self.runner.page_size
        if need > capacity:
            raise Rejected(
                f"request needs {need} tokens of KV cache but the whole pool holds {capacity}"
            )
        if self.batcher.get(msg.rid) is not None:
            raise Rejected(f"request id {msg.rid!r} is already queued")
        req = Request(msg.rid, msg.prompt_ids, msg.sampling, msg.eos_token_ids, msg.arrival_time)
        self.num_prompt_tokens += len(msg.prompt_ids)
        self.batcher.add(req)

    def abort(self, rid: str) -> bool:
        """Drop a request wherever it is; its pages return to the pool now.

        Returns False if the request is unknown (already finished)."""
        req = self.batcher.get(rid)
        if req is None:
            return False
        req.is_aborted = True
        self.batcher.remove(req)
        self.num_aborted += 1
        return True

    @property
    def has_work(self) -> bool:
        return self.batcher.has_work

    def next_plan(self) -> StepPlan | None:
        """The next step's plan, or None when idle."""
        plan, scheduled = self.batcher.schedule()
        if plan is not None:
            self._in_flight[plan.step_id] = scheduled
        return plan

    # ------------------------------------------------------------------ results

    def apply(self, result: StepResult) -> list[TokenEvent]:
        """Apply a step's sampled tokens; finish requests; return events to send."""
        scheduled = self._in_flight.pop(result.step_id, [])
        self.num_steps += 1
        self.busy_s += result.duration_s
        if result.error is not None:
            return self._fail(scheduled, result.error)
        sampled = {o.rid: o for o in result.outputs}
        events: list[TokenEvent] = []
        for req in scheduled:
            if req.status is not Status.RUNNING or req.is_aborted:
                continue  # aborted or preempted while the step ran
            req.num_computed += req.num_scheduled
            out = sampled.get(req.rid)
            if out is None:
                continue  # a prefill chunk that is not the last
            req.output_ids.append(out.token_id)
            self.num_generated_tokens += 1
            reason = req.check_finished(self.runner.max_context)
            events.append(self._event(req, out, reason))
            if reason is not None:
                req.finish_reason = reason
                self.batcher.remove(req)
                self.num_finished += 1
        return events

    def _event(self, req: Request, out: SeqOutput, reason: str | None) -> TokenEvent:
        ev = TokenEvent(
            rid=req.rid,
            token_ids=[out.token_id],
            finish_reason=reason,
            prompt_tokens=req.num_prompt,
            cached_tokens=req.cached_tokens,
        )
        if out.logprob is not None:
            ev.logprobs = [out.logprob]
            ev.top_logprobs = [out.top_logprobs or []]
        return ev

    def _fail(self, scheduled: list[Request], error: str) -> list[TokenEvent]:
        events = []
        for req in scheduled:
            if req.status is Status.FINISHED:
                continue
            self.batcher.remove(req)
            self.num_failed += 1
            events.append(TokenEvent(rid=req.rid, token_ids=[], finish_reason="error", error=error))
        return events

    # ------------------------------------------------------------------ stats

    def stats(self) -> dict[str, float | int | str]:
        """Counters for the stats endpoint (pages are KV pages of ``page_size`` tokens)."""
        up = max(time.time() - self.started, 1e-9)
        return {
            "model": self.runner.model_name,
            "num_running": len(self.batcher.running),
            "num_waiting": len(self.batcher.waiting),
            "num_pages_total": self.allocator.num_pages,
            "num_pages_free": self.allocator.num_free,
            "num_pages_used": self.allocator.num_used,
            "page_size": self.allocator.page_size,
            "kv_bytes_per_token": self.runner.kv_bytes_per_token,
            "max_context": self.runner.max_context,
            "num_steps": self.num_steps,
            "num_prompt_tokens": self.num_prompt_tokens,
            "num_generated_tokens": self.num_generated_tokens,
            "num_finished": self.num_finished,
            "num_aborted": self.num_aborted,
            "num_failed": self.num_failed,
            "num_preemptions": self.batcher.num_preemptions,
            "busy_fraction": self.busy_s / up,
        }
