"""Where a served token's time goes (``/stats`` ``token_path``): after greedy requests
streamed one at a time, every component is there, the cycle's components add up to the
cycle, and the cycle's mean is the inter-token latency the gateway and the client
measured, with the overlap scheduler off (the default on 2 cores) and on (the next plan
waits at the runner, queued behind the step in flight)."""

from __future__ import annotations

import asyncio
import statistics
from collections.abc import Iterator

import pytest

from houchu.api.token_path import CYCLE, FIELDS
from houchu.bench.served.token_path import ClientTimes, stats, stream_one
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

TOKENS = 40
REQUESTS = 2


@pytest.fixture(scope="module", params=["off", "on"])
def srv(real_model_path, request) -> Iterator[Server]:
    server = start_server(
        real_model_path, "--kv-cache-mb", "64", "--overlap-schedule", request.param
    )
    yield server
    stop_server(server)


def test_breakdown_adds_up_to_the_measured_itl(srv: Server) -> None:
    asyncio.run(stream_one(srv.ws_url, 8, None))  # warm-up, not measured
    since = stats(srv.ws_url)["token_path"]["last_sample"]
    client = ClientTimes()
    for _ in range(REQUESTS):
        asyncio.run(stream_one(srv.ws_url, TOKENS, client))
    tp = stats(srv.ws_url, since)["token_path"]
    assert tp["samples"] >= REQUESTS * (TOKENS - 1) - 4  # a delta held back pairs with none
    comps = tp["components"]
    assert set(comps) == set(FIELDS)
    for name in FIELDS:
        c = comps[name]
        assert c["p50_ms"] <= c["p90_ms"] + 1e-9, name
        assert c["mean_ms"] >= -0.01, name  # durations between stamps of one clock
    assert comps["forward"]["mean_ms"] > 0 and comps["forward"]["share"] > 0.1
    parts = sum(comps[name]["mean_ms"] for name in CYCLE)
    assert parts == pytest.approx(comps["cycle"]["mean_ms"], rel=1e-6)
    itl = comps["itl"]["mean_ms"]
    assert comps["cycle"]["mean_ms"] == pytest.approx(itl, rel=0.1)  # steady state
    client_itl = statistics.fmean(client.itl) * 1e3
    assert itl == pytest.approx(client_itl, rel=0.15, abs=0.5)
    assert comps["latency"]["mean_ms"] > 0
