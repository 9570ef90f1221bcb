"""Admission: whether a tokenized request may join the waiting queue.

A request is refused for good (:class:`Rejected`, HTTP 400) when prompt + ``max_tokens``
exceed the context window or the whole KV pool, or its id is already queued; for now
(:class:`Overloaded`, HTTP 429) when the waiting queue already holds
``max_queued_tokens`` prompt tokens.
"""

from __future__ import annotations

from houchu.scheduler.batcher import Batcher
from houchu.scheduler.counters import SchedulerCounters
from houchu.scheduler.request import Request
from houchu.transport.failures import Failed, bad_request, overloaded
from houchu.transport.limits import RunnerLimits
from houchu.transport.messages import RunnerInfo, TokenizedRequest


class Rejected(Failed):
    """A request the scheduler refuses, with the ``Failure`` its client gets (``status``
    400: it can never be served, e.g. it cannot fit in the whole KV pool)."""


class Overloaded(Rejected):
    """A request refused for now: the waiting queue is full (HTTP 429, retry later)."""


def admit(
    msg: TokenizedRequest, runner: RunnerInfo, batcher: Batcher, counters: SchedulerCounters
) -> Request:
    """The scheduler's ``Request`` for ``msg``, once it is admitted (not yet queued).

    Counts a refusal for a full queue in ``counters.refused``.

    Raises:
        Rejected: prompt + max_tokens exceed the context window or the whole KV pool, or
            the request id is already queued or running.
        Overloaded: the waiting queue already holds ``max_queued_tokens`` prompt tokens.
    """
    limits = RunnerLimits.of(runner)
    num_prompt, max_tokens = len(msg.prompt_ids), msg.sampling.max_tokens
    failure = limits.context_failure(max_tokens, num_prompt) or limits.kv_failure(
        num_prompt, max_tokens
    )
    if failure is not None:
        raise Rejected(failure)
    if batcher.get(msg.rid) is not None:
        raise Rejected(bad_request(f"request id {msg.rid!r} is already queued"))
    _check_queue(batcher, counters, num_prompt)
    return Request(
        msg.rid,
        msg.prompt_ids,
        msg.sampling,
        msg.stop_ids,
        msg.arrival_time,
        prefill_group=msg.prefill_group,
        prefill_group_size=msg.prefill_group_size,
    )


def _check_queue(batcher: Batcher, counters: SchedulerCounters, num_prompt: int) -> None:
    """Raise Overloaded when ``num_prompt`` more tokens would overfill the waiting
    queue (an empty queue takes any request that fits the context)."""
    bound = batcher.config.max_queued_tokens
    waiting = batcher.waiting
    if bound is None or not waiting:
        return
    queued = sum(r.num_prompt for r in waiting)
    if queued + num_prompt > bound:
        counters.refused += 1
        raise Overloaded(
            overloaded(
                f"the scheduler's queue holds {queued} prompt tokens (limit {bound}); retry later"
            )
        )
