"""The dashboard's pages and JSON API (all read from the database, plus engine.stats()).

Routes (``add_routes``):

- ``GET /dashboard``: the page; ``GET /dashboard/static/{name}``: its scripts and styles,
  and ``plotly.min.js`` served from the installed ``plotly`` package (no CDN).
- ``GET /dashboard/api/requests?limit=40&since=T&status=S``: recent requests with their
  timelines (newest first).
- ``GET /dashboard/api/requests/{rid}``: one request: summary, parameters, timeline,
  events, its own ledger, ``structured`` (a structured-output request's grammar kind and
  mask seconds, else null) (404 if unknown).
- ``GET /dashboard/api/ledger?window=SECONDS``: the lever ledger grouped by verb, all-time
  when ``window`` is absent or ``all``.
- ``GET /dashboard/api/live``: live numbers: engine counters, rates, series.
- ``GET /dashboard/api/bench``, ``GET /dashboard/api/bench/{id}``: benchmark runs;
  ``POST /dashboard/api/bench`` stores one (``{"name", "settings", "results"}``).

Bad parameters get HTTP 400, an unknown id 404, a database that cannot answer 503, all
with the gateway's OpenAI-style error body.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import msgspec
from aiohttp import web

from houchu.api.errors import ApiError, json_response
from houchu.dashboard.lever_catalog import ledger_by_verb
from houchu.dashboard.live_data import (
    STORE_KEY,
    live_numbers,
    parse_window,
    store_of,
)
from houchu.storage.bench_runs import BenchRunError
from houchu.storage.requests_view import MAX_LIMIT, STATUSES

STATIC_DIR = Path(__file__).parent / "static"
#: Files of the page, by name.
STATIC_FILES = {
    "dashboard.css": "text/css",
    "dashboard.js": "application/javascript",
    "timeline.js": "application/javascript",
    "panels.js": "application/javascript",
    "bench.js": "application/javascript",
    "sweeps.js": "application/javascript",
    "format.js": "application/javascript",
}
#: Largest benchmark run body accepted (bytes).
MAX_BENCH_BODY = 16 * 1024 * 1024

__all__ = ["STORE_KEY", "add_routes", "plotly_js_path"]


def plotly_js_path() -> Path:
    """The minified plotly.js shipped inside the installed ``plotly`` wheel.

    Raises:
        FileNotFoundError: the installed plotly has no bundled plotly.min.js.
    """
    import plotly

    path = Path(plotly.__file__).parent / "package_data" / "plotly.min.js"
    if not path.is_file():
        raise FileNotFoundError(f"plotly.min.js not found in the plotly package at {path}")
    return path


def add_routes(app: web.Application) -> None:
    """Register the dashboard page, static files and JSON API."""
    r = app.router
    r.add_get("/dashboard", page)
    r.add_get("/dashboard/", page)
    r.add_get("/dashboard/static/{name}", static)
    r.add_get("/dashboard/api/requests", api_requests)
    r.add_get("/dashboard/api/requests/{rid}", api_request)
    r.add_get("/dashboard/api/ledger", api_ledger)
    r.add_get("/dashboard/api/live", api_live)
    r.add_get("/dashboard/api/bench", api_bench_list)
    r.add_post("/dashboard/api/bench", api_bench_save)
    r.add_get("/dashboard/api/bench/{run_id}", api_bench_run)


async def page(request: web.Request) -> web.FileResponse:
    """``GET /dashboard``: the single-page dashboard."""
    return web.FileResponse(
        STATIC_DIR / "dashboard.html", headers={"Content-Type": "text/html; charset=utf-8"}
    )


async def static(request: web.Request) -> web.FileResponse:
    """``GET /dashboard/static/{name}``: a file of the page, or plotly.min.js."""
    name = request.match_info["name"]
    if name == "plotly.min.js":
        path, ctype = plotly_js_path(), "application/javascript"
        headers = {"Cache-Control": "public, max-age=86400"}
    elif name in STATIC_FILES:
        path, ctype = STATIC_DIR / name, STATIC_FILES[name]
        headers = {"Cache-Control": "no-cache"}
    else:
        raise ApiError(f"no dashboard file {name!r}", status=404, code="not_found")
    return web.FileResponse(path, headers={"Content-Type": ctype, **headers})


def _int_param(request: web.Request, name: str, default: int, lo: int, hi: int) -> int:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return default
    try:
        v = int(raw)
    except ValueError:
        raise ApiError(f"{name} must be an integer, got {raw!r}", param=name) from None
    if not lo <= v <= hi:
        raise ApiError(f"{name} must be in [{lo}, {hi}], got {v}", param=name)
    return v


def _float_param(request: web.Request, name: str) -> float | None:
    raw = request.query.get(name)
    if raw is None or raw == "":
        return None
    try:
        v = float(raw)
    except ValueError:
        raise ApiError(f"{name} must be a number, got {raw!r}", param=name) from None
    if not math.isfinite(v):
        raise ApiError(f"{name} must be finite, got {raw!r}", param=name)
    return v


async def api_requests(request: web.Request) -> web.Response:
    """``GET /dashboard/api/requests``: recent requests with their timelines."""
    limit = _int_param(request, "limit", 40, 1, MAX_LIMIT)
    since = _float_param(request, "since")
    status = request.query.get("status") or None
    if status is not None and status not in STATUSES:
        raise ApiError(
            f"status must be one of {', '.join(STATUSES)}, got {status!r}", param="status"
        )
    rows = await store_of(request.app).requests(limit=limit, since=since, status=status)
    return json_response({"requests": rows})


async def api_request(request: web.Request) -> web.Response:
    """``GET /dashboard/api/requests/{rid}``: one request in detail."""
    rid = request.match_info["rid"]
    if len(rid) > 128:
        raise ApiError("request id is over 128 characters", param="rid")
    detail = await store_of(request.app).request(rid)
    if detail is None:
        raise ApiError(f"no request {rid!r} in the database", status=404, code="not_found")
    return json_response(detail)


async def api_ledger(request: web.Request) -> web.Response:
    """``GET /dashboard/api/ledger?window=SECONDS``: the ledger by verb."""
    window = parse_window(request.query.get("window"))
    rows = await store_of(request.app).ledger(window)
    return json_response({"window_s": window, "verbs": ledger_by_verb(rows)})


async def api_live(request: web.Request) -> web.Response:
    """``GET /dashboard/api/live``: engine counters, recent rates and series."""
    return json_response(await live_numbers(request.app))


async def api_bench_list(request: web.Request) -> web.Response:
    """``GET /dashboard/api/bench``: stored benchmark runs, newest first."""
    limit = _int_param(request, "limit", 100, 1, 1000)
    return json_response({"runs": await store_of(request.app).bench_runs(limit)})


async def api_bench_run(request: web.Request) -> web.Response:
    """``GET /dashboard/api/bench/{run_id}``: one benchmark run."""
    raw = request.match_info["run_id"]
    if not raw.isdigit() or len(raw) > 18:
        raise ApiError(f"run id must be a positive integer, got {raw!r}", param="run_id")
    run = await store_of(request.app).bench_run(int(raw))
    if run is None:
        raise ApiError(f"no benchmark run {raw}", status=404, code="not_found")
    return json_response(run)


class _BenchBody(msgspec.Struct, forbid_unknown_fields=True):
    name: str
    settings: dict[str, Any]
    results: dict[str, Any]


async def api_bench_save(request: web.Request) -> web.Response:
    """``POST /dashboard/api/bench``: store a benchmark run; 201 with its id."""
    body = await request.read()
    if len(body) > MAX_BENCH_BODY:
        raise ApiError("benchmark run body is too large", status=413)
    try:
        run = msgspec.json.decode(body, type=_BenchBody)
    except msgspec.DecodeError as e:
        raise ApiError(f"body must be a JSON object {{name, settings, results}}: {e}") from None
    try:
        run_id = await store_of(request.app).save_bench_run(run.name, run.settings, run.results)
    except BenchRunError as e:
        raise ApiError(str(e)) from None
    return json_response({"id": run_id}, status=201)
