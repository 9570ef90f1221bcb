"""The OpenAI-compatible HTTP API: ``/v1/completions``, ``/v1/chat/completions``,
``/v1/models``.

Each request gets a fresh id (``cmpl-<hex>`` / ``chatcmpl-<hex>``), which is also its
engine request id. Streaming responses are server-sent events, one ``data: {json}`` per
chunk, flushed as written, ending with ``data: [DONE]``. The first delta is awaited before
the response starts, so an engine rejection (a prompt longer than the context window)
is a proper HTTP error; a failure after that (an engine actor died, say) is sent as a
chunk with ``finish_reason: "error"`` and then an ``{"error": ...}`` event. When
the client goes away the delta iterator is closed, which aborts the request in the engine.

A request takes an admission slot before its body is read (429 with ``Retry-After`` when
the gateway is full, ``houchu.api.limits``); a stream whose client stops reading is
aborted once ``stream_buffer_bytes`` wait unsent (``StreamGuard``).
"""

from __future__ import annotations

import contextlib
import logging
import time
import uuid
from collections.abc import AsyncIterator, Callable
from typing import Any

import msgspec
from aiohttp import web

from houchu.api.engine_client import EngineError
from houchu.api.errors import api_error, error_body, json_response
from houchu.api.limits import StreamGuard
from houchu.api.openai.choices import best_choices, open_choices, prompt_first
from houchu.api.openai.format import ChatFormatter, CompletionFormatter, Formatter, Tally
from houchu.api.requests.parse import ParsedRequest, decode_body, parse_chat, parse_completion
from houchu.api.requests.parse_thread import off_loop
from houchu.api.requests.parts import check_model
from houchu.api.state import INFO_WAIT_S, STATE_KEY
from houchu.api.tokenize import with_suffix
from houchu.transport.messages import TextDelta

log = logging.getLogger(__name__)

SSE_HEADERS = {
    "Content-Type": "text/event-stream; charset=utf-8",
    "Cache-Control": "no-cache",
    "X-Accel-Buffering": "no",
}
#: Status logged (like nginx) for a request whose client went away before the answer.
CLIENT_CLOSED_STATUS = 499


class ClientGone(ConnectionResetError):
    """The client closed the connection before the response was complete."""


def client_gone(request: web.Request) -> bool:
    """Whether the request's connection is closed or closing."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/completions``."""
    return await _generate(request, parse_completion, CompletionFormatter, "cmpl")


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """``POST /v1/chat/completions``."""
    return await _generate(request, parse_chat, ChatFormatter, "chatcmpl")


async def _model_object(request: web.Request) -> dict[str, Any]:
    """The served model as OpenAI's model object (503 while the runner loads)."""
    state = request.app[STATE_KEY]
    limits = await state.runner_limits(INFO_WAIT_S)
    return {
        "id": state.model_name,
        "object": "model",
        "created": state.created,
        "owned_by": "houchu",
        "root": state.model_name,
        "parent": None,
        "max_model_len": limits.max_context,
    }


async def models(request: web.Request) -> web.Response:
    """``GET /v1/models``: the one served model (503 while the runner loads)."""
    return json_response({"object": "list", "data": [await _model_object(request)]})


async def model(request: web.Request) -> web.Response:
    """``GET /v1/models/{model}`` (the ``openai`` client's ``models.retrieve``): the
    served model's object, or 404 ``model_not_found`` for any other id."""
    check_model(request.match_info["model"], request.app[STATE_KEY].model_name)
    return json_response(await _model_object(request))


def add_routes(app: web.Application) -> None:
    """Register the OpenAI-compatible routes."""
    app.router.add_post("/v1/completions", completions)
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/v1/models/{model:.+}", model)


# ------------------------------------------------------------------------ driver


async def _generate(
    request: web.Request,
    parse: Callable[..., ParsedRequest],
    formatter_cls: type[Formatter],
    prefix: str,
) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    with state.admission.admit():  # before the body is read: a refusal costs nothing
        return await _admitted(request, parse, formatter_cls, prefix)


async def _admitted(
    request: web.Request,
    parse: Callable[..., ParsedRequest],
    formatter_cls: type[Formatter],
    prefix: str,
) -> web.StreamResponse:
    state = request.app[STATE_KEY]
    body = decode_body(await request.read())
    limits = await state.runner_limits()
    parsed = await off_loop(  # a grammar's check waits for the engine's child process
        parse,
        body,
        model_name=state.model_name,
        max_context=limits.max_context,
        vocab_size=limits.vocab_size,
    )
    record = parsed.record()  # before the suffix becomes part of the prompt
    parsed = await with_suffix(request.app, parsed)
    rid = f"{prefix}-{uuid.uuid4().hex}"
    fmt = formatter_cls(
        rid,
        int(time.time()),
        state.model_name,
        logprobs=parsed.sampling.logprobs,
        top_n=parsed.sampling.top_logprobs,
        include_usage=parsed.include_usage,
        continuous_usage=parsed.continuous_usage,
        tool_parser=parsed.tools.parser(state.tool_call_parser) if parsed.tools else None,
        echo=parsed.sampling.echo,
        prompt_logprobs=parsed.prompt_logprobs is not None,
    )
    reqs = parsed.to_generates(rid)
    async with open_choices(request.app, reqs, record) as deltas:
        if parsed.stream:  # each choice's first chunks repeat the prompt: choice 0's first
            deltas = prompt_first(deltas, fmt.echo or fmt.prompt_logprobs)
            return await _stream(request, deltas, fmt, len(reqs))
        return await _aggregate(request, deltas, fmt, len(reqs), parsed.n)


Deltas = AsyncIterator[tuple[int, TextDelta]]


async def _aggregate(
    request: web.Request, deltas: Deltas, fmt: Formatter, count: int, n: int
) -> web.Response:
    tallies = [Tally() for _ in range(count)]
    try:
        async for i, delta in deltas:
            tally = tallies[i]
            tally.add(delta)  # read to the end: closing after the final delta would abort
            if tally.finish_reason is None and client_gone(request):
                log.info("client of %s went away; aborting", fmt.rid)
                return web.Response(status=CLIENT_CLOSED_STATUS, reason="Client Closed Request")
    except EngineError as exc:
        raise api_error(exc) from None
    for tally in tallies:
        if tally.finish_reason is None:
            log.warning("engine ended %s without a finish reason", fmt.rid)
            tally.finish_reason = "abort"
    return json_response(fmt.response(tallies, best_choices(tallies, n)))


async def _stream(
    request: web.Request, deltas: Deltas, fmt: Formatter, count: int
) -> web.StreamResponse:
    try:
        first: tuple[int, TextDelta] | None = await anext(deltas)
    except StopAsyncIteration:
        first = None
    except EngineError as exc:
        raise api_error(exc) from None

    resp = web.StreamResponse(headers=SSE_HEADERS)
    try:
        await resp.prepare(request)
        limit = request.app[STATE_KEY].limits.stream_buffer_bytes
        guard = StreamGuard(request.transport, limit, fmt.rid)
        await _send_events(request, resp, deltas, fmt, first, guard, count)
    except ConnectionResetError:
        log.info("client of %s went away mid-stream; aborting", fmt.rid)
    except Exception:  # headers are sent: report in the stream, not as a new response
        log.exception("unexpected error streaming %s", fmt.rid)
        body = error_body("internal server error", type_="internal_server_error")
        with contextlib.suppress(ConnectionResetError):
            await resp.write(b"data: " + msgspec.json.encode(body) + b"\n\ndata: [DONE]\n\n")
    return resp


async def _send_events(
    request: web.Request,
    resp: web.StreamResponse,
    deltas: Deltas,
    fmt: Formatter,
    item: tuple[int, TextDelta] | None,
    guard: StreamGuard,
    count: int,
) -> None:
    """Stream every choice's chunks, each with its ``index``. A choice's first chunks
    (the role, the echoed prompt) go out before its first content; the prompt comes
    with choice 0's first delta, which ``prompt_first`` puts before the others'."""

    async def send(obj: Any) -> None:
        if client_gone(request):
            raise ClientGone("client closed the connection")
        guard.check()  # raises SlowReader (a ConnectionResetError) for a stalled client
        obj = fmt.with_running_usage(obj, tallies)
        await resp.write(b"data: " + msgspec.json.encode(obj) + b"\n\n")

    tallies = [Tally() for _ in range(count)]
    started = [False] * count

    async def emit(i: int, delta: TextDelta) -> None:
        tally = tallies[i]
        tally.add(delta)
        if not started[i]:
            started[i] = True
            for chunk in fmt.start_chunks(i) + fmt.prompt_chunks(i, tallies[0]):
                await send(chunk)
        if delta.text or delta.logprobs:
            for chunk in fmt.content_chunks(delta.text, delta.logprobs, i):
                await send(chunk)
        if delta.finish_reason is not None:
            for chunk in fmt.finish_chunks(delta.finish_reason, i, delta.stop_reason):
                await send(chunk)

    try:
        while item is not None:
            await emit(*item)
            item = await anext(deltas, None)
    except EngineError as exc:  # e.g. an actor died: a finish chunk, the error, [DONE]
        err = api_error(exc)
        log.info("request %s failed mid-stream: %s", fmt.rid, exc.message)
        for i, tally in enumerate(tallies):
            if tally.finish_reason is None:
                await send(fmt.finish_chunk("error", i))
        await send(error_body(err.message, type_=err.type, param=err.param, code=err.code))
        await resp.write(b"data: [DONE]\n\n")
        return
    for i, tally in enumerate(tallies):
        if tally.finish_reason is None:
            log.warning("engine ended %s without a finish reason", fmt.rid)
            tally.finish_reason = "abort"
            if not started[i]:
                started[i] = True
                for chunk in fmt.start_chunks(i):
                    await send(chunk)
            for chunk in fmt.finish_chunks("abort", i):
                await send(chunk)
    if fmt.include_usage:
        await send(fmt.usage_chunk(tallies))
    await resp.write(b"data: [DONE]\n\n")
