"""Several choices of one client request (``n``, ``best_of``), streamed as one.

Each choice is its own engine request (``ParsedRequest.to_generates``); ``open_choices``
starts them all and yields ``(index, delta)`` pairs as they arrive, each choice's deltas
in order. Leaving the block early (client gone, an error) closes every choice's
iterator, which aborts the unfinished ones in the engine. ``prompt_first`` puts choice
0's first delta (the prompt's text and logprobs) before the others'; ``best_choices``
picks the ``n`` returned from ``best_of`` generated ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping, Sequence

from aiohttp import web

from houchu.api.state import ENGINE_KEY, close_quietly
from houchu.api.tally import Tally
from houchu.transport.messages import GenerateRequest, TextDelta

_END = None  # a choice's pump is done


@contextlib.asynccontextmanager
async def open_choices(
    app: web.Application,
    reqs: Sequence[GenerateRequest],
    record: Mapping[str, float | int | str] | None = None,
) -> AsyncIterator[AsyncIterator[tuple[int, TextDelta]]]:
    """Start every request of ``reqs`` (choice ``i`` is ``reqs[i]``); yield an iterator
    of ``(i, delta)``. ``record``: the client request's parameters, for the dashboard
    (``ParsedRequest.record``). An ``EngineError`` of any choice is raised by the iterator (the
    other choices are then aborted when the block exits)."""
    engine = app[ENGINE_KEY]
    its = [engine.generate(r, record) for r in reqs]
    if len(its) == 1:
        try:
            yield _one(its[0])
        finally:
            await close_quietly(its[0])
        return
    queue: asyncio.Queue[tuple[int, TextDelta | BaseException | None]] = asyncio.Queue()

    async def pump(i: int, it: AsyncIterator[TextDelta]) -> None:
        try:
            async for delta in it:
                queue.put_nowait((i, delta))
        except Exception as exc:  # given to the consumer, which raises it
            queue.put_nowait((i, exc))
            return
        queue.put_nowait((i, _END))

    tasks = [asyncio.create_task(pump(i, it)) for i, it in enumerate(its)]
    try:
        yield _merged(queue, len(its))
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        for it in its:
            await close_quietly(it)


async def _one(it: AsyncIterator[TextDelta]) -> AsyncIterator[tuple[int, TextDelta]]:
    async for delta in it:
        yield 0, delta


async def _merged(
    queue: asyncio.Queue[tuple[int, TextDelta | BaseException | None]], count: int
) -> AsyncIterator[tuple[int, TextDelta]]:
    left = count
    while left:
        i, item = await queue.get()
        if item is _END:
            left -= 1
        elif isinstance(item, BaseException):
            raise item
        else:
            yield i, item


async def prompt_first(
    deltas: AsyncIterator[tuple[int, TextDelta]], hold: bool
) -> AsyncIterator[tuple[int, TextDelta]]:
    """``deltas``, with every other choice's deltas held back until choice 0's first
    one has been yielded when ``hold``: that delta carries the prompt's text and logprobs
    (``echo``, ``prompt_logprobs``), which each choice's first frame or chunk repeats.
    Each choice's deltas keep their order."""
    held: list[tuple[int, TextDelta]] = []
    waiting = hold
    async for i, delta in deltas:
        if waiting and i != 0:
            held.append((i, delta))
            continue
        yield i, delta
        if waiting:
            waiting = False
            for item in held:
                yield item
            held = []
    for item in held:  # choice 0 never came (it failed): the others as they were
        yield item


def mean_logprob(tally: Tally) -> float:
    """A choice's mean token log-probability (-inf without tokens)."""
    if not tally.logprobs:
        return float("-inf")
    return sum(lp.logprob for lp in tally.logprobs) / len(tally.logprobs)


def best_choices(tallies: Sequence[Tally], n: int) -> list[int]:
    """The indices of the ``n`` choices to return out of ``tallies``: all of them when
    there are ``n``, else the ``n`` with the highest mean token log-probability
    (OpenAI's ``best_of``: "the highest log probability per token"), in that order."""
    if len(tallies) == n:
        return list(range(n))
    order = sorted(range(len(tallies)), key=lambda i: -mean_logprob(tallies[i]))
    return order[:n]
