"""The actor base (``houchu.transport.actor_base.ActorBase``) over real in-process ZeroMQ
sockets: ``ActorDown`` handles what is queued before the links reconnect, ``Shutdown``
ends the loop and ``close`` closes the sockets, an undecodable frame is logged and skipped,
a timer wakes the loop, and a vital task that fails ends it. Every wait is on a condition."""

from __future__ import annotations

import asyncio
import itertools

import pytest
import zmq
import zmq.asyncio

from houchu.transport.actor_base import ActorBase
from houchu.transport.channel import Outbox
from houchu.transport.endpoints import Endpoints
from houchu.transport.messages import AbortRequest, ActorDown, ActorUp, Shutdown

Accepts = AbortRequest | Shutdown | ActorDown | ActorUp
_runs = itertools.count()


class Recording:
    """A link to the peer that writes down each reconnect."""

    def __init__(self, log: list[tuple[str, str]], peer: str) -> None:
        self.log, self.peer = log, peer

    def reconnect(self) -> None:
        self.log.append(("reconnect", self.peer))


class Probe(ActorBase[Accepts]):
    """Writes down every hook the base calls, in order."""

    name = "probe"

    def __init__(self, ctx: zmq.asyncio.Context, endpoints: Endpoints) -> None:
        super().__init__(ctx, endpoints, Accepts)
        self.log: list[tuple[str, str]] = []
        self.to_peer = self.peers.outbox("peer")
        self.peers.track("peer", Recording(self.log, "peer"))
        self.handled = asyncio.Event()
        self.down = asyncio.Event()

    async def handle(self, msg: Accepts) -> None:
        assert isinstance(msg, AbortRequest)
        self.log.append(("handle", msg.rid))
        self.handled.set()

    async def on_peer_down(self, name: str) -> None:
        self.log.append(("down", name))
        self.down.set()

    async def on_peer_up(self, name: str) -> None:
        self.log.append(("up", name))

    async def on_shutdown(self) -> None:
        self.log.append(("shutdown", ""))


def _endpoints() -> Endpoints:
    run = next(_runs)
    return Endpoints({n: f"inproc://actor-base-{run}-{n}" for n in ("probe", "peer")})


async def test_actor_down_handles_what_is_queued_then_reconnects_and_shutdown_closes():
    ctx = zmq.asyncio.Context()
    ep = _endpoints()
    actor = Probe(ctx, ep)
    out = Outbox(ctx, ep["probe"])
    try:
        # queued before the loop runs: the dead peer's last messages follow its ActorDown
        for m in (ActorDown(name="peer", generation=1), AbortRequest("a"), AbortRequest("b")):
            await out.send(m)
        assert await actor.inbox.poll(5)
        run = asyncio.create_task(actor.run())
        await asyncio.wait_for(actor.down.wait(), 5)
        await out.send(ActorUp(name="peer", generation=1))
        await out.send(AbortRequest("c"))
        await out.send(Shutdown("test"))
        await asyncio.wait_for(run, 5)
        assert actor.log == [
            ("handle", "a"),
            ("handle", "b"),
            ("reconnect", "peer"),
            ("down", "peer"),
            ("up", "peer"),
            ("handle", "c"),
            ("shutdown", ""),
        ]
        await actor.close()
        await actor.close()  # once: a second call does nothing
        with pytest.raises(zmq.ZMQError):  # the inbox's socket is closed
            actor.inbox.recv_nowait()
        with pytest.raises(zmq.ZMQError):  # and so is the outbox its peers made
            await actor.to_peer.send(AbortRequest("late"))
    finally:
        out.close()
        await actor.close()
        ctx.destroy(linger=0)


async def test_a_shutdown_queued_behind_actor_down_stops_without_reconnecting():
    ctx = zmq.asyncio.Context()
    ep = _endpoints()
    actor = Probe(ctx, ep)
    out = Outbox(ctx, ep["probe"])
    try:
        for m in (ActorDown(name="peer", generation=1), AbortRequest("a"), Shutdown()):
            await out.send(m)
        assert await actor.inbox.poll(5)
        await asyncio.wait_for(actor.run(), 5)
        assert actor.log == [("handle", "a"), ("shutdown", "")]
    finally:
        out.close()
        await actor.close()
        ctx.destroy(linger=0)


async def test_an_undecodable_frame_is_logged_and_skipped(capsys):
    ctx = zmq.asyncio.Context()
    ep = _endpoints()
    actor = Probe(ctx, ep)
    raw = zmq.Context.shadow(ctx.underlying).socket(zmq.PUSH)
    raw.connect(ep["probe"])
    out = Outbox(ctx, ep["probe"])
    try:
        run = asyncio.create_task(actor.run())
        raw.send(b"\xc1 not msgpack")
        await out.send(AbortRequest("after"))
        await asyncio.wait_for(actor.handled.wait(), 5)
        await out.send(Shutdown())
        await asyncio.wait_for(run, 5)
        assert actor.log == [("handle", "after"), ("shutdown", "")]
        assert "houchu probe: dropped a bad message: inproc://" in capsys.readouterr().out
    finally:
        raw.close(linger=0)
        out.close()
        await actor.close()
        ctx.destroy(linger=0)


class Timed(Probe):
    """Waits on a timer as well as on the inbox."""

    def __init__(self, ctx: zmq.asyncio.Context, endpoints: Endpoints) -> None:
        super().__init__(ctx, endpoints)
        self.quiet = asyncio.Event()
        self.after = 0

    def wake_in(self) -> float | None:
        return None if self.quiet.is_set() else 0.01

    async def on_quiet(self) -> None:
        self.quiet.set()

    async def after_messages(self) -> None:
        self.after += 1


async def test_the_timer_wakes_the_loop_and_after_messages_follows_each_message():
    ctx = zmq.asyncio.Context()
    ep = _endpoints()
    actor = Timed(ctx, ep)
    out = Outbox(ctx, ep["probe"])
    try:
        run = asyncio.create_task(actor.run())
        await asyncio.wait_for(actor.quiet.wait(), 5)  # no message: the timer fired
        await out.send(AbortRequest("a"))
        await out.send(Shutdown())
        await asyncio.wait_for(run, 5)
        assert actor.log == [("handle", "a"), ("shutdown", "")]
        assert actor.after == 1  # after "a", not after the Shutdown
    finally:
        out.close()
        await actor.close()
        ctx.destroy(linger=0)


async def test_a_vital_task_that_fails_ends_the_loop_with_its_error():
    ctx = zmq.asyncio.Context()
    actor = Probe(ctx, _endpoints())
    failed = asyncio.Event()

    async def failing() -> None:
        await failed.wait()
        raise RuntimeError("the reporter broke")

    try:
        side = actor.spawn(asyncio.Event().wait())  # not vital: cancelled by close
        actor.spawn(failing(), vital=True)
        run = asyncio.create_task(actor.run())
        failed.set()
        with pytest.raises(RuntimeError, match="the reporter broke"):
            await asyncio.wait_for(run, 5)
        await actor.close()
        with pytest.raises(asyncio.CancelledError):
            await side
    finally:
        await actor.close()
        ctx.destroy(linger=0)
