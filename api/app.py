"""The gateway's aiohttp application: client-facing HTTP and WebSocket APIs.

``make_app(engine, model_name=..., runner=...)`` builds the application; ``engine`` is an
``EngineClient`` in production and any ``EngineLike`` in tests, ``runner`` the runner's
limits as its ``RunnerInfo`` tells them (tests give a fixed ``max_context`` instead).
Routes:

- ``POST /v1/completions``, ``POST /v1/chat/completions``, ``GET /v1/models``: the
  OpenAI-compatible API (``openai_api``).
- ``POST /tokenize``, ``POST /detokenize``: vLLM's tokenizer endpoints (``tokenize``).
- ``GET /ws``: the streaming WebSocket API (``ws_api``).
- ``GET /health``: readiness, ``{"status": "ok"}`` once the engine answers and its model
  runner is ready (at start-up and while a runner is being replaced: 503
  ``{"status": "starting"}`` with ``Retry-After``; 503 ``"unavailable"`` when the engine
  does not answer).
- ``GET /stats``: the engine's counters plus the gateway's ``in_flight`` requests, and
  ``token_path``: where each generated token's time went, per component
  (``houchu.api.token_path``; ``?token_path_since=N`` summarizes only the samples after
  the one numbered N); 503 when the engine does not answer.
- ``GET /dashboard`` and ``/dashboard/...``: the live dashboard and its JSON API
  (``views``, ``live``), read from the recorder's database.
- ``GET /metrics``: Prometheus metrics (``metrics``).
- ``GET /openapi.json``: the OpenAPI 3.1 description of the HTTP API (``openapi``).

Limits (``limits``): at most ``limits.max_in_flight`` accepted, unfinished requests (429
with ``Retry-After`` beyond), bodies and WebSocket frames of at most
``limits.max_body_bytes`` (413), slow-reader streams aborted. With ``limits.api_key`` set,
the API routes need ``Authorization: Bearer <key>`` (``auth``).

Every error is an OpenAI-style ``{"error": {...}}`` body (``errors``); an unexpected
exception is logged and answered with a 500.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable

from aiohttp import web
from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

from houchu.api import openapi, server_info, tokenize
from houchu.api.auth import make_auth_middleware
from houchu.api.engine_client import STATS_TIMEOUT_S, EngineError
from houchu.api.errors import ApiError, api_error, error_response, json_response
from houchu.api.limits import GatewayLimits
from houchu.api.metrics import METRICS_KEY, GatewayMetrics
from houchu.api.openai import routes as openai_api
from houchu.api.state import ENGINE_KEY, STATE_KEY, EngineLike, GatewayState
from houchu.api.ws import routes as ws_api
from houchu.dashboard import live, views
from houchu.dashboard.live_data import STORE_KEY, engine_stats
from houchu.dashboard.store import DashboardStore
from houchu.transport.failures import Failed
from houchu.transport.limits import LimitsWatch, RunnerLimits

__all__ = ["ENGINE_KEY", "STATE_KEY", "EngineLike", "GatewayLimits", "GatewayState", "make_app"]

log = logging.getLogger(__name__)

HEALTH_TIMEOUT_S = 2.0  # /health answers 503 when the engine takes longer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


def make_app(
    engine: EngineLike,
    *,
    model_name: str,
    max_context: int | None = None,
    runner: LimitsWatch | None = None,
    store: DashboardStore | None = None,
    gateway_metrics: GatewayMetrics | None = None,
    limits: GatewayLimits | None = None,
    tool_call_parser: str = "hermes",
    tokenizer: tokenize.GatewayTokenizer | None = None,
) -> web.Application:
    """Build the gateway application.

    Args:
        engine: the engine handle (``EngineClient``, or a fake in tests).
        model_name: the served model's id, as ``/v1/models`` lists it; requests naming
            another model are refused (404, code ``model_not_found``).
        max_context: a fixed context window, tokens per request (prompt + completion);
            ``max_tokens`` above it is refused. Give this or ``runner``.
        runner: the runner's limits, updated by its ``RunnerInfo`` (the engine client's
            ``runner_limits``); requests wait for the first.
        store: the dashboard's database handle (None: the dashboard API answers 503).
        gateway_metrics: the Prometheus metrics the engine client feeds (None: fresh).
        limits: admission, body size, slow-reader and API-key settings (None: defaults,
            no key).
        tool_call_parser: how replies to ``tool_choice: "auto"`` are parsed
            (``houchu.text.tool_calls.parse.PARSERS``).
        tokenizer: the model's tokenizer for ``/tokenize`` and ``/detokenize`` (None:
            they answer 503).
    """
    if (max_context is None) == (runner is None):
        raise ValueError("give exactly one of max_context and runner")
    if max_context is not None:  # at least 1 (RunnerLimits.fixed: a ValueError)
        runner = LimitsWatch(RunnerLimits.fixed(max_context))
    limits = limits or GatewayLimits()
    middlewares = [error_middleware]
    if limits.api_key is not None:
        middlewares.append(make_auth_middleware(limits.api_key))
    app = web.Application(middlewares=middlewares, client_max_size=limits.max_body_bytes)
    app[ENGINE_KEY] = engine
    app[STATE_KEY] = GatewayState(
        model_name=model_name,
        runner=runner,
        created=int(time.time()),
        limits=limits,
        tool_call_parser=tool_call_parser,
    )
    app.router.add_get("/health", health)
    app.router.add_get("/stats", stats)
    openai_api.add_routes(app)
    if tokenizer is not None:
        app[tokenize.TOKENIZER_KEY] = tokenizer
    tokenize.add_routes(app)
    ws_api.add_routes(app)
    if store is not None:
        app[STORE_KEY] = store
    views.add_routes(app)
    live.add_routes(app)
    add_metrics_route(app, gateway_metrics)
    openapi.add_routes(app)
    server_info.add_routes(app)
    return app


@web.middleware
async def error_middleware(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Answer every failure with an OpenAI-style error body."""
    try:
        return await handler(request)
    except Failed as exc:  # an ApiError, or a failure the engine sent
        if exc.status >= 500:
            log.warning("%s %s: %s", request.method, request.path, exc.message)
        return error_response(api_error(exc))
    except web.HTTPException as exc:
        if exc.status < 400:  # redirects and the like pass through
            raise
        message = exc.text or ""
        if message in ("", f"{exc.status}: {exc.reason}"):  # aiohttp's default text
            message = f"{exc.reason}: {request.method} {request.path}"
        code = {404: "not_found", 413: "request_too_large"}.get(exc.status)
        return error_response(ApiError(message, status=exc.status, code=code))
    except ConnectionResetError:
        log.info("%s %s: client went away", request.method, request.path)
        raise
    except Exception:
        log.exception("unexpected error serving %s %s", request.method, request.path)
        return error_response(ApiError("internal server error", status=500, code="internal_error"))


async def health(request: web.Request) -> web.Response:
    """``GET /health``: 200 ``{"status": "ok"}`` when requests would be served now: the
    engine answers within ``HEALTH_TIMEOUT_S`` seconds and its model runner is ready.
    Else 503 with ``Retry-After``: ``"starting"`` (the runner is loading, at start-up or
    after a restart) or ``"unavailable"`` (the engine does not answer), with a detail."""
    engine, state = request.app[ENGINE_KEY], request.app[STATE_KEY]
    try:
        counters = await asyncio.wait_for(engine.stats(), HEALTH_TIMEOUT_S)
    except Exception as exc:  # a timeout, an EngineError, or anything else: not ready
        if not state.engine_ready_once:  # the scheduler waits for the runner's first load
            return _not_ready("starting", "the engine is starting (the model is loading)")
        detail = str(exc) or type(exc).__name__
        return _not_ready("unavailable", f"the engine did not answer: {detail}")
    if not counters.get("runner_ready", 1):
        return _not_ready("starting", "the model runner is loading")
    state.engine_ready_once = True
    return json_response({"status": "ok"})


def _not_ready(status: str, detail: str) -> web.Response:
    resp = json_response({"status": status, "detail": detail}, status=503)
    resp.headers["Retry-After"] = "1"
    return resp


async def stats(request: web.Request) -> web.Response:
    """``GET /stats``: the engine's counters and the gateway's in-flight requests."""
    engine = request.app[ENGINE_KEY]
    try:
        counters = dict(await asyncio.wait_for(engine.stats(), STATS_TIMEOUT_S))
    except EngineError as exc:
        raise ApiError(f"engine did not answer: {exc.message}", status=503, code=exc.code) from None
    except asyncio.TimeoutError:
        raise ApiError("engine did not answer", status=503, code="timeout") from None
    except Exception as exc:
        log.warning("engine stats failed", exc_info=True)
        raise ApiError(f"engine stats failed: {exc}", status=503, code="engine_error") from None
    state = request.app[STATE_KEY]
    admission = state.admission
    counters["model"] = state.model_name  # the id /v1/models lists, not the file's own name
    counters["in_flight"] = admission.in_flight
    counters["max_in_flight"] = admission.limit
    counters["num_refused_overload"] = admission.num_refused
    token_path = getattr(engine, "token_path", None)  # the EngineClient's (fakes have none)
    if token_path is not None:
        try:
            since = int(request.query.get("token_path_since", "0"))
        except ValueError:
            raise ApiError("token_path_since must be an integer", status=400) from None
        counters["token_path"] = token_path.stats(since)
    return json_response(counters)


def add_metrics_route(app: web.Application, metrics: GatewayMetrics | None = None) -> None:
    """Register ``GET /metrics`` with ``metrics`` (a fresh set when None)."""
    app[METRICS_KEY] = metrics or GatewayMetrics()
    app.router.add_get("/metrics", metrics_endpoint)


async def metrics_endpoint(request: web.Request) -> web.Response:
    """``GET /metrics``: Prometheus text format. Engine and database numbers are read
    now; a source that does not answer is left out (``houchu_engine_up`` says so)."""
    app = request.app
    metrics = app[METRICS_KEY]
    store = app.get(STORE_KEY)
    ledger = counters = None
    if store is not None:
        try:
            ledger, counters = await asyncio.gather(store.ledger(None), store.counters())
        except ApiError as e:  # the database cannot answer: export the rest
            log.info("metrics without the database: %s", e.message)
    stats, _ = await engine_stats(app)
    state = app.get(STATE_KEY)
    served = state.model_name if state is not None else None
    metrics.snapshot.update(stats, ledger, counters, served)
    body = await asyncio.get_running_loop().run_in_executor(None, generate_latest, metrics.registry)
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})
