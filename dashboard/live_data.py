"""The dashboard's data, assembled from the database and ``engine.stats()``.

The gateway holds no engine state of its own: every number here is queried when asked
for, from the recorder's database (through ``DashboardStore``) or from the scheduler's
counters.
"""

from __future__ import annotations

import asyncio
import logging
import math
from typing import Any

from aiohttp import web

from houchu.api.errors import ApiError
from houchu.api.state import ENGINE_KEY
from houchu.dashboard.lever_catalog import ledger_by_verb
from houchu.dashboard.store import DashboardStore
from houchu.storage.ledger_view import MAX_WINDOW_S

log = logging.getLogger(__name__)

STORE_KEY: web.AppKey[DashboardStore] = web.AppKey("houchu_dashboard_store", DashboardStore)
#: Longest wait for the engine's counters (seconds) before live numbers go without them.
ENGINE_STATS_TIMEOUT_S = 2.0
#: KV tiers the live view reports when the engine's counters name them.
TIERS = ("device", "host", "ssd")


def store_of(app: web.Application) -> DashboardStore:
    """The app's database handle. Raises ApiError (503) when it has none."""
    store = app.get(STORE_KEY)
    if store is None:
        raise ApiError("the dashboard has no database", status=503, code="no_database")
    return store


def parse_window(raw: str | None) -> float | None:
    """A ledger window in seconds (None: all-time). Raises ApiError (400) if invalid."""
    if raw is None or raw in ("", "all"):
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ApiError(
            f"window must be a number of seconds or 'all', got {raw!r}", param="window"
        ) from None
    if not math.isfinite(v) or not 0 < v <= MAX_WINDOW_S:
        raise ApiError(
            f"window must be in (0, {MAX_WINDOW_S:.0f}] seconds, got {raw!r}", param="window"
        )
    return v


async def engine_stats(app: web.Application) -> tuple[dict[str, Any] | None, str | None]:
    """The engine's counters, or (None, why) when it does not answer in time."""
    try:
        stats = await asyncio.wait_for(app[ENGINE_KEY].stats(), ENGINE_STATS_TIMEOUT_S)
        return dict(stats), None
    except asyncio.TimeoutError:
        return None, "engine did not answer"
    except Exception as e:  # EngineError, or a closed socket at shutdown
        return None, getattr(e, "message", None) or str(e) or type(e).__name__


def kv_tiers(stats: dict[str, Any] | None) -> list[dict[str, Any]]:
    """KV pages per tier: device from ``num_pages_*``; host and SSD from
    ``{tier}_pages_total`` / ``_used`` / ``_stored`` and ``{tier}_bytes`` /
    ``{tier}_capacity_bytes`` when the engine reports them. Missing numbers are None."""
    if not stats:
        return []

    def num(key: str) -> float | int | None:
        v = stats.get(key)
        return v if isinstance(v, (int, float)) and not isinstance(v, bool) else None

    out = []
    for tier in TIERS:
        p = "num_pages_" if tier == "device" else f"{tier}_pages_"
        total, used, stored = num(p + "total"), num(p + "used"), num(p + "stored")
        if total is None and used is None and stored is None:
            continue
        entry = {
            "tier": tier,
            "total": total,
            "used": used if used is not None else stored,
            "cached": num(p + "cached") or 0,
            "free": num(p + "free"),
        }
        if tier != "device":
            entry["bytes"] = num(f"{tier}_bytes")
            entry["capacity_bytes"] = num(f"{tier}_capacity_bytes")
        out.append(entry)
    return out


async def live_numbers(app: web.Application) -> dict[str, Any]:
    """Live state: engine counters (may be None), KV tiers, and the database's recent
    rates, request stats, series and recorder counters. The rates' ``round_trip_ms`` is
    the scheduler's (its stats; None when it does not answer or ran no step lately).
    Raises ApiError (503) when the database cannot answer."""
    store = store_of(app)
    (stats, why), db = await asyncio.gather(engine_stats(app), store.live())
    db["rates"]["round_trip_ms"] = (stats or {}).get("round_trip_ms")
    return {**db, "engine": stats, "engine_error": why, "kv": kv_tiers(stats)}


async def snapshot(app: web.Application, window_s: float | None, limit: int) -> dict[str, Any]:
    """What one live push carries: live numbers, recent requests and the ledger."""
    store = store_of(app)
    live, requests, ledger, runs = await asyncio.gather(
        live_numbers(app), store.requests(limit=limit), store.ledger(window_s), store.bench_runs(1)
    )
    return {
        "type": "snapshot",
        "live": live,
        "requests": requests,
        "ledger": {"window_s": window_s, "verbs": ledger_by_verb(ledger)},
        "latest_bench_id": runs[0]["id"] if runs else None,
    }
