"""Soak: 2,000 requests with random parameters, random stop strings and 20% random client
aborts at concurrency 32, over the WebSocket, SSE and plain HTTP APIs.

Every request gets exactly one final answer (an aborted one: its client stops waiting,
or on the WebSocket a final frame with ``finish_reason: "abort"``), no request fails, no
KV page leaks, and no actor's memory grows beyond a bound of its size after warm-up.
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import re
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psutil
import pytest

from tests.support.client import get_json
from tests.support.server import Server, start_server, stop_server

#: 2,000 requests take minutes on 2 cores, more while other work shares them
pytestmark = [pytest.mark.slow, pytest.mark.timeout(3600)]

#: $HOUCHU_SOAK_REQUESTS overrides it (a shorter local run).
REQUESTS = int(os.environ.get("HOUCHU_SOAK_REQUESTS", "2000"))
CONCURRENCY = 32
ABORT_SHARE = 0.2
WARMUP = 128
#: An actor's RSS after the run may exceed its RSS after warm-up by this much (bytes) or
#: this fraction, whichever is larger. (The model runner's settles at a level that a
#: warm-up of a hundred requests does not reach: the CPU matmul library keeps state per
#: batch shape, and new shapes keep turning up for a few thousand requests. Measured
#: every 250 requests: 1177, 1258, 1345, 1374, 1456, 1471, 1468, 1517, 1547, 1545, 1548,
#: 1529, 1594, 1571 ... then 1585-1597 MiB from request 3,000 to 5,000.)
#: Seconds idle before each RSS reading: the runner returns its freed heap to the OS
#: about a second after its last step (``houchu.actors.heap``).
IDLE_S = 2.5
RSS_SLACK_BYTES = 96 * 2**20
RSS_SLACK_FRACTION = 0.5
#: A leak grows the RSS by the same amount per request, so in the second half of the run
#: as in the first; a level being approached grows less and less. The second half may add
#: at most this share of what the first half added, plus ``RSS_STEADY_BYTES``.
RSS_STEADY_SHARE = 0.6
RSS_STEADY_BYTES = 32 * 2**20

WORDS = "soup noodle kitchen stove pan salt ginger garlic rice broth chef order".split()
STOPS = [" the", ".", "\n", ",", "a", " and", "!", "es"]


@pytest.fixture(scope="module")
def srv(real_model_path: Path) -> Iterator[Server]:
    """The server under soak: serve's defaults (the GGUF's int4 weights on the measured
    decode route, what a user runs), not the exact float32 path of the golden tests:
    2,000 requests take 55 s instead of 87 s with torch held to AVX2 (its prefill steps
    run int8 activations), and the runner's RSS measured flat (1416 -> 1420 -> 1414
    MiB) where the float32 path's climbs (the figures above)."""
    s = start_server(
        real_model_path,
        "--max-context",
        "256",
        "--kv-cache-mb",
        "128",
        "--max-running-requests",
        str(CONCURRENCY),
        exact=False,
    )
    yield s
    stop_server(s)


def random_body(rng: random.Random, i: int) -> dict[str, Any]:
    """A short prompt (or chat) with random sampling parameters and stop strings."""
    text = " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 3))) + f" {i}"
    body: dict[str, Any] = {"max_tokens": rng.randint(1, 8)}
    if rng.random() < 0.5:
        body["prompt"] = text
    else:
        body["messages"] = [{"role": "user", "content": text}]
    if rng.random() < 0.5:
        body["temperature"] = rng.choice([0.0, 0.3, 0.7, 1.0, 1.5])
    if rng.random() < 0.3:
        body["top_p"] = rng.choice([0.1, 0.5, 0.9])
    if rng.random() < 0.3:
        body["top_k"] = rng.choice([1, 5, 50])
    if rng.random() < 0.2:
        body["min_p"] = rng.choice([0.05, 0.2])
    if rng.random() < 0.2:
        body["repetition_penalty"] = rng.choice([0.8, 1.1, 1.5])
    if rng.random() < 0.2:
        body["frequency_penalty"] = rng.uniform(-1, 1)
        body["presence_penalty"] = rng.uniform(-1, 1)
    if rng.random() < 0.3:
        body["seed"] = rng.randrange(1000)
    if rng.random() < 0.5:
        body["stop"] = rng.sample(STOPS, rng.randint(1, 3))
    if rng.random() < 0.2:
        body["ignore_eos"] = True
    return body


class Tally:
    """Outcomes by API; prints progress every ``every`` requests."""

    def __init__(self, every: int = 250) -> None:
        self.outcomes: Counter[str] = Counter()
        self.finish: Counter[str] = Counter()
        self.every = every
        self.t0 = time.perf_counter()

    def add(self, api: str, outcome: str, finish: str | None = None) -> None:
        self.outcomes[f"{api}:{outcome}"] += 1
        if finish is not None:
            self.finish[finish] += 1
        n = sum(self.outcomes.values())
        if n % self.every == 0:
            print(f"soak: {n} requests answered in {time.perf_counter() - self.t0:.0f} s")


async def ws_worker(
    session: aiohttp.ClientSession,
    srv: Server,
    jobs: list[tuple[int, dict, float | None]],
    tally: Tally,
) -> None:
    """Run ``jobs`` one after the other on one socket; each ends with exactly one final
    frame, and no frame of a finished request arrives later (except the one error frame
    that answers an abort sent after the request had finished)."""
    done: set[int] = set()
    abort_sent: set[int] = set()
    late: set[int] = set()
    async with session.ws_connect(srv.ws_url) as ws:

        async def until_final(rid: int) -> dict:
            while True:
                frame = await ws.receive_json(timeout=300)
                fid = frame["id"]
                if fid in done:
                    assert fid in abort_sent and fid not in late, f"after the final: {frame}"
                    assert frame["type"] == "error", frame
                    assert frame["error"]["code"] == "not_in_flight", frame
                    late.add(fid)
                    continue
                assert frame["type"] != "error", frame
                if fid == rid and frame["type"] == "final":
                    done.add(rid)
                    return frame

        for rid, body, abort_after in jobs:
            await ws.send_json({"id": rid, **body})
            if abort_after is not None:
                await asyncio.sleep(abort_after)
                await ws.send_json({"type": "abort", "id": rid})
                abort_sent.add(rid)
            frame = await until_final(rid)
            kind = "aborted" if frame["finish_reason"] == "abort" else "final"
            tally.add("ws", kind, frame["finish_reason"])
        sentinel = 10**9
        await ws.send_json({"id": sentinel, "prompt": "end", "max_tokens": 1})
        await until_final(sentinel)


async def http_one(
    session: aiohttp.ClientSession,
    srv: Server,
    body: dict,
    stream: bool,
    abort_after: float | None,
    tally: Tally,
) -> None:
    api = "sse" if stream else "http"
    path = "/v1/chat/completions" if "messages" in body else "/v1/completions"

    async def call() -> None:
        async with session.post(srv.url + path, json={**body, "stream": stream}) as r:
            assert r.status == 200, await r.text()
            if not stream:
                data = await r.json()
                tally.add(api, "final", data["choices"][0]["finish_reason"])
                return
            finishes, done = [], False
            async for raw in r.content:
                line = raw.decode().strip()
                if line == "data: [DONE]":
                    done = True
                elif line.startswith("data: "):
                    chunk = json.loads(line[6:])
                    assert "error" not in chunk, chunk
                    for c in chunk.get("choices", []):
                        if c.get("finish_reason"):
                            finishes.append(c["finish_reason"])
            assert done and len(finishes) == 1, (done, finishes)
            tally.add(api, "final", finishes[0])

    if abort_after is None:
        await call()
        return
    task = asyncio.create_task(call())
    await asyncio.sleep(abort_after)
    if task.done():
        await task  # it finished first: its one answer was checked
        return
    task.cancel()  # the client goes away
    try:
        await task
    except asyncio.CancelledError:
        tally.add(api, "aborted")


def actor_rss(srv: Server) -> dict[str, int]:
    pids = dict(re.findall(r"houchu: (\w+) ready \(pid (\d+)\)", srv.output()))
    return {name: psutil.Process(int(pid)).memory_info().rss for name, pid in pids.items()}


async def idle_stats(srv: Server, timeout_s: float = 120.0) -> dict[str, Any]:
    deadline = time.monotonic() + timeout_s
    while True:
        status, s = await get_json(f"{srv.url}/stats")
        if status == 200 and s["in_flight"] == 0 and s["num_running"] == 0:
            if s["num_waiting"] == 0 and s["num_pages_used"] == s["num_pages_cached"]:
                return s
        assert time.monotonic() < deadline, f"pages leak or the engine is not idle: {s}"
        await asyncio.sleep(0.5)


async def run_load(srv: Server, n: int, seed: int, tally: Tally) -> None:
    """``n`` requests at ``CONCURRENCY``: a third on WebSockets (one socket per worker),
    the rest SSE and plain HTTP; ``ABORT_SHARE`` of them aborted by the client."""
    rng = random.Random(seed)
    jobs = []
    for i in range(n):
        abort = rng.uniform(0.0, 0.6) if rng.random() < ABORT_SHARE else None
        jobs.append((i, random_body(rng, i), abort, rng.choice(["ws", "sse", "http"])))
    ws_jobs = [(i, b, a) for i, b, a, api in jobs if api == "ws"]
    http_jobs = [(b, api == "sse", a) for _, b, a, api in jobs if api != "ws"]
    n_ws = CONCURRENCY // 3
    conn = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=conn) as s:
        sem = asyncio.Semaphore(CONCURRENCY - n_ws)

        async def bounded(body: dict, stream: bool, abort: float | None) -> None:
            async with sem:
                await http_one(s, srv, body, stream, abort, tally)

        workers = [ws_worker(s, srv, ws_jobs[k::n_ws], tally) for k in range(n_ws)]
        await asyncio.gather(*workers, *(bounded(*j) for j in http_jobs))


def test_soak(srv: Server) -> None:
    async def go():
        await run_load(srv, WARMUP, 1, Tally(every=WARMUP))
        await idle_stats(srv)
        await asyncio.sleep(IDLE_S)
        rss_warm = actor_rss(srv)
        tally = Tally()
        t0 = time.perf_counter()
        half = REQUESTS // 2
        await run_load(srv, half, 2, tally)
        await idle_stats(srv)  # no page leaks half way either
        await asyncio.sleep(IDLE_S)
        rss_half = actor_rss(srv)
        await run_load(srv, REQUESTS - half, 3, tally)
        elapsed = time.perf_counter() - t0
        stats = await idle_stats(srv)
        await asyncio.sleep(IDLE_S)
        return tally, elapsed, stats, rss_warm, rss_half, actor_rss(srv)

    tally, elapsed, stats, rss0, rss_half, rss1 = asyncio.run(go())
    total = sum(tally.outcomes.values())
    aborted = sum(v for k, v in tally.outcomes.items() if ":abort" in k)
    mib = 2**20
    growth = {
        k: f"{rss0[k] / mib:.0f}->{rss_half[k] / mib:.0f}->{rss1[k] / mib:.0f} MiB" for k in rss0
    }
    print(
        f"soak: {total} requests in {elapsed:.0f} s; {dict(sorted(tally.outcomes.items()))}; "
        f"finish reasons {dict(tally.finish)}; client aborts {aborted}; "
        f"pages used {stats['num_pages_used']} = cached {stats['num_pages_cached']} of "
        f"{stats['num_pages_total']}; RSS after warm-up -> half -> end {growth}"
    )
    assert total == REQUESTS  # exactly one answer (or client abort) each
    assert aborted >= REQUESTS * ABORT_SHARE / 3  # aborts really happened mid-request
    assert tally.finish["stop"] > 0 and tally.finish["length"] > 0
    for name in rss0:
        # bounded: within a bound of the size after warm-up ...
        bound = rss0[name] + max(RSS_SLACK_BYTES, RSS_SLACK_FRACTION * rss0[name])
        assert rss1[name] <= bound, (name, growth[name])
        # ... and no leak per request: the second half adds less than the first did
        first = max(rss_half[name] - rss0[name], 0)
        steady = rss_half[name] + RSS_STEADY_SHARE * first + RSS_STEADY_BYTES
        assert rss1[name] <= steady, (name, growth[name])
