"""Data parallel on one machine: ``houchu serve --data-parallel-size 2`` (one thread per
replica) behind SGLang's Model Gateway (``smg``).

One server for the module. The tests send tiny requests (2-16 tokens) through the
router: shared system prompts land with affinity (their repeats report
``cached_tokens`` of at least half the prompt); ``cache_aware`` finds more of the
prompts cached than ``round_robin`` on the same sequence (a second ``smg`` in front of
the same replicas); with a low balance threshold a burst spills to both replicas; the
replicas' dashboard lists both with the policy, and each replica's ``/metrics``
answers. Last, a replica is killed (its whole process group) while streams run: every
request gets exactly one final answer, new requests succeed within a bounded time, and
the launcher brings the replica back.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from houchu.cluster.router import RouterMissing, find_smg, router_command
from tests.support.server import Server, free_port, start_server, stop_server

try:
    SMG = find_smg()
except RouterMissing as e:  # the cluster extra (also in the test extra) is not installed
    pytestmark = [pytest.mark.slow, pytest.mark.skip(reason=str(e))]
    SMG = ""
else:
    pytestmark = pytest.mark.slow

MODEL = "SmolLM2-135M-Instruct"
#: Seconds within which new requests must succeed after a replica is killed.
SERVE_AGAIN_S = 30.0
#: Seconds within which the killed replica must be back in the router's rotation.
RECOVERY_S = 240.0


@pytest.fixture(scope="module")
def cluster(real_model_path: Path) -> Iterator[Server]:
    srv = start_server(
        real_model_path,
        "--data-parallel-size", "2",
        "--threads", "2",
        "--kv-cache-mb", "128",
        "--disable-telemetry",
        exact=False,
        timeout_s=600,
    )  # fmt: skip
    yield srv
    stop_server(srv, timeout_s=60)


def dashboard_url(srv: Server) -> str:
    return f"http://127.0.0.1:{srv.port + 3}/dashboard"  # port + N + 1 with N = 2


async def get_json(url: str) -> Any:
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        assert r.status == 200, await r.text()
        return await r.json()


async def chat(base: str, system: str, question: str, max_tokens: int = 2) -> dict[str, Any]:
    body = {
        "model": MODEL,
        "messages": [{"role": "system", "content": system}, {"role": "user", "content": question}],
        "max_tokens": max_tokens,
        "temperature": 0,
    }
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        async with s.post(f"{base}/v1/chat/completions", json=body) as r:
            assert r.status == 200, await r.text()
            return (await r.json())["usage"]


def system_prompt(topic: str) -> str:
    """A long system prompt (about 250 tokens) that differs from others from its start."""
    salt = uuid.uuid4().hex[:8]
    return f"{salt} {topic}. " + f"You answer questions about {topic} with care and detail. " * 18


class ExtraRouter:
    """A second smg in front of the cluster's replicas, with its own policy and flags.

    It is stopped only once nothing is in flight through it, so it gets no shutdown
    grace period: with houchu's 10 s, smg takes 5 s to exit on SIGTERM even when idle.
    """

    def __init__(self, srv: Server, policy: str, extra: str = "") -> None:
        self.port = free_port()
        cmd = router_command(
            SMG,
            host="127.0.0.1",
            port=self.port,
            worker_urls=[f"http://127.0.0.1:{srv.port + 1 + i}" for i in range(2)],
            policy=policy,
            metrics_port=free_port(),
            extra=f"--shutdown-grace-period-secs 0 {extra}",
        )
        self.proc = subprocess.Popen(cmd)
        self.url = f"http://127.0.0.1:{self.port}"

    async def wait_ready(self, timeout_s: float = 60.0) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                workers = await get_json(f"{self.url}/workers")
                if sum(w["status"] == "ready" for w in workers["workers"]) == 2:
                    return
            except (aiohttp.ClientError, AssertionError):
                pass
            await asyncio.sleep(0.5)
        raise AssertionError("the extra smg did not list both replicas ready")

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


async def replica_finished(srv: Server) -> list[int]:
    return [
        (await get_json(f"http://127.0.0.1:{srv.port + 1 + i}/stats"))["num_finished"]
        for i in range(2)
    ]


async def test_dashboard_lists_every_replica_and_the_policy(cluster: Server):
    snap = await get_json(f"{dashboard_url(cluster)}/api/replicas")
    assert snap["policy"] == "cache_aware"
    reps = snap["replicas"]
    assert [r["state"] for r in reps] == ["ready", "ready"]
    assert [r["threads"] for r in reps] == [1, 1]
    assert all(r["health"] == "ok" and r["router"]["status"] == "ready" for r in reps)
    async with aiohttp.ClientSession() as s:
        async with s.get(dashboard_url(cluster)) as page:
            assert page.status == 200 and "Replicas" in await page.text()
        for r in reps:  # each replica's own /metrics stays reachable
            async with s.get(r["metrics_url"]) as m:
                text = await m.text()
                assert m.status == 200 and "vllm:num_requests_running" in text
                assert "vllm:gpu_cache_usage_perc" in text


async def test_shared_system_prompts_land_with_affinity(cluster: Server):
    a, b = system_prompt("the harbour of Rotterdam"), system_prompt("medieval French poetry")
    for i in range(3):
        for name, prompt in (("a", a), ("b", b)):
            usage = await chat(cluster.url, prompt, f"Question {i} about {name}?")
            if i > 0:
                cached = usage["prompt_tokens_details"]["cached_tokens"]
                assert cached >= usage["prompt_tokens"] / 2, (name, i, usage)


async def hit_rate(base: str, topics: list[str]) -> float:
    """Each topic's system prompt twice in a row; prompt tokens cached / prompt tokens."""
    cached = total = 0
    for topic in topics:
        prompt = system_prompt(topic)
        for i in range(2):
            usage = await chat(base, prompt, f"Question {i}?")
            cached += usage["prompt_tokens_details"]["cached_tokens"]
            total += usage["prompt_tokens"]
    return cached / total


async def test_cache_aware_hits_more_than_round_robin(cluster: Server):
    topics = ["glaciers", "opera", "beekeeping"]
    rr = ExtraRouter(cluster, "round_robin")
    try:
        await rr.wait_ready()
        rate_rr = await hit_rate(rr.url, topics)
    finally:
        rr.stop()
    rate_ca = await hit_rate(cluster.url, topics)
    print(f"prefix hit rate: cache_aware {rate_ca:.2f}, round_robin {rate_rr:.2f}")
    assert rate_ca > rate_rr


async def test_a_burst_spills_to_both_replicas(cluster: Server):
    spill = ExtraRouter(
        cluster, "cache_aware", "--balance-abs-threshold 1 --balance-rel-threshold 1.0"
    )
    try:
        await spill.wait_ready()
        prompt = system_prompt("one shared prefix")
        await chat(spill.url, prompt, "warm?")  # the prefix now lives on one replica
        before = await replica_finished(cluster)
        await asyncio.gather(*(chat(spill.url, prompt, f"Q{i}?", 16) for i in range(8)))
        after = await replica_finished(cluster)
    finally:
        spill.stop()
    served = [x - y for x, y in zip(after, before, strict=True)]
    assert sum(served) >= 8 and min(served) >= 1, served


async def stream_finals(base: str, i: int, started: asyncio.Event) -> dict[str, Any]:
    """One SSE chat stream; counts its final answers: chunks with a finish_reason, and
    error events. Sets ``started`` at its first token."""
    body = {
        "model": MODEL,
        "messages": [{"role": "user", "content": f"Tell a long story number {i}."}],
        # long enough that the kill lands mid-stream even when the replicas table the
        # victim is picked from lags by a few seconds (128 tokens ended first once)
        "max_tokens": 384,
        "ignore_eos": True,
        "stream": True,
    }
    out: dict[str, Any] = {"finals": 0, "errors": 0, "tokens": 0, "status": None}
    timeout = aiohttp.ClientTimeout(total=180)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as s:
            async with s.post(f"{base}/v1/chat/completions", json=body) as r:
                out["status"] = r.status
                if r.status != 200:
                    out["finals"] += 1  # one error answer before any output
                    return out
                async for raw in r.content:
                    line = raw.decode().strip()
                    if not line.startswith("data: ") or line == "data: [DONE]":
                        continue
                    chunk = json.loads(line[len("data: ") :])
                    if "error" in chunk:
                        out["finals"] += 1
                        out["errors"] += 1
                    for c in chunk.get("choices", []):
                        out["tokens"] += bool(c.get("delta", {}).get("content"))
                        started.set()
                        out["finals"] += c.get("finish_reason") is not None
    except aiohttp.ClientPayloadError:
        out["cut"] = True  # the connection closed without a final answer
    return out


async def busiest_replica(srv: Server, timeout_s: float = 30.0) -> dict[str, Any]:
    """The replica running the most requests, once one runs some: read from each
    replica's own ``/stats`` now (the dashboard's table is polled each second, and a
    replica that ran a request a second ago may be idle now); its row of the dashboard's
    table (pid, index) is returned."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        running = []
        for i in range(2):
            st = await get_json(f"http://127.0.0.1:{srv.port + 1 + i}/stats")
            running.append(st.get("num_running") or 0)
        if max(running) >= 1:
            snap = await get_json(f"{dashboard_url(srv)}/api/replicas")
            return snap["replicas"][running.index(max(running))]
        await asyncio.sleep(0.2)
    raise AssertionError("no replica runs the streams")


async def test_replica_killed_mid_run(cluster: Server):
    started = asyncio.Event()
    streams = [asyncio.create_task(stream_finals(cluster.url, i, started)) for i in range(6)]
    await asyncio.wait_for(started.wait(), 60)
    victim = await busiest_replica(cluster)  # streams are in flight on it
    os.killpg(victim["pid"], signal.SIGKILL)
    killed_at = time.monotonic()
    first_ok = None
    while first_ok is None and time.monotonic() - killed_at < SERVE_AGAIN_S:
        try:
            await chat(cluster.url, "Be brief.", "Say hi.", 2)
            first_ok = time.monotonic() - killed_at
        except (AssertionError, aiohttp.ClientError, asyncio.TimeoutError):
            await asyncio.sleep(0.5)
    results = await asyncio.wait_for(asyncio.gather(*streams), 200)
    assert first_ok is not None, f"no request succeeded within {SERVE_AGAIN_S} s of the kill"
    for r in results:
        assert r["finals"] == 1 and not r.get("cut"), results
    # streams that had started on the victim end with the router's error event; those
    # not yet started there were retried on the other replica and finished
    assert sum(r["errors"] for r in results) >= 1, results
    print(f"served again {first_ok:.1f} s after the kill; streams: {results}")
    deadline = time.monotonic() + RECOVERY_S
    while time.monotonic() < deadline:
        snap = await get_json(f"{dashboard_url(cluster)}/api/replicas")
        rep = snap["replicas"][victim["index"]]
        back = rep["restarts"] >= 1 and rep["state"] == "ready"
        if back and (rep["router"] or {}).get("status") == "ready":
            break
        await asyncio.sleep(0.25)
    else:
        raise AssertionError(f"the killed replica is not back in rotation: {snap}")
    assert rep["restarts"] == 1 and rep["pid"] != victim["pid"]
    assert f"replica {victim['index']} died" in cluster.output()


def test_an_api_key_guards_router_and_replicas(tmp_path: Path):
    """``--api-key`` with ``--data-parallel-size 2`` (a tiny model, round robin): the
    server starts (the launcher asks smg's ``/workers`` with the key), a request without
    the key gets 401 from smg and one with it an answer from a replica, and the
    replicas' dashboard has their ``/stats`` (polled with the key)."""
    from houchu.devtools.tiny_models import make_tiny_llama, write_tiny_tokenizer

    path = write_tiny_tokenizer(make_tiny_llama(tmp_path / "tiny", seed=3), 128)
    srv = start_server(
        path,
        "--data-parallel-size", "2", "--threads", "2", "--num-pages", "64",
        "--router-policy", "round_robin", "--api-key", "sekret123", "--disable-telemetry",
        timeout_s=300,
    )  # fmt: skip
    try:
        asyncio.run(_ask_with_and_without_the_key(srv))
    finally:
        stop_server(srv, timeout_s=60)


async def _ask_with_and_without_the_key(srv: Server) -> None:
    auth = {"Authorization": "Bearer sekret123"}
    body = {"prompt": "abc", "max_tokens": 3, "temperature": 0, "ignore_eos": True}
    timeout = aiohttp.ClientTimeout(total=120)
    async with aiohttp.ClientSession(timeout=timeout) as s:
        async with s.get(f"{srv.url}/workers") as r:
            assert r.status == 401
        async with s.get(f"{srv.url}/workers", headers=auth) as r:
            workers = (await r.json())["workers"]
        assert [w["status"] for w in workers] == ["ready", "ready"], workers
        async with s.get(f"{srv.url}/v1/models", headers=auth) as r:
            assert r.status == 200, await r.text()
            body["model"] = (await r.json())["data"][0]["id"]
        async with s.post(f"{srv.url}/v1/completions", json=body) as r:
            assert r.status == 401, await r.text()
        async with s.post(f"{srv.url}/v1/completions", json=body, headers=auth) as r:
            assert r.status == 200, await r.text()
            got = await r.json()
        assert got["usage"]["completion_tokens"] == 3
        deadline = time.monotonic() + 10  # the launcher polls the replicas twice a second
        while True:
            async with s.get(f"{dashboard_url(srv)}/api/replicas") as r:
                rows = (await r.json())["replicas"]
            assert all(row["num_finished"] is not None for row in rows), rows
            if sum(row["num_finished"] for row in rows) == 1 or time.monotonic() > deadline:
                break
            await asyncio.sleep(0.5)
        assert sum(row["num_finished"] for row in rows) == 1, rows
