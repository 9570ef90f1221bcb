"""The gateway's handle on the engine: send a request, stream its text deltas back.

One ``EngineClient`` per gateway process. It owns the gateway's inbox and the outboxes to
the tokenizer and the scheduler, and routes each incoming ``TextDelta`` / ``RequestFailed``
to the queue of the request it belongs to; a ``RequestFailed`` is raised as an
``EngineError`` carrying its ``Failure``. The runner's ``RunnerInfo`` updates
``runner_limits``. An optional ``RequestObserver`` sees each request arrive, stream and
end (telemetry and Prometheus metrics).

When the launcher reports that the tokenizer died (``ActorDown``), every request in
flight fails at once with HTTP 503 (the replacement knows none of them); requests sent
from then on wait for the replacement. When the scheduler died, the tokenizer fails the
requests it held, and pending stats queries fail here.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections import deque
from collections.abc import AsyncIterator, Mapping

import zmq.asyncio

from houchu.api.observe import RequestObserver
from houchu.api.token_path import TokenPathStats
from houchu.transport.actor_base import ActorBase
from houchu.transport.endpoints import Endpoints
from houchu.transport.failures import TIMEOUT, Failed, bad_request, unavailable
from houchu.transport.limits import LimitsWatch
from houchu.transport.messages import (
    AbortRequest,
    GatewayInbox,
    GenerateRequest,
    RequestFailed,
    RunnerInfo,
    StatsQuery,
    StatsReply,
    TextDelta,
)
from houchu.transport.peers import Peers

#: Longest wait for the scheduler's counters (``EngineClient.stats``; ``/stats`` and
#: ``/server_info`` answer 503 past it).
STATS_TIMEOUT_S = 5.0


class EngineError(Failed):
    """A request the engine rejected or failed, with its ``Failure`` (``status``: the
    HTTP status to report)."""


class Mailbox:
    """One request's messages as they arrive, for its one consumer: an ``asyncio.Queue``
    without the task ``asyncio.wait_for`` makes for every timed wait (a delta per
    generated token waits here)."""

    def __init__(self) -> None:
        self._items: deque[TextDelta | RequestFailed] = deque()
        self._waiter: asyncio.Future[None] | None = None

    def put(self, msg: TextDelta | RequestFailed) -> None:
        """Add ``msg`` and wake the consumer."""
        self._items.append(msg)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def empty(self) -> bool:
        return not self._items

    async def get(self, timeout_s: float) -> TextDelta | RequestFailed | None:
        """The next message; None when none came within ``timeout_s`` seconds."""
        if not self._items:
            loop = asyncio.get_running_loop()
            waiter = self._waiter = loop.create_future()
            timer = loop.call_later(timeout_s, _wake, waiter)
            try:
                await waiter
            finally:
                timer.cancel()
                self._waiter = None
        return self._items.popleft() if self._items else None


def _wake(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class EngineClient(ActorBase[GatewayInbox]):
    """Async client of the engine actors, used by the HTTP and WebSocket handlers; the
    gateway's inbox and its receive loop (``start``).

    Args:
        ctx: the process's asyncio ZeroMQ context.
        endpoints: actor inbox addresses.
        request_timeout_s: seconds without a delta after which the engine is asked whether
            it is alive; the request fails with HTTP 503 only if it does not answer.
        observer: told of each request's arrival, deltas and end (None: nobody).
        peers: the gateway's links to the other actors (None: made here).
    """

    name = "gateway"  # its inbox, and its name in the log

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoints: Endpoints,
        request_timeout_s: float = 120.0,
        observer: RequestObserver | None = None,
        peers: Peers | None = None,
    ) -> None:
        super().__init__(ctx, endpoints, GatewayInbox, peers)
        self._to_tokenizer = self.peers.outbox("tokenizer")
        self._to_scheduler = self.peers.outbox("scheduler")
        self._queues: dict[str, Mailbox] = {}
        self._stats_waiters: dict[int, asyncio.Future[StatsReply]] = {}
        self._query_ids = itertools.count()
        self._timeout_s = request_timeout_s
        self._observer = observer or RequestObserver()
        self.stopped = asyncio.Event()
        #: the runner's limits, from its latest ``RunnerInfo``
        self.runner_limits = LimitsWatch()
        #: each generated token's time, per component (``/stats``'s ``token_path``)
        self.token_path = TokenPathStats()

    def start(self) -> None:
        """Start routing inbox messages (call from the running event loop); ``stopped``
        is set when a ``Shutdown`` ends it."""
        self.spawn(self._route())

    async def _route(self) -> None:
        await self.run()
        self.stopped.set()

    async def handle(self, msg: GatewayInbox) -> None:
        """Route one message to the request or stats query it answers."""
        match msg:
            case TextDelta(rid=rid, stamps=stamps):
                if stamps is not None:  # the token path's stamp (StepStamps)
                    stamps.gateway_received = time.time()
                q = self._queues.get(rid)
                if q is not None:
                    q.put(msg)
            case RequestFailed(rid=rid):
                q = self._queues.get(rid)
                if q is not None:
                    q.put(msg)
            case RunnerInfo():
                self.runner_limits.update(msg)
            case StatsReply(query_id=qid):
                fut = self._stats_waiters.pop(qid, None)
                if fut is not None and not fut.done():
                    fut.set_result(msg)

    async def on_peer_down(self, name: str) -> None:
        """Fail what the dead actor ``name`` held: every request if it was the tokenizer,
        pending stats queries if it was the scheduler."""
        if name == "tokenizer":
            lost = unavailable("the tokenizer stopped and is restarting; retry")
            for rid, q in self._queues.items():
                q.put(RequestFailed(rid=rid, failure=lost))
        elif name == "scheduler":
            waiters, self._stats_waiters = self._stats_waiters, {}
            for fut in waiters.values():
                if not fut.done():
                    fut.set_exception(EngineError(unavailable("the scheduler is restarting")))

    @property
    def num_in_flight(self) -> int:
        """Requests sent and not yet finished."""
        return len(self._queues)

    async def generate(
        self, req: GenerateRequest, record: Mapping[str, float | int | str] | None = None
    ) -> AsyncIterator[TextDelta]:
        """Submit ``req`` and yield its deltas; the last one has ``finish_reason`` set.
        ``record``: the client request's parameters for the dashboard
        (``ParsedRequest.record``; None: those ``req`` carries).

        Raises:
            EngineError: the engine rejected the request (bad input: status 400) or failed
                it (500), or no delta arrived within ``request_timeout_s`` (503).
        Closing the iterator early (client disconnect) aborts the request in the engine.
        """
        if req.rid in self._queues:
            raise EngineError(bad_request(f"request id {req.rid!r} is already in flight"))
        q = self._queues[req.rid] = Mailbox()
        finished = False
        outcome = "aborted"
        self._observer.arrived(req, record)
        try:
            await self._to_tokenizer.send(req)
            while True:
                msg = await q.get(self._timeout_s)
                if msg is None:
                    # Quiet for a while: a long queue, or a request the engine lost (sent
                    # as an actor died) or an engine that is gone? Only the latter two
                    # fail it: a scheduler that answers and holds the request is busy.
                    try:
                        st = await self.stats(timeout_s=30.0, rid=req.rid)
                    except EngineError:
                        raise EngineError(
                            unavailable(
                                f"no progress on request in {self._timeout_s:.0f} s and the "
                                "engine does not answer",
                                code=TIMEOUT,
                            )
                        ) from None
                    if st.get("request_known", 1) or not q.empty():
                        continue
                    raise EngineError(
                        unavailable(
                            f"no progress on request in {self._timeout_s:.0f} s and the "
                            "scheduler does not hold it (lost while an actor restarted); retry"
                        )
                    ) from None
                if isinstance(msg, RequestFailed):
                    finished = True
                    outcome = "failed"
                    raise EngineError(msg.failure)
                self._observer.delta(req.rid, msg)
                if msg.finish_reason is not None:
                    finished = True  # before the yield: a consumer may stop right here
                    outcome = "finished"
                    yield msg
                    self._written(req.rid, msg)
                    return
                yield msg
                self._written(req.rid, msg)  # the consumer wrote it and asks for the next
        except EngineError:
            outcome = "failed"
            raise
        finally:
            self._observer.ended(req.rid, outcome)
            self.token_path.forget(req.rid)
            self._queues.pop(req.rid, None)
            if not finished:
                await self.abort(req.rid)

    def _written(self, rid: str, delta: TextDelta) -> None:
        """The consumer of ``rid``'s deltas came back for the next one: ``delta`` is
        written to its client (the token path's last stamp)."""
        if delta.stamps is not None:
            delta.stamps.written = time.time()
            self.token_path.written(rid, delta.stamps)

    async def abort(self, rid: str) -> None:
        """Abort a request: its pages return to the pool, no more deltas are sent."""
        await self._to_tokenizer.send(AbortRequest(rid))

    async def stats(
        self, timeout_s: float = STATS_TIMEOUT_S, rid: str | None = None
    ) -> dict[str, float | int | str]:
        """The scheduler's counters (free pages, running requests, ...); with ``rid``,
        also ``request_known`` (1 when the scheduler holds that request, else 0).

        Raises:
            EngineError: (503) the scheduler did not answer within ``timeout_s`` seconds.
        """
        qid = next(self._query_ids)
        fut: asyncio.Future[StatsReply] = asyncio.get_running_loop().create_future()
        self._stats_waiters[qid] = fut
        await self._to_scheduler.send(StatsQuery(qid, rid))
        try:
            reply = await asyncio.wait_for(fut, timeout_s)
        except asyncio.TimeoutError:
            self._stats_waiters.pop(qid, None)
            raise EngineError(unavailable("scheduler did not answer", code=TIMEOUT)) from None
        return reply.stats.flat()
