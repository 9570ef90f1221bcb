"""The recorder actor: receives every actor's telemetry and writes it to the database.

Inbox: ``TelemetryBatch | Shutdown``. The loop only decodes and queues; a writer thread
(``houchu.storage.writer``) does the database work in batches, so a slow database never
slows this loop, and what it cannot keep up with is dropped and counted. Nothing the
serving path waits for passes through here.
"""

from __future__ import annotations

import asyncio
import time

import zmq.asyncio

from houchu.options.serve_config import ServeConfig
from houchu.storage.retention import Retention
from houchu.storage.writer import TelemetryWriter
from houchu.transport.actor_base import ActorBase
from houchu.transport.messages import ActorDown, ActorUp, Shutdown
from houchu.transport.peers import receive
from houchu.transport.telemetry import TelemetryBatch

RecorderInbox = TelemetryBatch | Shutdown | ActorDown | ActorUp  # peers' restarts: no news here

#: Seconds the recorder keeps receiving after Shutdown (the other actors' last flushes).
DRAIN_S = 0.5


def retention_of(config: ServeConfig) -> Retention:
    """The retention policy of ``config.telemetry`` (requests kept, days kept; 0 or None
    keeps all).

    Raises ValueError if a bound is negative.
    """
    requests = config.telemetry.retention_requests or None
    days = config.telemetry.retention_days or None
    return Retention(
        max_requests=requests,
        max_age_s=None if days is None else days * 86400.0,
        max_steps=None if requests is None else 50 * requests,
    )


class RecorderActor(ActorBase[RecorderInbox]):
    """Owns the database writer; one inbox of telemetry batches from every actor.

    Args:
        ctx: the process's asyncio ZeroMQ context.
        config: serving configuration (``db_url``, retention).
        max_pending: records queued for the database before batches are dropped.
    """

    name = "recorder"

    def __init__(
        self, ctx: zmq.asyncio.Context, config: ServeConfig, max_pending: int = 200_000
    ) -> None:
        super().__init__(ctx, config.endpoints, RecorderInbox)
        self.config = config
        self.max_pending = max_pending
        self.writer: TelemetryWriter | None = None

    async def start(self) -> str:
        """Open and migrate the database, start the writer thread.

        Raises:
            houchu.storage.db.DatabaseUrlError: a bad ``db_url``.
            sqlalchemy.exc.SQLAlchemyError: the database cannot be opened or migrated.
        """
        from houchu.storage.db import head_revision, open_db, redact, resolve_url

        url = resolve_url(self.config.telemetry.db_url)
        engine = await asyncio.to_thread(open_db, url)
        self.writer = TelemetryWriter(
            engine, retention_of(self.config), max_pending=self.max_pending
        )
        self.writer.start()
        return f"database {redact(url)} (schema {head_revision()})"

    async def handle(self, msg: RecorderInbox) -> None:
        """Queue a batch for the writer."""
        if isinstance(msg, TelemetryBatch):
            self.writer.submit(msg)

    async def on_shutdown(self) -> None:
        """Take the final flushes of the other actors, stopping too."""
        await self._drain(DRAIN_S)

    async def _drain(self, seconds: float) -> None:
        """Take what arrives in the next ``seconds`` (final flushes of stopping actors)."""
        deadline = time.monotonic() + seconds
        while (left := deadline - time.monotonic()) > 0:
            msg = await receive(self.inbox, self.name, left)
            if msg is None:
                return
            if isinstance(msg, TelemetryBatch):
                self.writer.submit(msg)

    async def on_close(self) -> None:
        """Write what is queued (up to 10 s), stop the writer."""
        if self.writer is not None:
            await asyncio.to_thread(self.writer.close, 10.0)
            self.writer.engine.dispose()
