"""The recorder's database writer: a thread that drains a bounded queue of batches.

``submit`` never blocks and never touches the database: it appends the batch to the
queue, or, when the records already waiting reach ``max_pending`` (the database fell
behind), drops it and counts the dropped records. The thread takes everything queued,
writes it in one transaction, and prunes by the retention policy now and then. A failed
transaction drops its records (counted) and the writer carries on.

Counters kept in the ``counters`` table: ``records_written``, ``dropped_by_actors``
(records an actor's emitter could not buffer or send), ``dropped_by_recorder`` (queue
full) and ``dropped_by_errors`` (database errors), ``write_errors``, ``rows_pruned``.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from dataclasses import dataclass

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session

from houchu.storage.ingest import add_counters, ingest
from houchu.storage.retention import Retention, prune
from houchu.transport.telemetry import TelemetryBatch

log = logging.getLogger(__name__)


def batch_size(batch: TelemetryBatch) -> int:
    """Records in ``batch``."""
    return len(batch.events) + len(batch.steps) + len(batch.levers)


@dataclass
class WriterStats:
    """What the writer did since it started (records, unless named otherwise)."""

    written: int = 0
    dropped_by_actors: int = 0
    dropped_by_recorder: int = 0
    dropped_by_errors: int = 0
    write_errors: int = 0
    transactions: int = 0
    rows_pruned: int = 0


class TelemetryWriter:
    """Writes telemetry batches to the database from a background thread.

    Args:
        engine: the database (already migrated).
        retention: what to keep; None keeps everything.
        max_pending: records waiting to be written before new batches are dropped.
        max_per_transaction: records written per transaction at most.
    """

    def __init__(
        self,
        engine: Engine,
        retention: Retention | None = None,
        max_pending: int = 200_000,
        max_per_transaction: int = 20_000,
    ) -> None:
        if max_pending < 1 or max_per_transaction < 1:
            raise ValueError("max_pending and max_per_transaction must be positive")
        self.engine = engine
        self.retention = retention
        self.max_pending = max_pending
        self.max_per_transaction = max_per_transaction
        self.stats = WriterStats()
        self._queue: deque[TelemetryBatch] = deque()
        self._pending = 0
        self._cond = threading.Condition()
        self._closing = False
        self._unreported: dict[str, float] = {}
        self._thread = threading.Thread(target=self._loop, name="houchu-db-writer", daemon=True)
        self._last_prune = 0.0
        self._busy = False  # the thread holds taken batches not yet written
        self._failures = 0  # consecutive failed transactions

    def start(self) -> None:
        """Start the writer thread."""
        self._thread.start()

    @property
    def pending(self) -> int:
        """Records queued and not yet written."""
        return self._pending

    def submit(self, batch: TelemetryBatch) -> bool:
        """Queue ``batch`` for writing; False if it was dropped (the queue is full).

        Never blocks on the database (only on a lock held for a few list operations).
        """
        n = batch_size(batch)
        with self._cond:
            self._count("dropped_by_actors", batch.num_dropped)
            if self._closing or self._pending + n > self.max_pending:
                self._count("dropped_by_recorder", n)
                return False
            self._queue.append(batch)
            self._pending += n
            self._cond.notify()
        return True

    def _count(self, name: str, n: int) -> None:
        """Add to a counter (memory now, database with the next transaction)."""
        if n:
            setattr(self.stats, name, getattr(self.stats, name) + n)
            self._unreported[name] = self._unreported.get(name, 0) + n

    def flush(self, timeout_s: float = 10.0) -> bool:
        """Wait until everything queued so far is written; False on timeout."""
        deadline = time.monotonic() + timeout_s
        with self._cond:
            while self._queue or self._busy:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._cond.wait(min(left, 0.05))
        return True

    def close(self, timeout_s: float = 10.0) -> None:
        """Write what is queued (up to ``timeout_s`` seconds), then stop the thread."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout_s)

    def _take(self) -> tuple[list[TelemetryBatch], dict[str, float]] | None:
        """Wait for work; None when closing with nothing left."""
        with self._cond:
            while not self._queue and not self._closing and not self._unreported:
                self._cond.wait(self._wait_s())
                if self._prune_due():
                    return [], {}
            if not self._queue and not self._unreported:
                return None
            batches, n = [], 0
            while self._queue and (not batches or n < self.max_per_transaction):
                b = self._queue.popleft()
                batches.append(b)
                n += batch_size(b)
            self._pending -= n
            counters, self._unreported = self._unreported, {}
            self._busy = True
            return batches, counters

    def _wait_s(self) -> float:
        return self.retention.interval_s if self.retention is not None else 1.0

    def _prune_due(self) -> bool:
        return (
            self.retention is not None
            and time.monotonic() - self._last_prune >= self.retention.interval_s
        )

    def _loop(self) -> None:
        while (work := self._take()) is not None:
            batches, counters = work
            try:
                if batches or counters:
                    self._write(batches, counters)
                if self._prune_due():
                    self._prune()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()

    def _write(self, batches: list[TelemetryBatch], counters: dict[str, float]) -> None:
        n = sum(batch_size(b) for b in batches)
        try:
            with Session(self.engine) as session, session.begin():
                self.write_batches(session, batches)
                add_counters(session, {**counters, "records_written": n})
        except SQLAlchemyError as e:
            with self._cond:
                self._failures += 1
                self._count("write_errors", 1)
                self._count("dropped_by_errors", n)
                for name, v in counters.items():  # report them with the next transaction
                    self._unreported[name] = self._unreported.get(name, 0) + v
            if self.stats.write_errors <= 3 or self.stats.write_errors % 100 == 0:
                log.warning("telemetry write failed (%d records dropped): %s", n, e)
            time.sleep(min(0.1 * 2**self._failures, 5.0))  # let the database recover
            return
        self._failures = 0
        self.stats.written += n
        self.stats.transactions += 1

    def write_batches(self, session: Session, batches: list[TelemetryBatch]) -> None:
        """Write ``batches`` in ``session`` (a hook for tests that slow the database)."""
        ingest(session, batches)

    def _prune(self) -> None:
        self._last_prune = time.monotonic()
        try:
            with Session(self.engine) as session, session.begin():
                n = prune(session, self.retention)
                add_counters(session, {"rows_pruned": n})
            self.stats.rows_pruned += n
        except SQLAlchemyError as e:
            log.warning("telemetry retention prune failed: %s", e)
