"""An actor's links to its peers, by peer name, so that they follow a peer's restart.

An actor process sends to its peers through ``Outbox``es (and telemetry to the recorder
through a ``Telemetry`` emitter). When the launcher announces that a peer died
(``ActorDown``), the actor calls ``Peers.reconnect(name)``: every link to that peer drops
what was still queued for the dead process and connects afresh to the same address, so
nothing meant for the dead process reaches its replacement, and what is sent from now on
waits for the replacement to bind.

Before that, the actor handles whatever is already queued in its inbox (``drain``): the
dead process's last messages were sent before the launcher noticed the death, so they are
applied before the actor drops what it held for that peer, never after
(``Peers.replaced`` does both).

Every actor's receive loop is ``houchu.transport.actor_base.ActorBase``'s, which calls
``Peers.replaced`` on ``ActorDown``; ``receive`` (a message, or None after a timeout) serves
the waits outside it (start-up, the launcher). An undecodable frame is logged
(``dropped``), the same way everywhere, and skipped.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TextIO, TypeVar

import zmq.asyncio

from houchu.transport.channel import BadMessage, Inbox, Outbox
from houchu.transport.endpoints import Endpoints


class Link(Protocol):
    """Anything that sends to one peer and can reconnect to it."""

    def reconnect(self) -> None:
        """Drop what is queued for the peer's old process; connect to the address again."""
        ...


L = TypeVar("L", bound=Link)


class Peers:
    """The outboxes and other links of one actor, grouped by the peer they lead to.

    Args:
        ctx: the process's asyncio ZeroMQ context.
        endpoints: every actor's inbox address.
    """

    def __init__(self, ctx: zmq.asyncio.Context, endpoints: Endpoints) -> None:
        self._ctx = ctx
        self._endpoints = endpoints
        self._links: dict[str, list[Link]] = {}
        self._outboxes: list[Outbox] = []

    def outbox(self, name: str) -> Outbox:
        """A new outbox to actor ``name``'s inbox, reconnected when ``name`` restarts.

        Raises:
            KeyError: ``name`` is not an actor of ``endpoints``.
        """
        out = Outbox(self._ctx, self._endpoints[name])
        self._outboxes.append(out)
        return self.track(name, out)

    def track(self, name: str, link: L) -> L:
        """Reconnect ``link`` whenever ``name`` restarts; returns ``link``."""
        self._links.setdefault(name, []).append(link)
        return link

    def reconnect(self, name: str) -> int:
        """Actor ``name`` was replaced: reconnect every link to it. Returns how many."""
        links = self._links.get(name, [])
        for link in links:
            link.reconnect()
        return len(links)

    async def replaced(
        self, name: str, inbox: Inbox[Any], handle: Callable[[Any], Awaitable[bool]], owner: str
    ) -> bool:
        """Actor ``name`` was replaced (``ActorDown``): handle what is already queued in
        ``inbox`` (``drain``: the dead process's last messages come first), then
        reconnect every link to ``name``. False if a ``Shutdown`` was among the queued
        messages (then nothing is reconnected: the actor stops)."""
        if not await drain(inbox, handle, owner):
            return False
        self.reconnect(name)
        return True

    def close(self) -> None:
        """Close the outboxes made by ``outbox`` (tracked links belong to their owners)."""
        for out in self._outboxes:
            out.close()
        self._outboxes.clear()


#: undecodable frames so far, per owner (``dropped``)
_num_dropped: dict[str, int] = {}


def dropped(owner: str, e: BadMessage, file: TextIO | None = None) -> None:
    """Log an undecodable frame: ``houchu OWNER: dropped a bad message: …`` (``owner``
    "" for the launcher: ``houchu: …``). A flood is not echoed frame by frame: the first
    3 of an owner are logged, then every 1000th with the count so far."""
    n = _num_dropped[owner] = _num_dropped.get(owner, 0) + 1
    if n > 3 and n % 1000:
        return
    who = f"houchu {owner}" if owner else "houchu"
    total = f" ({n} so far)" if n > 3 else ""
    print(f"{who}: dropped a bad message{total}: {e}", file=file or sys.stdout, flush=True)


async def receive(
    inbox: Inbox[Any], owner: str, timeout_s: float | None = None, log: TextIO | None = None
) -> Any:
    """The next message of ``inbox`` that decodes (undecodable frames are logged with
    ``dropped``, to ``log`` or stdout, and skipped); with ``timeout_s``, None when
    nothing decodable arrived in that many seconds."""
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    while True:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0 or not await inbox.poll(left):
                return None
        try:
            return await inbox.recv()
        except BadMessage as e:
            dropped(owner, e, log)


async def drain(inbox: Inbox[Any], handle: Callable[[Any], Awaitable[bool]], owner: str) -> bool:
    """Handle every message already queued in ``inbox`` with ``handle`` (which returns
    False for a ``Shutdown``). Returns False if one of them was a ``Shutdown`` (the rest
    stay queued). Undecodable frames are logged and skipped."""
    while True:
        try:
            msg = inbox.recv_nowait()
        except BadMessage as e:
            dropped(owner, e)
            continue
        if msg is None:
            return True
        if not await handle(msg):
            return False
