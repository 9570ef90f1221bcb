"""Load-generator target: houchu's streaming WebSocket API (``ws://HOST:PORT/ws``).

Requests are multiplexed over a few sockets (one id per request). A reader task per
socket timestamps every frame as it arrives and hands it to the waiting request, so
timings do not depend on when the request's task gets scheduled. A delta frame with
token ids is a token arrival; output tokens come from the final frame's ``usage``, and
are also counted from the deltas' ``token_ids`` (``counted_tokens``). A request that
times out is aborted on the server (``{"type": "abort"}``). A socket that breaks fails
its requests with ``connection`` and is reopened for the next ones.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

import aiohttp

from houchu.bench.backends.base import GenParams, apply_usage, fail
from houchu.bench.metrics import RequestResult
from houchu.bench.workloads import Message, RequestSpec

_CLOSED = object()  # put on every waiting queue when a socket dies


class _Socket:
    """One WebSocket and its reader task; frames go to per-id queues."""

    def __init__(self, session: aiohttp.ClientSession, url: str) -> None:
        self._session = session
        self._url = url
        self._ws: aiohttp.ClientWebSocketResponse | None = None
        self._reader: asyncio.Task[None] | None = None
        self._queues: dict[str, asyncio.Queue[Any]] = {}
        self._lock = asyncio.Lock()

    async def ensure_open(self) -> aiohttp.ClientWebSocketResponse:
        """The open socket, connecting (again) when needed."""
        async with self._lock:
            if self._ws is None or self._ws.closed:
                self._ws = await self._session.ws_connect(self._url, max_msg_size=0, heartbeat=None)
                self._reader = asyncio.create_task(self._read(self._ws))
            return self._ws

    async def _read(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        try:
            async for msg in ws:
                now = time.perf_counter()
                if msg.type != aiohttp.WSMsgType.TEXT:
                    continue
                frame = msg.json()
                q = self._queues.get(str(frame.get("id")))
                if q is not None:
                    q.put_nowait((now, frame))
        finally:
            for q in self._queues.values():
                q.put_nowait((time.perf_counter(), _CLOSED))

    def subscribe(self, rid: str) -> asyncio.Queue[Any]:
        """A queue receiving ``(arrival time, frame)`` for request ``rid``."""
        q: asyncio.Queue[Any] = asyncio.Queue()
        self._queues[rid] = q
        return q

    def unsubscribe(self, rid: str) -> None:
        """Stop routing frames of ``rid``."""
        self._queues.pop(rid, None)

    async def close(self) -> None:
        """Close the socket and stop the reader."""
        if self._ws is not None:
            await self._ws.close()
        if self._reader is not None:
            await asyncio.gather(self._reader, return_exceptions=True)


class HouchuWsBackend:
    """Streams requests over houchu's WebSocket API.

    Args:
        url: the socket URL, e.g. ``ws://127.0.0.1:8000/ws``.
        params: request settings (``model`` is ignored: the server has one model).
        connections: sockets to spread requests over.
    """

    name = "houchu-ws"

    def __init__(self, url: str, params: GenParams, connections: int = 4) -> None:
        self.url = url
        self.params = params
        self.connections = max(1, connections)
        self._session: aiohttp.ClientSession | None = None
        self._sockets: list[_Socket] = []
        self._ids = itertools.count()

    async def start(self) -> None:
        """Open the sockets (on a failure, what was opened is closed before it raises)."""
        self._session = aiohttp.ClientSession()
        self._sockets = [_Socket(self._session, self.url) for _ in range(self.connections)]
        try:
            for s in self._sockets:
                await s.ensure_open()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        """Close the sockets."""
        for s in self._sockets:
            await s.close()
        if self._session is not None:
            await self._session.close()
            self._session = None

    def info(self) -> dict[str, Any]:
        """The socket URL and count."""
        return {"backend": self.name, "url": self.url, "connections": self.connections}

    def frame(self, rid: str, spec: RequestSpec, history: list[Message]) -> dict[str, Any]:
        """The generate frame of one request."""
        out: dict[str, Any] = {"id": rid, **self.params.sampling(spec.max_tokens)}
        if self.params.use_chat(spec, history):
            out["messages"] = spec.chat(history)
        else:
            out["prompt"] = spec.completion(history)
        return out

    async def generate(
        self, spec: RequestSpec, history: list[Message], result: RequestResult
    ) -> None:
        """Stream one request into ``result``; never raises for a failed request."""
        n = next(self._ids)
        rid = f"b{n}"
        sock = self._sockets[n % len(self._sockets)]
        queue = sock.subscribe(rid)
        try:
            ws = await sock.ensure_open()
            await ws.send_json(self.frame(rid, spec, history))
            await asyncio.wait_for(self._collect(queue, result), self.params.timeout_s)
        except asyncio.TimeoutError:
            fail(
                result,
                "timeout",
                f"no final frame within {self.params.timeout_s:g} s",
                time.perf_counter(),
            )
            await self._abort(sock, rid)
        except (aiohttp.ClientError, ConnectionError, OSError, RuntimeError) as exc:
            fail(result, "connection", f"{type(exc).__name__}: {exc}", time.perf_counter())
        finally:
            sock.unsubscribe(rid)
        if not result.usage_reported:
            result.output_tokens = result.counted_tokens

    @staticmethod
    async def _abort(sock: _Socket, rid: str) -> None:
        try:
            ws = await sock.ensure_open()
            await ws.send_json({"type": "abort", "id": rid})
        except (aiohttp.ClientError, ConnectionError, OSError, RuntimeError):
            pass

    @staticmethod
    async def _collect(queue: asyncio.Queue[Any], result: RequestResult) -> None:
        parts: list[str] = []
        while True:
            now, frame = await queue.get()
            if frame is _CLOSED:
                fail(result, "connection", "the WebSocket closed mid-request", now)
                break
            kind = frame.get("type")
            if kind == "delta":
                ids = frame.get("token_ids") or []
                if ids:
                    result.token_times.append(now)
                    result.counted_tokens += len(ids)
                parts.append(frame.get("text") or "")
            elif kind == "final":
                parts.append(frame.get("text") or "")
                apply_usage(result, frame.get("usage"))
                result.end = now
                if frame.get("finish_reason") == "abort":
                    result.error, result.error_message = (
                        "server_error",
                        "the server aborted the request",
                    )
                break
            elif kind == "error":
                err = frame.get("error") or {}
                fail(result, "server_error", str(err.get("message", err)), now)
                break
        result.text = "".join(parts)
