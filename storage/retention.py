"""Bounded retention: keep the newest requests (by count and by age), prune the rest.

A request is kept while it is among the ``max_requests`` newest (by first event) and
younger than ``max_age_s``. Events, steps and lever samples older than the oldest kept
request go too, and so do all the records of a pruned request. Steps are further capped
at ``max_steps`` rows. Benchmark runs, ledger totals and counters are never pruned.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import delete, func, select
from sqlalchemy.orm import Session

from houchu.storage.models import EventRow, LeverRow, RequestRow, StepRow


@dataclass(frozen=True)
class Retention:
    """How much telemetry to keep. None means no bound of that kind.

    Attributes:
        max_requests: requests kept (newest first).
        max_age_s: seconds a record is kept.
        max_steps: step rows kept (newest first).
        interval_s: seconds between two prunes.
    """

    max_requests: int | None = 10_000
    max_age_s: float | None = 7 * 86400.0
    max_steps: int | None = 500_000
    interval_s: float = 30.0

    def __post_init__(self) -> None:
        for name in ("max_requests", "max_age_s", "max_steps"):
            v = getattr(self, name)
            if v is not None and v <= 0:
                raise ValueError(f"retention {name} must be positive or None, got {v}")
        if self.interval_s <= 0:
            raise ValueError(f"retention interval_s must be positive, got {self.interval_s}")


def _nth_newest(session: Session, column, n: int) -> float | None:
    """The value of ``column`` of the n-th newest row (1-based), or None if fewer rows."""
    return session.scalar(select(column).order_by(column.desc()).offset(n - 1).limit(1))


def cutoff(session: Session, retention: Retention, now: float) -> float | None:
    """Seconds since the epoch before which records are pruned, or None (keep all)."""
    cuts = []
    if retention.max_age_s is not None:
        cuts.append(now - retention.max_age_s)
    if retention.max_requests is not None:
        oldest_kept = _nth_newest(session, RequestRow.started_at, retention.max_requests)
        if oldest_kept is not None:
            older = session.scalar(select(func.count()).where(RequestRow.started_at < oldest_kept))
            if older:
                cuts.append(oldest_kept)
    return max(cuts) if cuts else None


def prune(session: Session, retention: Retention, now: float | None = None) -> int:
    """Delete what ``retention`` does not keep; returns the number of rows deleted.

    The caller commits. Raises ``sqlalchemy.exc.SQLAlchemyError`` if the database fails.
    """
    now = time.time() if now is None else now
    deleted = 0
    cut = cutoff(session, retention, now)
    if cut is not None:
        old = select(RequestRow.rid).where(RequestRow.started_at < cut)
        for model in (EventRow, LeverRow):
            deleted += session.execute(delete(model).where(model.rid.in_(old))).rowcount or 0
            deleted += session.execute(delete(model).where(model.t < cut)).rowcount or 0
        deleted += session.execute(delete(StepRow).where(StepRow.t < cut)).rowcount or 0
        deleted += (
            session.execute(delete(RequestRow).where(RequestRow.started_at < cut)).rowcount or 0
        )
    if retention.max_steps is not None:
        last_kept = _nth_newest(session, StepRow.id, retention.max_steps)
        if last_kept is not None:
            deleted += session.execute(delete(StepRow).where(StepRow.id < last_kept)).rowcount or 0
    return deleted
