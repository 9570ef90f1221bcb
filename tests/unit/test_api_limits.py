"""Gateway limits against a fake engine: admission (429 + Retry-After, WebSocket error
frames), engine overload, body size (413), and slow readers (aborted, others unaffected)."""

from __future__ import annotations

import asyncio
import socket
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import msgspec
import pytest

from houchu.api.engine_client import EngineError
from houchu.api.limits import GatewayLimits, SlowReader, StreamGuard
from houchu.transport.failures import overloaded
from houchu.transport.messages import GenerateRequest, TextDelta
from tests.support.fake_api import (
    ANSWER,
    FakeEngine,
    assert_openai_error,
    read_sse,
    serve,
    wait_for,
)

SLOW = {"prompt": "SLOW", "max_tokens": 1000, "stream": True}


def assert_overloaded(status: int, headers: Any, body: Any) -> None:
    assert status == 429, body
    assert headers["Retry-After"] == "1"
    err = assert_openai_error(body)
    assert err["type"] == "rate_limit_error"


async def test_http_requests_beyond_the_limit_get_429_then_slots_free_up() -> None:
    async with serve(limits=GatewayLimits(max_in_flight=2)) as api:
        streams = [await api.client.post("/v1/completions", json=SLOW) for _ in range(2)]
        for r in streams:
            assert r.status == 200
            await r.content.readline()  # the stream has started: the slot is held
        assert api.in_flight == 2
        for path, body in [
            ("/v1/completions", {"prompt": "hi"}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]}),
            ("/v1/completions", {"prompt": "hi", "stream": True}),
        ]:
            async with api.client.post(path, json=body) as r:
                assert_overloaded(r.status, r.headers, await r.json())
        async with api.client.get("/stats") as r:
            stats = await r.json()
        assert stats["in_flight"] == 2 and stats["max_in_flight"] == 2
        assert stats["num_refused_overload"] == 3
        for r in streams:
            r.close()
        await wait_for(lambda: api.in_flight == 0)
        status, body = await api.post("/v1/completions", {"prompt": "hi", "max_tokens": 5})
        assert status == 200 and body["choices"][0]["text"] == ANSWER


async def test_a_refused_request_does_not_read_its_body() -> None:
    """The refusal comes before the body: a 429 even for a body that is not JSON."""
    async with serve(limits=GatewayLimits(max_in_flight=1)) as api:
        r = await api.client.post("/v1/completions", json=SLOW)
        await r.content.readline()
        async with api.client.post("/v1/completions", data=b"not json") as r2:
            assert_overloaded(r2.status, r2.headers, await r2.json())
        r.close()


async def test_websocket_requests_beyond_the_limit_get_a_429_error_frame() -> None:
    async with serve(limits=GatewayLimits(max_in_flight=1)) as api:
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "a", "prompt": "SLOW", "max_tokens": 1000})
            frame = await ws.receive_json(timeout=5)
            assert frame["id"] == "a" and frame["type"] == "delta"
            await ws.send_json({"id": "b", "prompt": "hi"})
            while (frame := await ws.receive_json(timeout=5))["id"] != "b":
                pass
            assert frame["type"] == "error" and frame["status"] == 429
            assert frame["retry_after"] == 1
            assert frame["error"]["type"] == "rate_limit_error"
            await ws.send_json({"type": "abort", "id": "a"})
            while (frame := await ws.receive_json(timeout=5))["type"] != "final":
                pass
            assert frame["id"] == "a" and frame["finish_reason"] == "abort"
            await wait_for(lambda: api.in_flight == 0)
            await ws.send_json({"id": "c", "prompt": "hi"})  # the slot is free again
            while (frame := await ws.receive_json(timeout=5))["type"] not in ("final", "error"):
                pass
            assert frame["id"] == "c" and frame["type"] == "final"


class OverloadedEngine(FakeEngine):
    """Refuses every request as the scheduler does when its queue is full."""

    async def generate(
        self, req: GenerateRequest, record: dict | None = None
    ) -> AsyncIterator[TextDelta]:
        raise EngineError(overloaded("the scheduler's queue is full"))
        yield  # pragma: no cover (an async generator)


async def test_engine_queue_full_is_429_with_retry_after() -> None:
    async with serve(OverloadedEngine()) as api:
        for stream in (False, True):
            body = {"prompt": "hi", "stream": stream}
            async with api.client.post("/v1/completions", json=body) as r:
                assert_overloaded(r.status, r.headers, await r.json())
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": 1, "prompt": "hi"})
            frame = await ws.receive_json(timeout=5)
            assert frame["type"] == "error" and frame["status"] == 429
        assert api.in_flight == 0


async def test_body_and_frame_size_limits() -> None:
    async with serve(limits=GatewayLimits(max_body_bytes=2048)) as api:
        big = msgspec.json.encode({"prompt": "x" * 5000})
        async with api.client.post("/v1/completions", data=big) as r:
            assert r.status == 413
            err = assert_openai_error(await r.json())
            assert err["code"] == "request_too_large"
        status, _ = await api.post("/v1/completions", {"prompt": "x" * 100, "max_tokens": 2})
        assert status == 200
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_str(big.decode())
            msg = await ws.receive(timeout=5)
            assert msg.type in (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSED)
            assert ws.close_code == aiohttp.WSCloseCode.MESSAGE_TOO_BIG
        assert api.in_flight == 0


class FireHose(FakeEngine):
    """``FLOOD`` streams 8 KiB deltas as fast as it can until aborted; other prompts are
    answered as by ``FakeEngine`` with ``delay_s`` between pieces."""

    async def generate(
        self, req: GenerateRequest, record: dict | None = None
    ) -> AsyncIterator[TextDelta]:
        if self.prompt_text(req) != "FLOOD":
            async for d in super().generate(req):
                yield d
            return
        self.requests.append(req)
        try:
            while True:
                yield TextDelta(rid=req.rid, text="z" * 8192, token_ids=[1])
                await asyncio.sleep(0)
        finally:
            await self.abort(req.rid)


def non_reading_socket(port: int) -> socket.socket:
    """A connected client socket with a tiny receive buffer, which it never reads."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    return s


async def _normal_streams(api: Any, n: int) -> None:
    """Run ``n`` ordinary streams at once, each to its whole answer."""
    bodies = [{"prompt": f"hi {i}", "max_tokens": 5, "stream": True} for i in range(n)]

    async def one(body: dict) -> None:
        async with api.client.post("/v1/completions", json=body) as r:
            chunks = await read_sse(r)
        assert "".join(c["choices"][0]["text"] for c in chunks) == ANSWER

    await asyncio.gather(*(one(b) for b in bodies))


async def test_slow_sse_reader_is_aborted_and_others_stream_on() -> None:
    limits = GatewayLimits(stream_buffer_bytes=64 * 1024)
    async with serve(FireHose(delay_s=0.005), limits=limits) as api:
        body = msgspec.json.encode({"prompt": "FLOOD", "max_tokens": 100, "stream": True})
        head = (
            f"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(body)}\r\n\r\n"
        ).encode()
        sock = non_reading_socket(api.client.port)
        try:
            sock.sendall(head + body)
            # the others stream on, whole, while the stalled client is connected: before
            # its stream is aborted and after (how fast is the benchmarks' business)
            await _normal_streams(api, 4)
            await wait_for(lambda: len(api.engine.aborted) == 1, timeout_s=20)
            await _normal_streams(api, 4)
        finally:
            sock.close()
        assert api.engine.aborted[0].startswith("cmpl-")
        await wait_for(lambda: api.in_flight == 0)


async def test_slow_websocket_reader_is_aborted() -> None:
    limits = GatewayLimits(stream_buffer_bytes=64 * 1024)
    async with serve(FireHose(), limits=limits) as api:
        sock = non_reading_socket(api.client.port)
        try:
            sock.sendall(
                b"GET /ws HTTP/1.1\r\nHost: x\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                b"Sec-WebSocket-Key: dGhlIHNhbXBsZSBub25jZQ==\r\nSec-WebSocket-Version: 13\r\n\r\n"
            )
            frame = msgspec.json.encode({"id": "f", "prompt": "FLOOD"})
            sock.sendall(_masked_text_frame(frame))
            await wait_for(lambda: len(api.engine.aborted) == 1, timeout_s=20)
        finally:
            sock.close()
        assert api.engine.aborted[0].startswith("ws-") and api.engine.aborted[0].endswith("-f")
        await wait_for(lambda: api.in_flight == 0)


def _masked_text_frame(payload: bytes) -> bytes:
    """One client-to-server WebSocket text frame (RFC 6455: masked; payload < 64 KiB)."""
    mask = b"\x01\x02\x03\x04"
    n = len(payload)
    head = bytes([0x81, 0x80 | n]) if n < 126 else bytes([0x81, 0x80 | 126]) + n.to_bytes(2)
    return head + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(payload))


def test_stream_guard_on_uvloop_transports() -> None:
    """uvloop's transports are not asyncio's classes: the guard still caps the kernel
    buffer and aborts a stalled client."""
    uvloop = pytest.importorskip("uvloop")
    limit = 16 * 1024

    async def main() -> tuple[int, int]:
        result: asyncio.Future[tuple[int, int]] = asyncio.get_running_loop().create_future()

        async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
            guard = StreamGuard(writer.transport, limit, "test")
            sndbuf = writer.get_extra_info("socket").getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
            written = 0
            try:
                while written < 50 * 2**20:
                    guard.check()
                    writer.write(b"x" * 2048)
                    written += 2048
                    await asyncio.sleep(0)
            except SlowReader:
                result.set_result((written, sndbuf))

        server = await asyncio.start_server(handle, "127.0.0.1", 0)
        client = non_reading_socket(server.sockets[0].getsockname()[1])
        try:
            return await asyncio.wait_for(result, 10)
        finally:
            client.close()
            server.close()

    written, sndbuf = uvloop.run(main())
    assert sndbuf <= 2 * limit  # Linux doubles what is asked for
    assert written < 1024 * 1024  # stopped near limit + kernel buffers, not megabytes on
