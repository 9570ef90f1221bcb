"""The actor base: one actor's inbox, its links to its peers and its receive loop, written
once for every actor (and for the gateway's engine client, which owns the gateway's inbox).

An actor subclasses ``ActorBase``, names itself (``name``: its inbox in the endpoints, its
name in the log) and writes ``handle`` for the messages of its own. The base answers the
lifecycle messages the launcher sends every actor (``houchu.actors.supervisor``):

- ``ActorDown(name)``: a peer died. What is already queued in the inbox (the dead
  process's last messages) is handled first, then every link to that peer reconnects
  (``Peers.replaced``), then ``on_peer_down(name)`` drops what the actor held for it.
- ``ActorUp(name)``: the peer's replacement is ready: ``on_peer_up(name)``.
- ``Shutdown``: ``on_shutdown`` (a last flush), then ``run`` returns.

An undecodable frame is logged (``houchu.transport.peers.dropped``) and skipped. An actor
that waits on a timer as well as on its inbox says how long it may wait (``wake_in``):
when that passes with no message, ``on_quiet`` runs. After each message (with
``drain_queued``, after each burst of queued messages) ``after_messages`` runs. Tasks of
the actor's own (``spawn``) are cancelled by ``close``; a ``vital`` one that ends, ends
``run`` with its error.

Start-up, the ready report, the heartbeat and the call to ``close`` (in a ``finally``) are
the actor process's (``houchu.actors.runtime``).
"""

from __future__ import annotations

import asyncio
from abc import ABC, abstractmethod
from collections.abc import Coroutine
from typing import Any, ClassVar, Generic, TypeVar

import zmq.asyncio

from houchu.transport.actor_messages import ActorDown, ActorUp, Shutdown
from houchu.transport.channel import BadMessage, Inbox
from houchu.transport.endpoints import Endpoints
from houchu.transport.peers import Peers, drain, dropped
from houchu.transport.telemetry import Telemetry

M = TypeVar("M")


class ActorBase(ABC, Generic[M]):
    """One actor's inbox (``inbox``), its links to its peers (``peers``), its optional
    telemetry emitter (``telemetry_to``) and its tasks (``spawn``), with the receive loop
    that serves them (``run``) and the ``close`` that closes them.

    Subclasses set ``name`` and override ``handle``; the other hooks do nothing unless
    overridden.

    Args:
        ctx: the process's asyncio ZeroMQ context.
        endpoints: every actor's inbox address; the inbox binds ``endpoints[name]``.
        accepts: the message type, or union of types, the inbox decodes (with
            ``Shutdown``, ``ActorDown`` and ``ActorUp`` among them).
        peers: the actor's links, when made before it (None: made here).

    Raises:
        KeyError: ``name`` is not an actor of ``endpoints``.
        zmq.ZMQError: the inbox's address cannot be bound.
        houchu.transport.security.InsecureTransport: a tcp:// inbox without CURVE keys.
    """

    #: the actor's name: its inbox in ``endpoints``, and ``houchu NAME:`` in the log
    name: ClassVar[str] = ""
    #: handle every message already queued before ``after_messages`` runs (once per
    #: burst: the scheduler plans after it has taken everything that arrived)
    drain_queued: ClassVar[bool] = False

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        endpoints: Endpoints,
        accepts: Any,
        peers: Peers | None = None,
    ) -> None:
        self.inbox: Inbox[M] = Inbox(ctx, endpoints[self.name], accepts)
        self.peers = peers if peers is not None else Peers(ctx, endpoints)
        self._ctx = ctx
        self._telemetry: Telemetry | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._vital: list[asyncio.Task[None]] = []
        self._closed = False

    # ------------------------------------------------------------ what subclasses write

    @abstractmethod
    async def handle(self, msg: M) -> None:
        """Act on one message of the actor's own (not a lifecycle message)."""

    async def on_peer_down(self, name: str) -> None:
        """Peer ``name`` died; what was queued is handled and its links reconnected:
        drop, fail or abort what the actor held for it."""

    async def on_peer_up(self, name: str) -> None:
        """Peer ``name``'s replacement is ready."""

    async def on_shutdown(self) -> None:
        """A ``Shutdown`` came: the last work before ``run`` returns."""

    def wake_in(self) -> float | None:
        """Seconds the loop may wait for a message before ``on_quiet`` (None: no timer
        is waited on; asked before each wait)."""
        return None

    async def on_quiet(self) -> None:
        """``wake_in`` seconds passed with no message."""

    async def after_messages(self) -> None:
        """A message (with ``drain_queued``, every queued message) was handled."""

    async def on_close(self) -> None:
        """Close what the actor owns besides its inbox, links and tasks (called last by
        ``close``)."""

    # ------------------------------------------------------------ what the base owns

    def telemetry_to(self, address: str | None) -> Telemetry:
        """This actor's telemetry emitter to the recorder's inbox ``address`` (None:
        disabled): it follows the recorder's restarts, and ``close`` closes it (its last
        flush) before the sockets."""
        self._telemetry = self.peers.track("recorder", Telemetry(self._ctx, address, self.name))
        return self._telemetry

    def spawn(self, coro: Coroutine[Any, Any, None], *, vital: bool = False) -> asyncio.Task[None]:
        """Run ``coro`` as a task of this actor (call from the running event loop);
        ``close`` cancels it. A ``vital`` task that ends ends ``run``, which raises what
        the task raised."""
        task = asyncio.create_task(coro)
        self._tasks.append(task)
        if vital:
            self._vital.append(task)
        return task

    async def dispatch(self, msg: Any) -> bool:
        """Act on one message: a lifecycle message here, any other with ``handle``.
        Returns False on ``Shutdown`` (also one queued behind an ``ActorDown``): the
        loop ends."""
        match msg:
            case ActorDown(name=name):
                if not await self.peers.replaced(name, self.inbox, self.dispatch, self.name):
                    return False
                await self.on_peer_down(name)
            case ActorUp(name=name):
                await self.on_peer_up(name)
            case Shutdown():
                await self.on_shutdown()
                return False
            case _:
                await self.handle(msg)
        return True

    async def run(self) -> None:
        """Serve the inbox until a ``Shutdown``.

        Raises:
            Exception: what a handler raised, or what ended a ``vital`` task.
        """
        if not self._vital:
            await self._serve()
            return
        serving = asyncio.create_task(self._serve())
        try:
            await asyncio.wait({serving, *self._vital}, return_when=asyncio.FIRST_COMPLETED)
        except BaseException:  # cancelled: so is the loop
            serving.cancel()
            raise
        for task in self._vital:
            if task.done():
                serving.cancel()
                task.result()  # raises what stopped it
                return
        await serving

    async def _serve(self) -> None:
        """The receive loop: every message to ``dispatch``, the hooks between."""
        while True:
            msg = await self._next()
            if msg is None:
                await self.on_quiet()
                continue
            if not await self.dispatch(msg):
                return
            if self.drain_queued and not await drain(self.inbox, self.dispatch, self.name):
                return
            await self.after_messages()

    async def _next(self) -> M | None:
        """The next message that decodes (undecodable frames are logged and skipped), or
        None when ``wake_in`` seconds passed without one."""
        while True:
            wait = self.wake_in()
            if wait is not None and not await self.inbox.poll(wait):
                return None
            try:
                if wait is None:
                    return await self.inbox.recv()
                msg = self.inbox.recv_nowait()
            except BadMessage as e:
                dropped(self.name, e)
                continue
            if msg is not None:
                return msg

    async def close(self) -> None:
        """Cancel the actor's tasks, close its telemetry (the last flush), its inbox and
        the outboxes its ``peers`` made, then ``on_close``. Once: a second call does
        nothing."""
        if self._closed:
            return
        self._closed = True
        for task in self._tasks:
            task.cancel()
        if self._telemetry is not None:
            await self._telemetry.close()
        self.inbox.close()
        self.peers.close()
        await self.on_close()
