"""The dashboard's HTTP API, live feed and /metrics against a fake engine and a database
filled with synthetic telemetry (no model, no actors)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
from aiohttp.test_utils import TestClient, TestServer
from prometheus_client.parser import text_string_to_metric_families

from houchu.api.app import make_app
from houchu.api.metrics import GatewayMetrics
from houchu.api.observe import RequestObserver
from houchu.dashboard.lever_catalog import VERB_IDS, ledger_by_verb
from houchu.dashboard.store import DashboardStore
from houchu.storage.db import open_db
from houchu.transport.levers import CATALOG
from houchu.transport.messages import GenerateRequest, SamplingParams, TextDelta
from tests.support.dashboard_data import fill
from tests.support.fake_api import FakeEngine

STATS = {"model": "fake", "num_running": 2, "num_waiting": 1, "num_pages_total": 100}
STATS |= {"num_pages_used": 10, "num_pages_cached": 5, "num_pages_free": 85}
STATS |= {"round_trip_ms": 40.0}


class StatsEngine(FakeEngine):
    async def stats(self):
        return dict(STATS)


@pytest.fixture
async def client(tmp_path) -> AsyncIterator[TestClient]:
    engine = open_db(f"sqlite:///{tmp_path / 'd.db'}")
    fill(engine)
    store = DashboardStore(engine)
    app = make_app(StatsEngine(), model_name="fake", max_context=512, store=store)
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        yield c
    store.close()


async def get(client: TestClient, path: str) -> tuple[int, dict]:
    resp = await client.get(path)
    return resp.status, await resp.json()


async def test_requests_list_and_detail(client):
    status, body = await get(client, "/dashboard/api/requests?limit=4")
    assert status == 200 and len(body["requests"]) == 4
    newest = body["requests"][0]
    assert newest["status"] == "running" and newest["segments"][-1]["open"]
    rid = body["requests"][1]["rid"]
    status, d = await get(client, f"/dashboard/api/requests/{rid}")
    assert status == 200 and d["rid"] == rid and d["status"] == "finished"
    assert d["params"]["max_tokens"] == 16 and d["events"] and d["ledger"]
    status, d = await get(client, "/dashboard/api/requests?status=finished&limit=100")
    assert {r["status"] for r in d["requests"]} == {"finished"}


@pytest.mark.parametrize(
    ("path", "status", "param"),
    [
        ("/dashboard/api/requests?limit=0", 400, "limit"),
        ("/dashboard/api/requests?limit=abc", 400, "limit"),
        ("/dashboard/api/requests?since=nan", 400, "since"),
        ("/dashboard/api/requests?status=zombie", 400, "status"),
        ("/dashboard/api/requests/nope", 404, None),
        ("/dashboard/api/ledger?window=-5", 400, "window"),
        ("/dashboard/api/ledger?window=soon", 400, "window"),
        ("/dashboard/api/bench/abc", 400, "run_id"),
        ("/dashboard/api/bench/999", 404, None),
        ("/dashboard/static/secrets.txt", 404, None),
    ],
)
async def test_bad_input_gets_clear_errors(client, path, status, param):
    code, body = await get(client, path)
    assert code == status, body
    assert body["error"]["message"] and body["error"]["param"] == param


async def test_ledger_groups_by_verb(client):
    for q in ("", "?window=all", "?window=3600"):
        status, body = await get(client, f"/dashboard/api/ledger{q}")
        assert status == 200
        verbs = [v["verb"] for v in body["verbs"]]
        assert verbs[: len(VERB_IDS)] == list(VERB_IDS)
        levers = {lv["lever"]: lv for v in body["verbs"] for lv in v["levers"]}
        radix = levers["radix_prefix_cache"]
        assert radix["active"] and radix["saved"]["tokens"]["sum"] == 3 * 32
        assert radix["saved"]["flops"]["sum"] > 0 and radix["line"]
        assert not levers["speculative_decoding"]["active"]
    status, body = await get(client, "/dashboard/api/ledger?window=0.001")
    assert not any(lv["active"] for v in body["verbs"] for lv in v["levers"])


def test_every_design_lever_has_a_line():
    names = {lv.value for lv in CATALOG}
    for lever in (
        "radix_prefix_cache",
        "kv_tier_host",
        "kv_tier_ssd",
        "paged_kv",
        "weight_quant_int4",
        "weight_quant_int8",
        "kv_quant_int8",
        "kv_quant_fp8",
        "continuous_batching",
        "chunked_prefill",
        "compiled_decode",
        "cuda_graph",
        "overlap_scheduler",
        "speculative_decoding",
    ):
        assert lever in names
    assert all(s.line and s.spends and s.verb in VERB_IDS for s in CATALOG.values())


def test_kv_tiers_from_engine_counters():
    from houchu.dashboard.live_data import kv_tiers

    stats = {**STATS, "host_pages_total": 64, "host_pages_stored": 10, "ssd_pages_stored": 7}
    stats |= {"ssd_bytes": 7 * 4096, "ssd_capacity_bytes": 1 << 30}
    tiers = {t["tier"]: t for t in kv_tiers(stats)}
    assert tiers["device"]["used"] == 10 and tiers["device"]["cached"] == 5
    assert (tiers["host"]["total"], tiers["host"]["used"]) == (64, 10)
    assert (tiers["ssd"]["total"], tiers["ssd"]["used"], tiers["ssd"]["bytes"]) == (None, 7, 28672)
    assert kv_tiers(None) == [] and kv_tiers({"model": "m"}) == []


def _row(lever: str, verb: str, saved: float, unit: str = "tokens") -> dict:
    return {"lever": lever, "verb": verb, "saved_unit": unit, "spent_unit": "", "saved": saved}


def test_lever_variants_get_a_row_each_with_their_catalog_description():
    rows = [_row("kv_tier_host", "skip", 32.0), _row("kv_tier_ssd", "skip", 16.0)]
    rows += [_row("compiled_decode", "fill", 0.5, "seconds")]
    rows += [_row("kv_quant_int8", "occupy_less", 1e6, "bytes")]
    for r in rows:
        r |= {"spent": 0.0, "saved_max": r["saved"], "spent_max": 0.0, "samples": 1, "last_t": 1.0}
    verbs = {v["verb"]: {lv["lever"]: lv for lv in v["levers"]} for v in ledger_by_verb(rows)}
    skip = verbs["skip"]
    assert (skip["kv_tier_host"]["title"], skip["kv_tier_ssd"]["title"]) == (
        "KV tier: host memory",
        "KV tier: SSD",
    )
    assert skip["kv_tier_ssd"]["saved"]["tokens"]["sum"] == 16.0
    assert verbs["fill"]["compiled_decode"]["active"] and not verbs["fill"]["cuda_graph"]["active"]
    assert verbs["occupy_less"]["kv_quant_int8"]["title"] == "KV-cache int8"
    assert not verbs["move_less"]["kv_quant_int8"]["active"]  # other verb: listed, idle


def test_unknown_levers_and_verbs_are_shown():
    row = {"lever": "new_thing", "verb": "teleport", "saved_unit": "tokens", "spent_unit": ""}
    row |= {"saved": 5.0, "spent": 0.0, "saved_max": 5.0, "spent_max": 0.0, "samples": 1}
    row |= {"last_t": 1.0}
    verbs = ledger_by_verb([row])
    other = verbs[-1]
    assert other["verb"] == "teleport" and other["levers"][0]["saved"]["tokens"]["sum"] == 5.0


async def test_live_numbers(client):
    status, live = await get(client, "/dashboard/api/live")
    assert status == 200
    assert live["engine"]["num_running"] == 2 and live["engine_error"] is None
    assert live["kv"] == [{"tier": "device", "total": 100, "used": 10, "cached": 5, "free": 85}]
    assert live["requests"]["by_status"] == {"finished": 5, "running": 1}
    assert live["counters"]["records_written"] > 0
    assert live["rates"]["round_trip_ms"] == 40.0  # the scheduler's, from its stats
    assert len(live["series"]["t"]) == 60


async def test_bench_runs(client):
    status, body = await get(client, "/dashboard/api/bench")
    assert status == 200 and [r["name"] for r in body["runs"]] == ["radix cache", "baseline"]
    run = {"name": "posted", "settings": {"c": 1}, "results": {"output_throughput": 9.5}}
    resp = await client.post("/dashboard/api/bench", json=run)
    assert resp.status == 201
    run_id = (await resp.json())["id"]
    status, got = await get(client, f"/dashboard/api/bench/{run_id}")
    assert got["results"] == {"output_throughput": 9.5}
    for bad in ({"name": "x"}, {"name": "", "settings": {}, "results": {}}, [1, 2]):
        resp = await client.post("/dashboard/api/bench", json=bad)
        assert resp.status == 400, bad
        assert (await resp.json())["error"]["message"]


async def test_page_and_static_files(client):
    resp = await client.get("/dashboard")
    assert resp.status == 200 and "text/html" in resp.headers["Content-Type"]
    html = await resp.text()
    assert "/dashboard/static/plotly.min.js" in html and "cdn" not in html.lower()
    for name in (
        "dashboard.js",
        "timeline.js",
        "panels.js",
        "bench.js",
        "format.js",
        "dashboard.css",
    ):
        resp = await client.get(f"/dashboard/static/{name}")
        assert resp.status == 200, name
    resp = await client.get("/dashboard/static/plotly.min.js")
    assert resp.status == 200 and len(await resp.read()) > 1_000_000


async def test_live_feed_pushes_snapshots(client):
    async with client.ws_connect("/dashboard/ws") as ws:
        first = await ws.receive_json(timeout=10)
        assert first["type"] == "snapshot" and first["requests"] and first["live"]["engine"]
        assert first["ledger"]["window_s"] == 300
        await ws.send_json({"type": "subscribe", "window": "all", "limit": 2})
        snap = await ws.receive_json(timeout=10)
        while snap["ledger"]["window_s"] is not None:
            snap = await ws.receive_json(timeout=10)
        assert len(snap["requests"]) == 2
        await ws.send_json({"type": "subscribe", "limit": 0})
        msg = await ws.receive_json(timeout=10)
        while msg["type"] != "error":
            msg = await ws.receive_json(timeout=10)
        assert "limit" in msg["error"]["message"]
        await ws.send_str("not json")
        msg = await ws.receive_json(timeout=10)
        while msg["type"] != "error":
            msg = await ws.receive_json(timeout=10)
        assert (await ws.receive_json(timeout=10))["type"] == "snapshot"  # still pushing


async def test_dashboard_without_database_answers_503():
    app = make_app(StatsEngine(), model_name="fake", max_context=512)
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        status, body = await get(c, "/dashboard/api/requests")
        assert status == 503 and body["error"]["code"] == "no_database"
        assert (await c.get("/metrics")).status == 200


async def test_database_not_migrated_answers_503(tmp_path):
    store = DashboardStore.open(f"sqlite:///{tmp_path / 'empty.db'}")
    app = make_app(StatsEngine(), model_name="fake", max_context=512, store=store)
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        status, body = await get(c, "/dashboard/api/ledger")
        assert status == 503 and body["error"]["code"] == "database_unavailable"
    store.close()


def _families(text: str) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            out.setdefault(s.name, {})[tuple(sorted(s.labels.items()))] = s.value
    return out


async def test_metrics_parse_and_move(tmp_path):
    engine = open_db(f"sqlite:///{tmp_path / 'm.db'}")
    fill(engine)
    store = DashboardStore(engine)
    metrics = GatewayMetrics()
    app = make_app(
        StatsEngine(), model_name="fake", max_context=512, store=store, gateway_metrics=metrics
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as c:
        before = _families(await (await c.get("/metrics")).text())
        obs = RequestObserver(None, metrics)
        req = GenerateRequest(rid="x", prompt="hi", sampling=SamplingParams(max_tokens=4))
        obs.arrived(req)
        await asyncio.sleep(0.01)
        obs.delta("x", TextDelta(rid="x", text="a"))
        final = TextDelta(
            rid="x",
            text="b",
            finish_reason="stop",
            prompt_tokens=5,
            completion_tokens=4,
            cached_tokens=2,
        )
        obs.delta("x", final)
        obs.ended("x", "finished")
        obs.arrived(GenerateRequest(rid="y", prompt="hi"))
        obs.ended("y", "aborted")
        resp = await c.get("/metrics")
        assert resp.status == 200 and resp.headers["Content-Type"].startswith("text/plain")
        after = _families(await resp.text())
    store.close()
    fin = (("outcome", "finished"),)
    assert (
        after["houchu_requests_total"][fin]
        == before.get("houchu_requests_total", {}).get(fin, 0) + 1
    )
    assert after["houchu_requests_total"][(("outcome", "aborted"),)] == 1
    assert after["houchu_generation_tokens_total"][()] == 4
    assert after["houchu_prefix_cache_hit_tokens_total"][()] == 2
    assert after["houchu_time_to_first_token_seconds_count"][()] == 1
    assert after["houchu_time_per_output_token_seconds_count"][()] == 1
    assert after["houchu_num_requests_running"][()] == 2 and after["houchu_engine_up"][()] == 1
    key = (("lever", "radix_prefix_cache"), ("unit", "tokens"), ("verb", "skip"))
    assert after["houchu_lever_saved_total"][key] == 96
    assert after["houchu_telemetry_written_records_total"][()] > 0
    assert after["houchu_requests_in_flight"][()] == 0


def test_prompt_previews_only_without_an_api_key():
    """With a key the dashboard stays open, so no prompt text is recorded for it."""

    class Events:
        def __init__(self):
            self.kw = []

        def event(self, rid, kind, t, **kw):
            self.kw.append(kw)

    req = GenerateRequest(rid="x", prompt="my secret prompt", sampling=SamplingParams())
    for record, want in ((True, "my secret prompt"), (False, "")):
        ev = Events()
        RequestObserver(ev, None, record_previews=record).arrived(req)
        assert ev.kw[0]["preview"] == want
