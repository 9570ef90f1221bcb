"""The gateway's engine client over real ZeroMQ sockets, with the tokenizer and the
scheduler played here: a request the engine lost (sent while an actor restarted) fails
with a 503 after the no-progress timeout instead of waiting forever, while a request
the scheduler still holds keeps waiting."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import zmq.asyncio

from houchu.api.engine_client import EngineClient, EngineError
from houchu.transport.channel import Inbox, Outbox
from houchu.transport.endpoints import Endpoints
from houchu.transport.messages import (
    GenerateRequest,
    SamplingParams,
    SchedulerInbox,
    StatsReply,
    TextDelta,
    TokenizerInbox,
)
from houchu.transport.stats import EngineStats, PoolStats

_names = itertools.count()


async def _engine(known: bool, finish_after_s: float | None):
    """A client plus fake tokenizer and scheduler tasks. The tokenizer swallows requests
    (or finishes them after ``finish_after_s``); the scheduler answers stats queries,
    saying it holds the request when ``known``."""
    ctx = zmq.asyncio.Context.instance()
    ep = Endpoints.inproc(f"engine-client-{next(_names)}")
    tok_in = Inbox(ctx, ep["tokenizer"], TokenizerInbox)
    sched_in = Inbox(ctx, ep["scheduler"], SchedulerInbox)
    to_gateway = Outbox(ctx, ep["gateway"])
    client = EngineClient(ctx, ep, request_timeout_s=0.3)
    client.start()
    queries: list[str | None] = []

    async def tokenizer() -> None:
        while True:
            msg = await tok_in.recv()
            if isinstance(msg, GenerateRequest) and finish_after_s is not None:
                await asyncio.sleep(finish_after_s)
                await to_gateway.send(TextDelta(rid=msg.rid, text="x", finish_reason="stop"))

    async def scheduler() -> None:
        while True:
            q = await sched_in.recv()
            queries.append(q.rid)
            stats = EngineStats(pool=PoolStats(num_running=1), request_known=int(known))
            await to_gateway.send(StatsReply(query_id=q.query_id, stats=stats))

    tasks = [asyncio.create_task(tokenizer()), asyncio.create_task(scheduler())]

    async def close() -> None:
        for t in tasks:
            t.cancel()
        await client.close()
        for s in (tok_in, sched_in, to_gateway):
            s.close()

    return client, queries, close


def _req() -> GenerateRequest:
    return GenerateRequest(rid="r1", prompt="hi", sampling=SamplingParams(max_tokens=2))


async def test_lost_request_fails_after_timeout() -> None:
    client, queries, close = await _engine(known=False, finish_after_s=None)
    try:
        with pytest.raises(EngineError) as err:
            async with asyncio.timeout(10):
                async for _ in client.generate(_req()):
                    pass
        assert err.value.status == 503 and "does not hold it" in err.value.message
        assert queries == ["r1"]
    finally:
        await close()


async def test_request_the_scheduler_holds_keeps_waiting() -> None:
    client, queries, close = await _engine(known=True, finish_after_s=1.0)
    try:
        got = [d async for d in client.generate(_req())]
        assert got[-1].finish_reason == "stop"
        assert queries and set(queries) == {"r1"}  # asked, and kept waiting
    finally:
        await close()
