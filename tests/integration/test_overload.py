"""Overload on a real server: a flood against the admission bound, and a client that does
not read its stream.

One server (module scope) with ``--max-queued-requests 50`` and a 16 KiB stream buffer.
"""

from __future__ import annotations

import asyncio
import json
import re
import socket
import statistics
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from tests.support.client import get_json
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

QUEUE_LIMIT = 50
FLOOD = 200
WS_SHARE = 40  # of the flood, sent over 4 WebSockets
#: Gateway RSS may grow by at most this much over a flood (bytes).
RSS_BOUND = 64 * 2**20


@pytest.fixture(scope="module")
def srv(real_model_path: Path) -> Iterator[Server]:
    s = start_server(
        real_model_path,
        "--kv-cache-mb",
        "128",
        "--max-queued-requests",
        str(QUEUE_LIMIT),
        "--stream-buffer-kb",
        "16",
        "--max-context",
        "512",
    )
    yield s
    stop_server(s)


def actor_pids(srv: Server) -> dict[str, int]:
    """The actors' process ids, from their ready lines."""
    found = re.findall(r"houchu: (\w+) ready \(pid (\d+)\)", srv.output())
    return {name: int(pid) for name, pid in found}


async def idle(srv: Server, timeout_s: float = 60.0) -> dict[str, Any]:
    """Wait until nothing is in flight and no page is held but by the cache."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, s = await get_json(f"{srv.url}/stats")
        if status == 200 and s["in_flight"] == 0 and s["num_running"] == 0:
            if s["num_waiting"] == 0 and s["num_pages_used"] == s["num_pages_cached"]:
                return s
        assert time.monotonic() < deadline, f"not idle: {s}"
        await asyncio.sleep(0.2)


async def _http(session: aiohttp.ClientSession, url: str, i: int) -> tuple[str, float, Any]:
    body = {"prompt": f"Count to ten: {i}", "max_tokens": 8, "temperature": 0}
    t0 = time.perf_counter()
    async with session.post(f"{url}/v1/completions", json=body) as r:
        data = await r.json(content_type=None)
        dt = time.perf_counter() - t0
        if r.status == 200:
            assert data["choices"][0]["finish_reason"] in ("length", "stop")
            return "done", dt, None
        assert r.status in (429, 503), (r.status, data)
        assert int(r.headers["Retry-After"]) >= 1
        assert set(data) == {"error"} and data["error"]["message"]
        return "refused", dt, r.status


async def _ws(session: aiohttp.ClientSession, url: str, base: int, n: int) -> list[tuple]:
    out = []
    async with session.ws_connect(url) as ws:
        t0 = time.perf_counter()
        for i in range(n):
            await ws.send_json({"id": i, "prompt": f"Count: {base + i}", "max_tokens": 8})
        pending = set(range(n))
        while pending:
            frame = await ws.receive_json(timeout=120)
            if frame["type"] == "final":
                pending.discard(frame["id"])
                out.append(("done", time.perf_counter() - t0, None))
            elif frame["type"] == "error":
                assert frame["status"] in (429, 503), frame
                assert frame["retry_after"] >= 1
                pending.discard(frame["id"])
                out.append(("refused", time.perf_counter() - t0, frame["status"]))
    return out


def test_flood_is_refused_quickly_and_the_admitted_complete(srv: Server) -> None:
    gateway = psutil.Process(actor_pids(srv)["gateway"])

    async def go() -> list[tuple]:
        await idle(srv)
        conn = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=conn) as s:
            # warm up the paths once, then measure the gateway's memory
            await _http(s, srv.url, -1)
            rss0 = gateway.memory_info().rss
            n_http = FLOOD - WS_SHARE
            tasks = [_http(s, srv.url, i) for i in range(n_http)]
            tasks += [_ws(s, srv.ws_url, n_http + 10 * k, 10) for k in range(WS_SHARE // 10)]
            results = await asyncio.gather(*tasks)
            rss1 = gateway.memory_info().rss
        flat = [r for r in results if isinstance(r, tuple)]
        flat += [x for r in results if isinstance(r, list) for x in r]
        stats = await idle(srv)
        return flat, rss0, rss1, stats

    flat, rss0, rss1, stats = asyncio.run(go())
    done = [r for r in flat if r[0] == "done"]
    refused = [r for r in flat if r[0] == "refused"]
    refused_s = [r[1] for r in refused if r[2] == 429]
    print(
        f"flood: {len(flat)} requests, {len(done)} completed, {len(refused)} refused "
        f"(429: {len(refused_s)}), median refusal {statistics.median(refused_s):.3f} s, "
        f"gateway RSS {rss0 / 2**20:.0f} -> {rss1 / 2**20:.0f} MiB"
    )
    assert len(flat) == FLOOD
    assert len(done) >= QUEUE_LIMIT  # the admitted ones all complete
    assert len(refused) >= FLOOD - 2 * QUEUE_LIMIT  # the excess is refused ...
    assert statistics.median(refused_s) < 1.0  # ... quickly
    assert rss1 - rss0 < RSS_BOUND
    assert stats["num_refused_overload"] >= len(refused_s)


def _non_reading_client(port: int, body: dict[str, Any]) -> socket.socket:
    """Send a streaming request from a socket with a tiny receive buffer, never read."""
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.connect(("127.0.0.1", port))
    raw = json.dumps(body).encode()
    s.sendall(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(raw)}\r\n\r\n".encode()
        + raw
    )
    return s


async def _timed_stream(url: str, i: int) -> tuple[float, float]:
    """One ordinary stream: (seconds in all, longest gap between chunks)."""
    body = {"prompt": f"Tell me about soup number {i}.", "max_tokens": 24, "stream": True}
    body.update(ignore_eos=True, temperature=0)
    gaps, t0 = [], time.perf_counter()
    last = t0
    async with aiohttp.ClientSession() as s, s.post(f"{url}/v1/completions", json=body) as r:
        assert r.status == 200
        async for line in r.content:
            if line.startswith(b"data: "):
                now = time.perf_counter()
                gaps.append(now - last)
                last = now
    return last - t0, max(gaps[1:] or [0.0])


def test_a_client_that_does_not_read_is_aborted_and_others_stream_on(srv: Server) -> None:
    async def streams(n: int) -> list[tuple[float, float]]:
        return await asyncio.gather(*(_timed_stream(srv.url, i) for i in range(n)))

    async def go():
        await idle(srv)
        baseline = await streams(3)
        before = srv.output().count("is not reading")
        # a long answer with 20 alternatives per token: ~3 KiB per chunk
        body = {
            "messages": [{"role": "user", "content": "Write a very long story."}],
            "max_tokens": 400,
            "ignore_eos": True,
            "logprobs": True,
            "top_logprobs": 20,
            "stream": True,
        }
        sock = _non_reading_client(srv.port, body)
        try:
            during = await streams(3)
            deadline = time.monotonic() + 120
            while srv.output().count("is not reading") == before:
                assert time.monotonic() < deadline, "the stalled stream was not aborted"
                await asyncio.sleep(0.2)
            stats = await idle(srv)  # aborted in the engine while the socket is still open
        finally:
            sock.close()
        return baseline, during, stats

    baseline, during, stats = asyncio.run(go())
    base_s = max(t for t, _ in baseline)
    during_s = max(t for t, _ in during)
    gap = max(g for _, g in during)
    print(
        f"slow reader: streams took {base_s:.2f} s alone, {during_s:.2f} s beside it "
        f"(longest gap {gap:.2f} s)"
    )
    assert during_s < 3 * base_s + 5.0
    assert gap < 10.0  # no stream waits on the stalled one (2 busy shared cores: generous)
    assert stats["in_flight"] == 0
