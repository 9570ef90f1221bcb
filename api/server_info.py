"""What routers in front of houchu read about a replica, under the names they use:
``GET /version``, ``GET /model_info`` (SGLang's ``/get_model_info``) and
``GET /server_info`` (SGLang's ``/get_server_info``). ``/health``, ``/v1/models`` and
``/metrics`` live with the rest of the API (``api.app``, ``api.openai_api``,
``api.metrics``)."""

from __future__ import annotations

import asyncio
from importlib import metadata

from aiohttp import web

from houchu.api.engine_client import STATS_TIMEOUT_S, EngineError
from houchu.api.errors import ApiError, json_response
from houchu.api.state import ENGINE_KEY, INFO_WAIT_S, STATE_KEY


def houchu_version() -> str:
    """The installed houchu's version (``"unknown"`` when it is not installed)."""
    try:
        return metadata.version("houchu")
    except metadata.PackageNotFoundError:
        return "unknown"


async def version(request: web.Request) -> web.Response:
    """``GET /version``: ``{"version": "0.1.0"}``."""
    return json_response({"version": houchu_version()})


async def model_info(request: web.Request) -> web.Response:
    """``GET /model_info`` (and ``/get_model_info``): the served model's id, that it
    generates text, and its context length in tokens (503 while the runner loads)."""
    state = request.app[STATE_KEY]
    limits = await state.runner_limits(INFO_WAIT_S)
    return json_response(
        {
            "model_path": state.model_name,
            "tokenizer_path": state.model_name,
            "served_model_name": state.model_name,
            "is_generation": True,
            "max_model_len": limits.max_context,
            "vocab_size": limits.vocab_size,
        }
    )


async def server_info(request: web.Request) -> web.Response:
    """``GET /server_info`` (and ``/get_server_info``): the version, the model, the KV
    pool (``max_total_num_tokens``: pages x page size, tokens) and the scheduler's
    current load (requests running and waiting).

    Raises:
        ApiError: 503 while the runner loads, or when the engine does not answer within
            ``STATS_TIMEOUT_S``.
    """
    state, engine = request.app[STATE_KEY], request.app[ENGINE_KEY]
    limits = await state.runner_limits(INFO_WAIT_S)
    try:
        st = dict(await asyncio.wait_for(engine.stats(), STATS_TIMEOUT_S))
    except (asyncio.TimeoutError, EngineError):
        raise ApiError("engine did not answer", status=503, code="timeout") from None
    pages, page_size = int(st.get("num_pages_total", 0)), int(st.get("page_size", 0))
    return json_response(
        {
            "version": houchu_version(),
            "model_path": state.model_name,
            "served_model_name": state.model_name,
            "context_length": limits.max_context,
            "page_size": page_size,
            "max_total_num_tokens": pages * page_size,
            "num_running_requests": st.get("num_running", 0),
            "num_waiting_requests": st.get("num_waiting", 0),
            "max_queued_requests": state.limits.max_in_flight,
        }
    )


def add_routes(app: web.Application) -> None:
    """Register ``/version``, ``/model_info``, ``/server_info`` and SGLang's ``get_``
    spellings of the last two."""
    app.router.add_get("/version", version)
    for path in ("/model_info", "/get_model_info"):
        app.router.add_get(path, model_info)
    for path in ("/server_info", "/get_server_info"):
        app.router.add_get(path, server_info)
