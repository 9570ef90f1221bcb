"""Load-generator target: any OpenAI-compatible streaming HTTP server (houchu, llama.cpp's
``llama-server``, vLLM, SGLang).

Each request is a ``POST {base_url}/completions`` or ``/chat/completions`` with
``stream: true`` and ``stream_options.include_usage`` (unless turned off); the
server-sent events are parsed line by line, and a chunk with non-empty text is a token
arrival, timestamped when its line is read. Output tokens come from the usage chunk; a
server that sends none is counted one token per content chunk.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import aiohttp

from houchu.bench.backends.base import GenParams, apply_usage, fail
from houchu.bench.metrics import RequestResult
from houchu.bench.workloads import Message, RequestSpec


class StreamError(Exception):
    """The server's stream broke the protocol or reported an error.

    Attributes:
        kind: ``protocol`` or ``server_error``.
    """

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class _StaleConnection(Exception):
    """The request could not be sent on a pooled connection (the server had closed it)."""


class OpenAIBackend:
    """Streams requests to an OpenAI-compatible server.

    Args:
        base_url: the API root, e.g. ``http://127.0.0.1:8080/v1``.
        params: request settings.
        api_key: sent as a bearer token when given.
        include_usage: ask for the usage chunk (``stream_options.include_usage``).
    """

    name = "openai"

    def __init__(
        self,
        base_url: str,
        params: GenParams,
        api_key: str | None = None,
        include_usage: bool = True,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.params = params
        self.include_usage = include_usage
        self._headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self._session: aiohttp.ClientSession | None = None
        self._model = params.model

    async def start(self) -> None:
        """Open the HTTP session; find the model name from ``/v1/models`` if needed."""
        connector = aiohttp.TCPConnector(limit=0, force_close=False)
        self._session = aiohttp.ClientSession(
            connector=connector, headers=self._headers, timeout=aiohttp.ClientTimeout(total=None)
        )
        if self._model is None:
            self._model = await self._first_model() or "default"

    async def _first_model(self) -> str | None:
        assert self._session is not None
        try:
            async with self._session.get(
                f"{self.base_url}/models", timeout=aiohttp.ClientTimeout(total=10)
            ) as r:
                data = await r.json(content_type=None)
            return str(data["data"][0]["id"])
        except (
            aiohttp.ClientError,
            asyncio.TimeoutError,
            KeyError,
            IndexError,
            TypeError,
            ValueError,
        ):
            return None

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    def info(self) -> dict[str, Any]:
        """The target's URL, model name and usage setting."""
        return {
            "backend": self.name,
            "base_url": self.base_url,
            "model": self._model,
            "include_usage": self.include_usage,
        }

    def body(self, spec: RequestSpec, history: list[Message]) -> tuple[str, dict[str, Any]]:
        """The endpoint path and JSON body of one request."""
        p = self.params
        body: dict[str, Any] = {"model": self._model, "stream": True, **p.sampling(spec.max_tokens)}
        if self.include_usage:
            body["stream_options"] = {"include_usage": True}
        if p.use_chat(spec, history):
            body["messages"] = spec.chat(history)
            return "/chat/completions", body
        body["prompt"] = spec.completion(history)
        return "/completions", body

    async def generate(
        self, spec: RequestSpec, history: list[Message], result: RequestResult
    ) -> None:
        """Stream one request into ``result``; never raises for a failed request."""
        path, body = self.body(spec, history)
        try:
            await asyncio.wait_for(self._send(path, body, result), self.params.timeout_s)
        except asyncio.TimeoutError:
            fail(
                result,
                "timeout",
                f"no complete answer within {self.params.timeout_s:g} s",
                time.perf_counter(),
            )
        except StreamError as exc:
            fail(result, exc.kind, str(exc), time.perf_counter())
        except (aiohttp.ClientError, ConnectionError, OSError) as exc:
            fail(result, "connection", f"{type(exc).__name__}: {exc}", time.perf_counter())
        if not result.usage_reported:
            result.output_tokens = result.counted_tokens

    async def _send(self, path: str, body: dict[str, Any], result: RequestResult) -> None:
        """Send once more when a kept-alive connection turns out closed before any answer
        (a server's keep-alive timeout racing the reuse; no byte of the answer is lost)."""
        try:
            await self._stream(path, body, result)
        except _StaleConnection:
            try:
                await self._stream(path, body, result)
            except _StaleConnection as exc:
                raise aiohttp.ClientConnectionError(str(exc.__cause__ or exc)) from exc

    async def _stream(self, path: str, body: dict[str, Any], result: RequestResult) -> None:
        assert self._session is not None, "start() was not called"
        try:
            resp = await self._session.post(self.base_url + path, json=body)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError) as exc:
            raise _StaleConnection(str(exc)) from exc
        async with resp:
            if resp.status != 200:
                text = (await resp.text())[:500]
                fail(result, f"http_{resp.status}", text, time.perf_counter())
                return
            finished = False
            parts: list[str] = []
            async for raw in resp.content:
                now = time.perf_counter()
                line = raw.decode("utf-8", errors="replace").strip()
                if not line.startswith("data:"):
                    continue  # blank separators, ": comments", "event:" lines
                data = line[5:].strip()
                if data == "[DONE]":
                    finished = True
                    break
                finished |= self._chunk(data, now, result, parts)
            result.text = "".join(parts)
            result.end = time.perf_counter()
            if not finished:
                raise StreamError("protocol", "the stream ended without [DONE] or a finish_reason")

    @staticmethod
    def _chunk(data: str, now: float, result: RequestResult, parts: list[str]) -> bool:
        """Account one ``data:`` payload; returns whether it carried a finish_reason."""
        try:
            chunk = json.loads(data)
        except json.JSONDecodeError as exc:
            raise StreamError("protocol", f"a chunk is not JSON: {data[:200]!r}") from exc
        if not isinstance(chunk, dict):
            raise StreamError("protocol", f"a chunk is not a JSON object: {data[:200]!r}")
        if "error" in chunk:
            err = chunk["error"]
            msg = err.get("message", err) if isinstance(err, dict) else err
            raise StreamError("server_error", str(msg))
        apply_usage(result, chunk.get("usage"))
        finished = False
        for choice in chunk.get("choices") or []:
            delta = choice.get("delta") or {}
            text = choice.get("text") if "text" in choice else delta.get("content")
            if text:
                result.token_times.append(now)
                result.counted_tokens += 1
                parts.append(text)
            finished |= choice.get("finish_reason") is not None
        return finished
