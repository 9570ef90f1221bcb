"""What routers read about a replica: ``/version``, ``/model_info``, ``/server_info``
(and SGLang's ``get_`` spellings), ``/v1/models`` and the vLLM-named Prometheus series,
against a fake engine."""

from __future__ import annotations

from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from houchu.api.app import make_app
from houchu.api.server_info import houchu_version
from tests.support.fake_api import FakeEngine

STATS = {"model": "fake", "num_running": 3, "num_waiting": 2, "num_pages_total": 100}
STATS |= {"num_pages_used": 25, "page_size": 16}
STATS |= {"prefix_tokens_queried": 640, "prefix_tokens_reused": 160}


class StatsEngine(FakeEngine):
    async def stats(self):
        return dict(STATS)


def client() -> TestClient:
    app = make_app(StatsEngine(), model_name="fake", max_context=512)
    return TestClient(TestServer(app, host="127.0.0.1"))


async def test_version_model_info_and_server_info():
    async with client() as c:
        v = await (await c.get("/version")).json()
        assert v == {"version": houchu_version()} and v["version"] != "unknown"
        for path in ("/model_info", "/get_model_info"):
            info = await (await c.get(path)).json()
            assert info["model_path"] == "fake" and info["is_generation"] is True
            assert info["max_model_len"] == 512
        for path in ("/server_info", "/get_server_info"):
            resp = await c.get(path)
            assert resp.status == 200
            s = await resp.json()
            assert s["version"] == v["version"] and s["context_length"] == 512
            assert s["max_total_num_tokens"] == 1600  # 100 pages x 16 tokens
            assert (s["num_running_requests"], s["num_waiting_requests"]) == (3, 2)
        models = await (await c.get("/v1/models")).json()
        (m,) = models["data"]
        assert m["owned_by"] == "houchu" and m["max_model_len"] == 512


async def test_vllm_named_metrics():
    async with client() as c:
        text = await (await c.get("/metrics")).text()
    got = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }
    label = (("model_name", "fake"),)
    assert got[("vllm:num_requests_running", label)] == 3
    assert got[("vllm:num_requests_waiting", label)] == 2
    assert got[("vllm:kv_cache_usage_perc", label)] == 0.25
    assert got[("vllm:gpu_cache_usage_perc", label)] == 0.25  # smg's load poller reads it
    assert got[("vllm:gpu_prefix_cache_hit_rate", label)] == 0.25
    assert got[("vllm:prefix_cache_queries_total", label)] == 640
    assert got[("vllm:prefix_cache_hits_total", label)] == 160


async def test_the_vllm_gauges_are_labelled_with_the_served_model_name():
    """Routers match the ``model_name`` label to the id ``/v1/models`` serves
    (``--served-model-name``), not to the checkpoint's own name."""
    app = make_app(StatsEngine(), model_name="smol", max_context=512)
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        text = await (await c.get("/metrics")).text()
        models = await (await c.get("/v1/models")).json()
    labels = {
        s.labels.get("model_name")
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
        if s.name.startswith("vllm:")
    }
    assert labels == {"smol"} == {m["id"] for m in models["data"]}


async def test_information_routes_answer_503_at_once_while_the_runner_loads():
    """A router polls them with short timeouts: before the runner's first ``RunnerInfo``
    they are a prompt 503, not a wait of ``RUNNER_WAIT_S``. The runner's limits never
    come, and each wait for them times out at once (a fake clock): what is checked is
    how long each route was willing to wait."""
    import asyncio

    from houchu.api.state import INFO_WAIT_S, RUNNER_WAIT_S
    from houchu.transport.limits import LimitsWatch, RunnerLimits

    class NeverKnown(LimitsWatch):
        """Limits that never arrive; a wait of any length times out at once."""

        def __init__(self) -> None:
            super().__init__()
            self.waits: list[float | None] = []

        async def wait(self, timeout_s: float | None = None) -> RunnerLimits:
            self.waits.append(timeout_s)
            raise asyncio.TimeoutError

    watch = NeverKnown()
    app = make_app(StatsEngine(), model_name="fake", runner=watch)
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        for path in ("/v1/models", "/model_info", "/server_info", "/get_server_info"):
            before = len(watch.waits)
            resp = await c.get(path)
            assert resp.status == 503, path
            assert "not ready" in (await resp.json())["error"]["message"]
            waits = watch.waits[before:]
            assert waits and all(w is not None and w <= INFO_WAIT_S for w in waits), (path, waits)
        assert INFO_WAIT_S < RUNNER_WAIT_S
        assert (await c.get("/version")).status == 200
