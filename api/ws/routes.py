"""The streaming WebSocket API (``GET /ws``).

The client sends JSON text frames:

- ``{"id": "<client id>", "prompt": ... | "messages": [...], <sampling parameters>}``
  (optionally ``"type": "generate"``) starts a request. Parameters are named as in the
  OpenAI API (``max_tokens``, ``max_completion_tokens``, ``temperature``, ``stop``, ...;
  every field of the HTTP bodies is served or refused with an error frame, never
  dropped: ``houchu.api.schema.bodies.WsGenerateRequest``); ``logprobs`` is a boolean
  or an integer 0..20 (that many alternatives per token), ``top_logprobs`` 0..20.
  ``id`` is a string or an integer; when it is missing the server assigns one, and the
  request's frames carry it. A ``messages`` frame also takes ``tools``, ``tool_choice``
  and vLLM's chat template fields (``chat_template_kwargs``, ``add_generation_prompt``,
  ``continue_final_message``: ``houchu.api.requests.chat_template``); a ``prompt`` frame takes
  ``echo`` (below).
- ``{"type": "abort", "id": "<client id>"}`` aborts that request.

The server answers with frames carrying the client's ``id``:

- ``{"id", "type": "delta", "text", "token_ids"}`` (plus ``"logprobs"``: a list of
  ``{"token", "token_id", "logprob", "bytes", "top_logprobs"}`` when asked for; the
  first delta has ``"prompt_logprobs"`` when asked for: vLLM's list, ``null`` for the
  first prompt token). With ``"echo": true`` on a prompt frame (as on
  ``POST /v1/completions``; ``max_tokens`` 0: the prompt alone) each choice's first delta
  is the prompt's, marked ``"echo": true``: ``text`` is the prompt, ``token_ids`` empty,
  and with logprobs its tokens' entries (the first's ``logprob`` and ``top_logprobs``
  null); every logprobs entry then also has ``text_offset``, the legacy one: characters
  of the tokens' texts from the start of the prompt (``houchu.api.ws.jobs``).
  With ``tools`` a delta's ``text`` is the reply's content only
  (never the call markup) and ``"tool_calls"`` carries OpenAI's tool-call deltas, as the
  SSE stream has them (``houchu.api.ws.jobs``); then
- one ``{"id", "type": "final", "finish_reason", "stop_reason", "usage", "text": ""}``
  (``stop_reason``: vLLM's, as on the HTTP API; with tools, also
  the reply's ``content``, the delta texts joined, and ``tool_calls``); ``usage`` is the
  OpenAI usage object with ``prompt_tokens_details.cached_tokens``. With ``n`` > 1 every
  delta carries its choice's ``"index"``, and the final frame (after every choice ended)
  has ``"choices": [{"index", "finish_reason", "stop_reason"}]``; ``finish_reason`` is choice 0's and
  ``usage`` counts every choice. An aborted request
  ends with a final frame whose ``finish_reason`` is ``"abort"``; one the engine failed
  after taking it (an actor died and is restarting) with ``finish_reason: "error"``,
  ``"status"`` (503, or 500) and ``"error"`` as below.
- ``{"id", "type": "error", "status", "error": {"message", "type", "param", "code"}}``
  for a frame that is not JSON, an unknown ``type``, bad parameters, an id already in
  flight, an unknown id to abort, a full server (``status`` 429, with ``retry_after``
  seconds, as the HTTP API's 429 and ``Retry-After``) or an engine rejection; ``status`` is
  the HTTP status the same error gets on the HTTP API. Its ``id`` is the frame's whenever
  the frame had one the server can read, a string or a number (even one refused as an id,
  or in a frame that cannot be decoded: ``houchu.api.ws.ids``), else null; a failure
  inside the server (500) is answered the same way. The socket stays open and usable.

Each request holds one of the gateway's admission slots while it runs
(``houchu.api.limits``). A frame longer than the gateway's body limit closes the
socket (code 1009). A client that stops reading: once more than ``stream_buffer_bytes``
wait unsent, the socket is aborted and every request on it is aborted in the engine.

Requests on one socket run concurrently, each as its own task; frames are sent one at a
time under a lock. The engine request id is ``ws-<uuid hex>-<client id>``, unique per
server. When the socket closes, every request still in flight on it is aborted.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from typing import Any

import msgspec
from aiohttp import WSMsgType, web

from houchu.api.engine_client import EngineError
from houchu.api.errors import ApiError, api_error
from houchu.api.limits import SlowReader, StreamGuard
from houchu.api.openai.choices import open_choices, prompt_first
from houchu.api.openai.format import usage_of
from houchu.api.requests.json_text import not_json_error
from houchu.api.requests.parse import ParsedRequest, parse_ws_generate
from houchu.api.requests.parse_thread import off_loop
from houchu.api.state import STATE_KEY
from houchu.api.ws.ids import MAX_ID_CHARS, answer_id, id_in_text
from houchu.api.ws.jobs import ClientId, WsJob
from houchu.transport.messages import GenerateRequest

log = logging.getLogger(__name__)

#: Requests one socket may have in flight at once.
MAX_IN_FLIGHT_PER_SOCKET = 256
HEARTBEAT_S = 30.0


class WsSession:
    """The requests of one WebSocket connection.

    Args:
        app: the gateway application (engine and state).
        ws: the prepared WebSocket response.
        transport: the connection's transport, watched for a client that stops reading
            (None: not watched).
    """

    def __init__(
        self,
        app: web.Application,
        ws: web.WebSocketResponse,
        transport: asyncio.BaseTransport | None = None,
    ) -> None:
        self._app = app
        self._ws = ws
        self._jobs: dict[str, WsJob] = {}
        # requests whose frame is being parsed (a grammar's check can take seconds): the
        # task that parses, then runs it
        self._pending: dict[str, asyncio.Task[None]] = {}
        self._send_lock = asyncio.Lock()
        limit = app[STATE_KEY].limits.stream_buffer_bytes
        self._guard = StreamGuard(transport, limit, "websocket")

    @property
    def num_in_flight(self) -> int:
        """Requests running on this socket, or being parsed."""
        return len(self._jobs) + len(self._pending)

    async def send(self, frame: dict[str, Any]) -> None:
        """Send one frame; a socket already closed swallows it."""
        if self._ws.closed:
            return
        data = msgspec.json.encode(frame).decode()
        async with self._send_lock:
            try:
                self._guard.check()
                await self._ws.send_str(data)
            except SlowReader:
                pass  # the socket is aborted: its reader loop ends and aborts every request
            except (ConnectionResetError, RuntimeError):
                log.debug("websocket closed while sending a frame")

    async def send_error(self, client_id: ClientId | None, err: ApiError) -> None:
        """Send an error frame; the socket stays usable."""
        frame: dict[str, Any] = {
            "id": client_id,
            "type": "error",
            "status": err.status,
            "error": err.body()["error"],
        }
        if err.retry_after_s is not None:
            frame["retry_after"] = err.retry_after_s
        await self.send(frame)

    async def on_text(self, data: str) -> None:
        """Handle one client text frame. Every error frame answering it carries its
        ``id`` when it had a readable one (``houchu.api.ws.ids``), an unexpected failure
        (a 500) included."""
        answer_to: Any = None  # the id this frame's error frames carry
        try:
            try:
                frame = msgspec.json.decode(data)
            except RecursionError:
                err = ApiError("frame is nested too deeply", code="invalid_json")
                await self.send_error(answer_id(id_in_text(data)), err)
                return
            except msgspec.DecodeError as exc:
                err, _ = not_json_error(data, exc, "frame")
                await self.send_error(answer_id(id_in_text(data)), err)
                return
            if not isinstance(frame, dict):
                err = ApiError("frame must be a JSON object", code="invalid_type")
                await self.send_error(None, err)
                return
            client_id = frame.get("id")
            answer_to = answer_id(client_id)
            if client_id is None:
                client_id = answer_to = uuid.uuid4().hex
            elif isinstance(client_id, bool) or not isinstance(client_id, str | int):
                err = ApiError(
                    "'id' must be a string or an integer", param="id", code="invalid_type"
                )
                await self.send_error(answer_to, err)
                return
            elif len(str(client_id)) > MAX_ID_CHARS or str(client_id) == "":
                err = ApiError(
                    f"'id' must have 1 to {MAX_ID_CHARS} characters",
                    param="id",
                    code="invalid_value",
                )
                await self.send_error(answer_to, err)
                return
            await self._dispatch(client_id, frame)
        except Exception:
            log.exception("unexpected error handling a websocket frame")
            err = ApiError("internal server error", status=500, code="internal_error")
            await self.send_error(answer_to, err)

    async def _dispatch(self, client_id: ClientId, frame: dict[str, Any]) -> None:
        """Start or abort the request ``frame`` asks for (its ``id``: ``client_id``)."""
        kind = frame.get("type", "generate")
        if kind == "generate":
            await self._start(client_id, frame)
        elif kind == "abort":
            await self._abort(client_id, explicit="id" in frame)
        else:
            err = ApiError(
                f"unknown frame type {kind!r}; expected 'generate' or 'abort'",
                param="type",
                code="invalid_value",
            )
            await self.send_error(client_id, err)

    async def _start(self, client_id: ClientId, frame: dict[str, Any]) -> None:
        """Refuse a duplicate id or a full socket at once; else parse the frame and run
        the request on a task of its own, so that the next frames (an abort among them)
        are read while a grammar is checked."""
        key = str(client_id)
        if key in self._jobs or key in self._pending:
            err = ApiError(
                f"request id {client_id!r} is already in flight on this socket",
                param="id",
                code="duplicate_id",
            )
            await self.send_error(client_id, err)
            return
        if self.num_in_flight >= MAX_IN_FLIGHT_PER_SOCKET:
            err = ApiError(
                f"at most {MAX_IN_FLIGHT_PER_SOCKET} requests may be in flight per socket",
                status=429,
                code="too_many_requests",
            )
            await self.send_error(client_id, err)
            return
        body = {k: v for k, v in frame.items() if k not in ("id", "type")}
        self._pending[key] = asyncio.create_task(self._parse_and_run(client_id, key, body))

    async def _parse_and_run(self, client_id: ClientId, key: str, body: dict[str, Any]) -> None:
        """Parse ``body`` off the event loop (``parse_thread``), then run the request on
        this same task (an abort cancels it in either phase)."""
        try:
            state = self._app[STATE_KEY]
            try:
                limits = await state.runner_limits()
                parsed: ParsedRequest = await off_loop(
                    parse_ws_generate,
                    body,
                    model_name=state.model_name,
                    max_context=limits.max_context,
                    vocab_size=limits.vocab_size,
                )
            except ApiError as err:
                await self.send_error(client_id, err)
                return
            reqs = parsed.to_generates(f"ws-{uuid.uuid4().hex}-{key}")
            job = WsJob(
                client_id,
                parsed.sampling.logprobs,
                parsed.sampling.top_logprobs,
                n=len(reqs),
                prompt_logprobs=parsed.prompt_logprobs is not None,
                echo=parsed.sampling.echo,
                parser=parsed.tools.parser(state.tool_call_parser) if parsed.tools else None,
                record=parsed.record(),
            )
        except Exception:
            log.exception("unexpected error parsing a websocket frame")
            err = ApiError("internal server error", status=500, code="internal_error")
            await self.send_error(client_id, err)
            return
        finally:
            if self._pending.get(key) is asyncio.current_task():
                del self._pending[key]
        self._jobs[key] = job
        job.task = asyncio.current_task()
        await self._run(key, job, reqs)

    async def _run(self, key: str, job: WsJob, reqs: list[GenerateRequest]) -> None:
        try:
            with self._app[STATE_KEY].admission.admit():
                await self._generate(job, reqs)
        except ApiError as err:  # refused: the server is full
            await self.send_error(job.client_id, err)
        except EngineError as exc:
            err = api_error(exc)
            if err.status >= 500:  # the engine failed a request it took (an actor died)
                await self._send_final(job, "error", err)
            else:
                await self.send_error(job.client_id, err)
        except Exception:
            log.exception("websocket request %s failed", reqs[0].rid)
            await self.send_error(
                job.client_id, ApiError("internal server error", status=500, code="internal_error")
            )
        finally:
            if self._jobs.get(key) is job:
                del self._jobs[key]

    async def _generate(self, job: WsJob, reqs: list[GenerateRequest]) -> None:
        """Stream one admitted request's deltas (of every choice), then its final frame."""
        async with open_choices(self._app, reqs, job.record) as deltas:
            async for i, delta in prompt_first(deltas, job.echo):
                for frame in job.frames(i, delta):
                    await self.send(frame)
        for i in range(job.n if job.tools is not None else 0):
            for frame in job.end_frames(i):  # what the parser held to the end
                await self.send(frame)
        await self._send_final(job, job.tallies[0].finish_reason or "abort")

    async def _send_final(
        self, job: WsJob, finish_reason: str, err: ApiError | None = None
    ) -> None:
        frame: dict[str, Any] = {
            "id": job.client_id,
            "type": "final",
            "finish_reason": finish_reason,
            "stop_reason": job.tallies[0].stop_reason,
            "usage": usage_of(job.tallies),
            "text": "",
        }
        if job.tools is not None and err is None:
            frame.update(job.tool_reply(0, finish_reason))
        if job.n > 1:
            frame["choices"] = []
            for i, t in enumerate(job.tallies):
                choice: dict[str, Any] = {
                    "index": i,
                    "finish_reason": t.finish_reason or finish_reason,
                    "stop_reason": t.stop_reason,
                }
                if job.tools is not None and err is None:
                    choice.update(job.tool_reply(i, choice["finish_reason"]))
                frame["choices"].append(choice)
        if err is not None:
            frame["status"] = err.status
            frame["error"] = err.body()["error"]
        await self.send(frame)

    async def _abort(self, client_id: ClientId, *, explicit: bool) -> None:
        pending = self._pending.get(str(client_id)) if explicit else None
        if pending is not None:  # still parsing: nothing ran, the final frame says so
            pending.cancel()
            await asyncio.wait([pending])
            if pending.cancelled():
                await self._send_final(WsJob(client_id, False, 0), "abort")
            return
        job = self._jobs.get(str(client_id)) if explicit else None
        if job is None or job.task is None:
            err = ApiError(
                f"no request with id {client_id!r} is in flight on this socket",
                param="id",
                code="not_in_flight",
            )
            await self.send_error(client_id if explicit else None, err)
            return
        job.task.cancel()
        await asyncio.wait([job.task])
        if job.task.cancelled():  # it had not finished on its own meanwhile
            await self._send_final(job, "abort")

    async def close(self) -> None:
        """Abort every request still in flight (the socket is closed)."""
        tasks = [job.task for job in self._jobs.values() if job.task is not None]
        tasks += list(self._pending.values())
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.gather(*tasks, return_exceptions=True)


async def websocket(request: web.Request) -> web.WebSocketResponse:
    """``GET /ws``: multiplexed streaming generation over one WebSocket."""
    max_frame = request.app[STATE_KEY].limits.max_body_bytes
    ws = web.WebSocketResponse(heartbeat=HEARTBEAT_S, max_msg_size=max_frame)
    await ws.prepare(request)
    session = WsSession(request.app, ws, request.transport)
    try:
        async for msg in ws:
            if msg.type == WSMsgType.TEXT:
                try:
                    await session.on_text(msg.data)
                except Exception:  # on_text answers its own failures; this is a last guard
                    log.exception("unexpected error handling a websocket frame")
                    err = ApiError("internal server error", status=500, code="internal_error")
                    await session.send_error(answer_id(id_in_text(msg.data)), err)
            elif msg.type == WSMsgType.BINARY:
                err = ApiError("send JSON text frames, not binary", code="invalid_frame")
                await session.send_error(answer_id(id_in_text(msg.data)), err)
            elif msg.type == WSMsgType.ERROR:
                log.info("websocket error: %s", ws.exception())
                break
    finally:
        await session.close()
    return ws


def add_routes(app: web.Application) -> None:
    """Register the WebSocket route."""
    app.router.add_get("/ws", websocket)
