"""Overlap scheduler on vs off (``--overlap-schedule off``): identical greedy tokens
through the API for concurrent requests that end in different ways (max_tokens, EOS, a
stop string); /stats shows the scheduler time the overlap hid, and /metrics its lever."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterator

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.client import get_json, ws_generate
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

BODIES = [
    {"prompt": "The three primary colors are", "max_tokens": 5, "ignore_eos": True},
    {"prompt": "In mathematics, a prime number is", "max_tokens": 33, "ignore_eos": True},
    {"messages": [{"role": "user", "content": "Say hi."}], "max_tokens": 64},  # ends on EOS
    {"prompt": "def fibonacci(n):\n    ", "max_tokens": 1},
    {"messages": [{"role": "user", "content": "Name a fruit."}], "max_tokens": 48},
    {"prompt": "北京是", "max_tokens": 17, "ignore_eos": True},
]
STOP_BODY = {
    "prompt": "Once upon a time, in a small village,",
    "max_tokens": 40,
    "ignore_eos": True,
}


@pytest.fixture(scope="module")
def servers(real_model_path, tmp_path_factory) -> Iterator[tuple[Server, Server]]:
    """(overlap on, with its own telemetry database; overlap off)."""
    db = tmp_path_factory.mktemp("overlap") / "on.db"
    on = start_server(
        real_model_path,
        "--kv-cache-mb",
        "64",
        "--overlap-schedule",
        "on",
        "--db-url",
        f"sqlite:///{db}",
    )
    try:
        off = start_server(real_model_path, "--kv-cache-mb", "64", "--overlap-schedule", "off")
    except BaseException:
        stop_server(on)
        raise
    yield on, off
    stop_server(on)
    stop_server(off)


async def _together(srv: Server, bodies: list[dict]) -> list[dict]:
    return await asyncio.gather(*(ws_generate(srv.ws_url, {**b, "temperature": 0}) for b in bodies))


def _answers(results: list[dict]) -> list[tuple]:
    assert all(r["error"] is None for r in results), results
    return [(r["token_ids"], r["text"], r["final"]["finish_reason"]) for r in results]


def test_same_tokens_with_overlap_on_and_off(servers):
    on, off = servers
    ref = asyncio.run(ws_generate(off.ws_url, {**STOP_BODY, "temperature": 0}))
    deltas = [d for d in ref["deltas"] if len(d) >= 3]
    stop = deltas[len(deltas) // 2][-3:]  # a stop string from the middle of the answer
    bodies = [*BODIES, {**STOP_BODY, "stop": [stop]}]
    want = _answers(asyncio.run(_together(off, bodies)))
    got = _answers(asyncio.run(_together(on, bodies)))
    assert got == want
    reasons = [w[2] for w in want]
    assert reasons.count("length") >= 3 and reasons[-1] == "stop"
    assert "stop" in reasons[:-1], "expected one answer to end on EOS"
    assert stop not in want[-1][1]


async def _idle_stats(srv: Server, timeout_s: float = 30.0) -> dict:
    """``/stats`` once nothing runs and no step is in flight (a release-only step may
    still run just after the clients got their final frames, the more so on busy
    cores); the last reading if that does not happen within ``timeout_s`` seconds."""
    deadline = time.monotonic() + timeout_s
    while True:
        _, st = await get_json(f"{srv.url}/stats")
        idle = st["num_running"] == 0 and st["step_in_flight"] == 0
        if idle or time.monotonic() > deadline:
            return st
        await asyncio.sleep(0.05)


def test_stats_show_the_hidden_scheduler_time(servers):
    on, off = servers
    asyncio.run(_together(on, BODIES))
    asyncio.run(_together(off, BODIES))
    st_on = asyncio.run(_idle_stats(on))
    st_off = asyncio.run(_idle_stats(off))
    assert st_on["overlap_schedule"] == 1 and st_off["overlap_schedule"] == 0
    assert st_on["overlap_hidden_s"] > 0
    # after each request's first step, steps are planned ahead (a request's last token
    # and a release-only plan are the exceptions)
    assert st_on["overlap_steps_ahead"] > 0.7 * st_on["num_steps"], st_on
    assert 0 < st_on["overlap_hidden_fraction"] <= 1
    assert st_off["overlap_hidden_s"] == 0 and st_off["overlap_steps_ahead"] == 0
    for st in (st_on, st_off):  # every page is back (free or cached), nothing runs
        assert st["num_pages_free"] + st["num_pages_cached"] == st["num_pages_total"]
        assert st["num_running"] == 0 and st["step_in_flight"] == 0


def test_metrics_export_the_overlap_lever(servers):
    on, _ = servers
    asyncio.run(_together(on, BODIES))
    lever = "houchu_lever_saved_total{lever=overlap_scheduler,unit=seconds,verb=fill}"
    deadline = time.monotonic() + 30  # the recorder writes lever samples in batches
    while True:
        got = _scrape(on)
        if got.get(lever, 0) > 0:
            break
        assert time.monotonic() < deadline, sorted(k for k in got if "lever" in k)
        time.sleep(0.5)
    assert got["houchu_overlap_hidden_seconds{}"] > 0


def _scrape(srv: Server) -> dict[str, float]:
    async def get() -> str:
        async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/metrics") as r:
            assert r.status == 200
            return await r.text()

    out = {}
    for fam in text_string_to_metric_families(asyncio.run(get())):
        for smp in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(smp.labels.items()))
            out[f"{smp.name}{{{labels}}}"] = smp.value
    return out
