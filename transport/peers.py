"""An actor's links to its peers, by peer name, so that they follow a peer's restart.

An actor process sends to its peers through ``Outbox``es (and telemetry to the recorder
through a ``Telemetry`` emitter). When the launcher announces that a peer died
(``ActorDown``), the actor calls ``Peers.reconnect(name)``: every link to that peer drops
what was still queued for the dead process and connects afresh to the same address, so
nothing meant for the dead process reaches its replacement, and what is sent from now on
waits for the replacement to bind.

Before that, the actor handles whatever is already queued in its inbox (``drain``): the
dead process's last messages were sent before the launcher noticed the death, so they are
applied before the actor drops what it held for that peer, never after.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any, Protocol, TypeVar

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

    def close(self) -> None:
        """Close the outboxes made by ``outbox`` (tracked links belong to their owners)."""
        for out in self._outboxes:
            out.close()
        self._outboxes.clear()


async def drain(inbox: Inbox[Any], handle: Callable[[Any], Awaitable[bool]], owner: str) -> bool:
    """Handle every message already queued in ``inbox`` with ``handle`` (which returns
    False for a ``Shutdown``). Returns False if one of them was a ``Shutdown`` (the rest
    stay queued). Undecodable frames are logged and skipped."""
    while True:
        try:
            msg = inbox.recv_nowait()
        except BadMessage as e:
            print(f"houchu {owner}: dropped a bad message: {e}", flush=True)
            continue
        if msg is None:
            return True
        if not await handle(msg):
            return False
