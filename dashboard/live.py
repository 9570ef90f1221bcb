"""The dashboard's live feed: ``GET /dashboard/ws`` pushes a snapshot every second.

Protocol (JSON text frames):

- client -> server, any time: ``{"type": "subscribe", "window": 300 | "all", "limit": 40}``
  (ledger window in seconds, number of requests on the timeline);
- server -> client: ``{"type": "snapshot", "live": ..., "requests": [...], "ledger": ...,
  "latest_bench_id": ...}`` every ``PUSH_INTERVAL_S`` seconds, or ``{"type": "error",
  "error": {...}}`` when a subscription is invalid or the database cannot answer (the
  socket stays open and pushing resumes).

Snapshots are computed once per interval for each distinct subscription and shared by
all the sockets that asked for it.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from houchu.api.errors import ApiError
from houchu.dashboard.live_data import parse_window, snapshot
from houchu.storage.requests_view import MAX_LIMIT

log = logging.getLogger(__name__)

PUSH_INTERVAL_S = 1.0
DEFAULT_LIMIT = 40


@dataclass
class SnapshotCache:
    """Snapshots by (window, limit), reused for ``ttl_s`` seconds."""

    ttl_s: float = PUSH_INTERVAL_S / 2
    _entries: dict[tuple[float | None, int], tuple[float, asyncio.Future]] = field(
        default_factory=dict
    )

    async def get(self, app: web.Application, window: float | None, limit: int) -> dict:
        """The snapshot for (window, limit), computed at most once per ``ttl_s``."""
        key = (window, limit)
        now = time.monotonic()
        hit = self._entries.get(key)
        if hit is not None and now - hit[0] < self.ttl_s:
            return await asyncio.shield(hit[1])
        fut = asyncio.ensure_future(snapshot(app, window, limit))
        self._entries = {k: v for k, v in self._entries.items() if now - v[0] < self.ttl_s}
        self._entries[key] = (now, fut)
        return await asyncio.shield(fut)


CACHE_KEY: web.AppKey[SnapshotCache] = web.AppKey("houchu_dashboard_snapshots", SnapshotCache)


def add_routes(app: web.Application) -> None:
    """Register ``GET /dashboard/ws``."""
    app[CACHE_KEY] = SnapshotCache()
    app.router.add_get("/dashboard/ws", live_feed)


@dataclass
class _Subscription:
    window: float | None = 300.0
    limit: int = DEFAULT_LIMIT
    changed: asyncio.Event = field(default_factory=asyncio.Event)

    def update(self, frame: Any) -> None:
        """Apply a subscribe frame. Raises ApiError (400) if it is invalid."""
        if not isinstance(frame, dict) or frame.get("type") != "subscribe":
            raise ApiError('expected {"type": "subscribe", "window": ..., "limit": ...}')
        if "window" in frame:
            w = frame["window"]
            self.window = parse_window(None if w is None else str(w))
        if "limit" in frame:
            n = frame["limit"]
            if not isinstance(n, int) or isinstance(n, bool) or not 1 <= n <= MAX_LIMIT:
                raise ApiError(f"limit must be an integer in [1, {MAX_LIMIT}]", param="limit")
            self.limit = n
        self.changed.set()


async def live_feed(request: web.Request) -> web.WebSocketResponse:
    """``GET /dashboard/ws``: push snapshots until the client goes away."""
    ws = web.WebSocketResponse(heartbeat=30.0)
    await ws.prepare(request)
    sub = _Subscription()
    pusher = asyncio.create_task(_push(request.app, ws, sub))
    try:
        async for msg in ws:
            if msg.type != WSMsgType.TEXT:
                continue
            try:
                sub.update(json.loads(msg.data))
            except ValueError:
                await _send_error(ws, ApiError("frames must be JSON objects"))
            except ApiError as e:
                await _send_error(ws, e)
    finally:
        pusher.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pusher
    return ws


async def _send_error(ws: web.WebSocketResponse, e: ApiError) -> None:
    with contextlib.suppress(ConnectionError, RuntimeError):
        await ws.send_json({"type": "error", **e.body()})


async def _push(app: web.Application, ws: web.WebSocketResponse, sub: _Subscription) -> None:
    cache = app[CACHE_KEY]
    while not ws.closed:
        sub.changed.clear()
        try:
            snap = await cache.get(app, sub.window, sub.limit)
            await ws.send_str(msgspec.json.encode(snap).decode())  # NaN -> null
        except ApiError as e:
            await _send_error(ws, e)
        except (ConnectionError, RuntimeError):
            return  # the socket closed under us
        except Exception:
            log.exception("dashboard snapshot failed")
            await _send_error(ws, ApiError("snapshot failed", status=500, code="internal_error"))
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(sub.changed.wait(), PUSH_INTERVAL_S)
