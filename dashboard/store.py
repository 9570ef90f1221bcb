"""The dashboard's read-only handle on the database, off the event loop.

Every query runs in a small thread pool (``houchu.storage`` functions are synchronous),
so the gateway's event loop never waits on the database. A database that is missing,
not yet migrated (the recorder migrates it at start) or failing raises
``StoreUnavailable``, which the handlers answer with HTTP 503.
"""

from __future__ import annotations

import asyncio
import functools
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any, TypeVar

from sqlalchemy import Engine
from sqlalchemy.exc import SQLAlchemyError

from houchu.api.errors import ApiError
from houchu.storage import bench_runs, expert_load_view, ledger_view, live_view, requests_view
from houchu.storage.db import create_db_engine, resolve_url

T = TypeVar("T")


class StoreUnavailable(ApiError):
    """The database cannot answer now (missing, not migrated yet, or failing): HTTP 503."""

    def __init__(self, message: str) -> None:
        super().__init__(message, status=503, code="database_unavailable")


class DashboardStore:
    """Async queries for the dashboard.

    Args:
        engine: the database (the recorder's); the store only reads it, except
            ``save_bench_run`` which the benchmark API uses.
        max_workers: threads running queries.
    """

    def __init__(self, engine: Engine, max_workers: int = 2) -> None:
        self.engine = engine
        self._pool = ThreadPoolExecutor(max_workers, thread_name_prefix="houchu-dashboard-db")

    @classmethod
    def open(cls, db_url: str | None) -> DashboardStore:
        """A store on ``db_url`` (None: the default database). Raises DatabaseUrlError."""
        return cls(create_db_engine(resolve_url(db_url)))

    async def _run(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(
                self._pool, functools.partial(fn, self.engine, *args, **kwargs)
            )
        except SQLAlchemyError as e:
            reason = str(e.orig) if getattr(e, "orig", None) is not None else str(e)
            raise StoreUnavailable(f"database unavailable: {reason.splitlines()[0]}") from None

    async def requests(
        self, limit: int = 40, since: float | None = None, status: str | None = None
    ) -> list[dict[str, Any]]:
        """Recent requests with timelines (see ``requests_view.recent_requests``)."""
        return await self._run(
            requests_view.recent_requests, time.time(), limit=limit, since=since, status=status
        )

    async def request(self, rid: str) -> dict[str, Any] | None:
        """One request in detail, or None."""
        return await self._run(requests_view.request_detail, rid, time.time())

    async def ledger(self, window_s: float | None) -> list[dict[str, Any]]:
        """Ledger rows, all-time or over the last ``window_s`` seconds."""
        return await self._run(ledger_view.ledger_rows, time.time(), window_s)

    async def counters(self) -> dict[str, float]:
        """The recorder's counters."""
        return await self._run(ledger_view.counters)

    async def live(self, horizon_s: float = 120.0, bucket_s: float = 2.0) -> dict[str, Any]:
        """Recent rates, request stats, series, a MoE model's expert load (None for a
        dense one) and the last steps (``live_view.recent_steps``) from the database."""
        return await self._run(_live, time.time(), horizon_s, bucket_s)

    async def bench_runs(self, limit: int = 100) -> list[dict[str, Any]]:
        """Stored benchmark runs, newest first."""
        return await self._run(bench_runs.list_bench_runs, limit)

    async def bench_run(self, run_id: int) -> dict[str, Any] | None:
        """One benchmark run, or None."""
        return await self._run(bench_runs.get_bench_run, run_id)

    async def save_bench_run(self, name: str, settings: dict, results: dict) -> int:
        """Store a benchmark run; raises BenchRunError for bad input."""
        return await self._run(bench_runs.insert_bench_run, name, settings, results)

    def close(self) -> None:
        """Stop the query threads and close the database connections."""
        self._pool.shutdown(wait=False, cancel_futures=True)
        self.engine.dispose()


def _live(engine: Engine, now: float, horizon_s: float, bucket_s: float) -> dict[str, Any]:
    return {
        "now": now,
        "rates": live_view.recent_rates(engine, now),
        "requests": live_view.request_stats(engine, now),
        "series": live_view.step_series(engine, now, horizon_s, bucket_s),
        "counters": ledger_view.counters(engine),
        "expert_load": expert_load_view.expert_load(engine, now),
        "steps": live_view.recent_steps(engine, now),
    }
