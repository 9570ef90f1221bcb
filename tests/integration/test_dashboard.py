"""The dashboard over a real server: requests sent through the API show up in its JSON
endpoints, a repeated prompt shows prefix-cache savings, /metrics moves with traffic, and
a real browser (Debian's chromium via Playwright) shows it all live."""

from __future__ import annotations

import asyncio
import threading
import time
from collections.abc import Callable
from pathlib import Path

import aiohttp
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.support.client import get_json, post_json, ws_generate
from tests.support.dashboard_browser import CHROMIUM, CHROMIUM_ARGS
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts"
#: A prompt of several KV pages (16 tokens each), so a repeat reuses whole pages.
LONG_PROMPT = (
    "The back kitchen of a busy restaurant runs on preparation: stocks simmer for hours, "
    "sauces are reduced ahead of service, and every station keeps its mise en place ready "
    "so that each order can be plated in minutes. Describe what happens at the pass when"
)
GREEDY = {"temperature": 0, "max_tokens": 8}


@pytest.fixture(scope="module")
def dash(real_model_path, tmp_path_factory) -> Server:
    """A server of its own, with its own database."""
    db = tmp_path_factory.mktemp("dashboard") / "houchu.db"
    srv = start_server(real_model_path, "--kv-cache-mb", "128", "--db-url", f"sqlite:///{db}")
    yield srv
    stop_server(srv)


async def _complete(srv: Server, prompt: str, **kw) -> dict:
    status, body = await post_json(f"{srv.url}/v1/completions", {"prompt": prompt, **GREEDY, **kw})
    assert status == 200, body
    return body


async def _wait_request(srv: Server, rid: str, timeout_s: float = 30.0) -> dict:
    """Poll the detail endpoint until the request is recorded as over."""
    deadline = time.monotonic() + timeout_s
    while True:
        status, d = await get_json(f"{srv.url}/dashboard/api/requests/{rid}")
        if status == 200 and d["status"] != "running" and d["e2e_s"] is not None:
            return d
        assert time.monotonic() < deadline, f"{rid} not recorded: {status} {d}"
        await asyncio.sleep(0.3)


def test_a_structured_output_request_shows_its_grammar_and_mask_time(dash):
    async def go():
        body = {"guided_regex": "[0-9]{4}"}
        http = await _complete(dash, "A year:", **body)
        d = await _wait_request(dash, http["id"])
        deadline = time.monotonic() + 20
        while d["structured"] is None or d["structured"]["mask_s"] <= 0:  # runner's samples
            assert time.monotonic() < deadline, d["structured"]
            await asyncio.sleep(0.3)
            d = await _wait_request(dash, http["id"])
        assert d["structured"]["kind"] == "regex" and d["params"]["grammar"] == "regex"
        free = await _complete(dash, "Name a colour:")
        assert (await _wait_request(dash, free["id"]))["structured"] is None

    asyncio.run(go())


async def _listed(srv: Server, want: Callable[[list[dict]], bool]) -> list[dict]:
    """``/dashboard/api/requests`` once ``want`` holds of its rows (telemetry is async)."""
    deadline = time.monotonic() + 20
    while True:
        status, listed = await get_json(f"{srv.url}/dashboard/api/requests?limit=100")
        assert status == 200
        if want(listed["requests"]):
            return listed["requests"]
        assert time.monotonic() < deadline, listed["requests"]
        await asyncio.sleep(0.3)


def test_the_request_view_shows_every_parameter_and_links_choices(dash):
    async def go():
        body = {"n": 2, "best_of": 3, "echo": True, "logprobs": 1, "prompt_logprobs": 0}
        body |= {"logit_bias": {"13": -100, "198": 2}, "min_tokens": 1, "stop_token_ids": [0, 2]}
        body |= {"allowed_token_ids": [28, 29, 30, 31, 32, 33], "bad_words": ["blue"]}
        http = await _complete(dash, "Count:", **body, seed=3, max_tokens=3)
        tools = [{"type": "function", "function": {"name": "get_time", "parameters": {}}}]
        chat = {"messages": [{"role": "user", "content": "Time?"}], "tools": tools}
        chat |= {"tool_choice": "required", "parallel_tool_calls": False, **GREEDY}
        chat |= {"chat_template_kwargs": {"enable_thinking": False}, "add_generation_prompt": True}
        status, reply = await post_json(f"{dash.url}/v1/chat/completions", chat)
        assert status == 200, reply
        ws = {"prompt": "unique-ws-choices:", "n": 2, "min_tokens": 2, **GREEDY}
        assert (await ws_generate(dash.ws_url, ws))["error"] is None
        rows = await _listed(
            dash,
            lambda rs: (
                sum(r["params"].get("parent") == http["id"] for r in rs) == 3
                and reply["id"] in {r["rid"] for r in rs}
                and sum("unique-ws-choices" in (r["preview"] or "") for r in rs) == 2
            ),
        )
        choices = sorted(
            (r for r in rows if r["params"].get("parent") == http["id"]), key=lambda r: r["rid"]
        )
        assert [r["choice"] for r in choices] == [
            {"parent": http["id"], "index": i, "of": 3, "n": 2} for i in range(3)
        ]
        for i, r in enumerate(choices):
            p = r["params"]
            assert r["rid"] == f"{http['id']}-{i}" and p["seed"] == 3 + i
            assert p["n"] == 2 and p["best_of"] == 3 and p["echo"] == 1
            assert p["logprobs"] == 1 and p["top_logprobs"] == 1 and p["prompt_logprobs"] == 0
            assert p["logit_bias"] == "2: 13=-100, 198=+2" and p["min_tokens"] == 1
            assert p["stop_token_ids"] == "2: 0, 2" and p["bad_words"] == 1
            assert p["allowed_token_ids"] == "6: 28, 29, 30, 31, …"
        (tool,) = [r for r in rows if r["rid"] == reply["id"]]
        assert tool["choice"] is None
        p = tool["params"]
        assert p["tools"] == 1 and p["tool_names"] == "get_time"
        assert p["tool_choice"] == "required" and p["parallel_tool_calls"] == 0
        assert p["chat_template_kwargs"] == "1: enable_thinking=false"
        assert p["add_generation_prompt"] == 1 and "continue_final_message" not in p
        assert tool["structured"]["kind"] == "tool_call" and p["grammar_from"] == "tool_choice"
        over_ws = [r for r in rows if "unique-ws-choices" in (r["preview"] or "")]
        parents = {r["choice"]["parent"] for r in over_ws}
        assert len(parents) == 1 and parents.pop().startswith("ws-")
        assert sorted(r["choice"]["index"] for r in over_ws) == [0, 1]
        assert all(r["params"]["min_tokens"] == 2 for r in over_ws)

    asyncio.run(go())


def test_requests_reach_the_dashboard_endpoints(dash):
    async def go():
        http = await _complete(dash, "Name a colour of the sky:", max_tokens=6)
        ws = await ws_generate(
            dash.ws_url, {"prompt": "Name a fruit, unique-ws-request:", **GREEDY}
        )
        assert ws["error"] is None
        d = await _wait_request(dash, http["id"])
        usage = http["usage"]
        assert d["prompt_tokens"] == usage["prompt_tokens"]
        assert d["completion_tokens"] == usage["completion_tokens"]
        assert d["finish_reason"] == http["choices"][0]["finish_reason"]
        assert d["params"]["max_tokens"] == 6 and d["params"]["api"] == "completion"
        assert 0 < d["ttft_s"] <= d["e2e_s"]
        stages = [s["stage"] for s in d["segments"]]
        assert stages[0] == "tokenize" and "prefill" in stages and stages[-1] == "decode"
        kinds = {e["kind"] for e in d["events"]}
        assert {"arrived", "tokenized", "queued", "scheduled", "first_token", "finished"} <= kinds
        assert {e["actor"] for e in d["events"]} >= {"gateway", "tokenizer", "scheduler"}
        deadline = time.monotonic() + 20
        while True:  # the WebSocket request's record may still be on its way to the recorder
            status, listed = await get_json(f"{dash.url}/dashboard/api/requests?limit=50")
            assert status == 200
            previews = [r["preview"] or "" for r in listed["requests"]]
            if any("unique-ws-request" in p for p in previews):
                break
            assert time.monotonic() < deadline, previews
            await asyncio.sleep(0.3)
        assert http["id"] in {r["rid"] for r in listed["requests"]}
        deadline = time.monotonic() + 20
        while True:  # the WebSocket request's telemetry may still be on its way
            status, live = await get_json(f"{dash.url}/dashboard/api/live")
            if live["requests"]["by_status"].get("finished", 0) >= 2:
                break
            assert time.monotonic() < deadline, live["requests"]
            await asyncio.sleep(0.3)
        assert status == 200 and live["engine"]["num_pages_total"] > 0
        assert sum(live["series"]["decode_tps"]) > 0  # the runner's steps were recorded

    asyncio.run(go())


def test_repeated_prompt_shows_prefix_cache_savings(dash):
    async def go():
        await _complete(dash, LONG_PROMPT)
        second = await _complete(dash, LONG_PROMPT)
        assert second["usage"]["prompt_tokens_details"]["cached_tokens"] > 0
        d = await _wait_request(dash, second["id"])
        assert d["cached_tokens"] > 0
        assert any(m["kind"] == "prefix_matched" for m in d["markers"])
        radix = [lv for lv in d["ledger"] if lv["lever"] == "radix_prefix_cache"]
        assert radix and radix[0]["saved"] > 0
        deadline = time.monotonic() + 20
        while True:
            status, ledger = await get_json(f"{dash.url}/dashboard/api/ledger?window=600")
            levers = {lv["lever"]: lv for v in ledger["verbs"] for lv in v["levers"]}
            if levers["radix_prefix_cache"]["active"]:
                break
            assert time.monotonic() < deadline, ledger
            await asyncio.sleep(0.3)
        assert levers["radix_prefix_cache"]["saved"]["tokens"]["sum"] > 0

    asyncio.run(go())


def test_preemptions_show_on_the_dashboard(real_model_path, tmp_path):
    """Six requests at once in a pool too small for them: the scheduler preempts some, and
    the dashboard counts every preemption on its request and marks it on its timeline."""
    db = tmp_path / "houchu.db"
    flags = ["--num-pages", "12", "--disable-radix-cache", "--db-url", f"sqlite:///{db}"]
    srv = start_server(real_model_path, *flags)
    prompts = [f"Write a list of {n} animals that live in the ocean:" for n in range(3, 9)]

    async def go():
        kw = {"max_tokens": 40, "ignore_eos": True}
        bodies = await asyncio.gather(*(_complete(srv, p, **kw) for p in prompts))
        _, stats = await get_json(f"{srv.url}/stats")
        assert stats["num_preemptions"] > 0  # 6 x ~50 tokens need ~24 pages of 16
        rids = {b["id"] for b in bodies}
        deadline = time.monotonic() + 30
        while True:  # the scheduler's events may still be on their way to the recorder
            _, listed = await get_json(f"{srv.url}/dashboard/api/requests?limit=50")
            counts = {r["rid"]: r["num_preemptions"] for r in listed["requests"]}
            if sum(counts.get(rid, 0) for rid in rids) == stats["num_preemptions"]:
                break
            assert time.monotonic() < deadline, (counts, stats["num_preemptions"])
            await asyncio.sleep(0.3)
        rid = max(rids, key=lambda r: counts[r])
        d = await _wait_request(srv, rid)
        assert d["num_preemptions"] == counts[rid] > 0
        assert "preempted" in {m["kind"] for m in d["markers"]}
        assert "preempted" in {s["stage"] for s in d["segments"]}

    try:
        asyncio.run(go())
    finally:
        stop_server(srv)


def _scrape(srv: Server) -> dict[str, float]:
    async def get() -> str:
        async with aiohttp.ClientSession() as s, s.get(f"{srv.url}/metrics") as r:
            assert r.status == 200
            return await r.text()

    out = {}
    for fam in text_string_to_metric_families(asyncio.run(get())):
        for s in fam.samples:
            labels = ",".join(f"{k}={v}" for k, v in sorted(s.labels.items()))
            out[f"{s.name}{{{labels}}}"] = s.value
    return out


def test_metrics_move_with_traffic(dash):
    before = _scrape(dash)
    body = asyncio.run(_complete(dash, "Count to five:"))
    asyncio.run(_wait_request(dash, body["id"]))
    after = _scrape(dash)
    fin = "houchu_requests_total{outcome=finished}"
    assert after[fin] == before.get(fin, 0) + 1
    gen = "houchu_generation_tokens_total{}"
    assert after[gen] == before.get(gen, 0) + body["usage"]["completion_tokens"]
    assert after["houchu_e2e_request_latency_seconds_count{}"] >= 1
    assert after["houchu_engine_up{}"] == 1 and after["houchu_kv_pages_total{}"] > 0
    assert after["houchu_telemetry_written_records_total{}"] > before.get(
        "houchu_telemetry_written_records_total{}", 0
    )
    assert any(k.startswith("houchu_lever_saved_total{") for k in after)
    # the names routers in front of vLLM scrape, from the same engine counters
    name = next(k for k in after if k.startswith("vllm:num_requests_running{"))
    label = name[name.index("{") :]
    queried = f"vllm:prefix_cache_queries_total{label}"
    assert after[queried] == before.get(queried, 0) + body["usage"]["prompt_tokens"]
    assert 0 <= after[f"vllm:kv_cache_usage_perc{label}"] <= 1
    assert f"vllm:num_requests_waiting{label}" in after


def test_server_info_for_routers(dash):
    async def go():
        status, info = await get_json(f"{dash.url}/server_info")
        assert status == 200 and info["context_length"] > 0
        assert info["max_total_num_tokens"] > 0 and info["page_size"] == 16
        status, model = await get_json(f"{dash.url}/get_model_info")
        assert status == 200 and model["max_model_len"] == info["context_length"]
        status, version = await get_json(f"{dash.url}/version")
        assert status == 200 and version["version"] == info["version"]

    asyncio.run(go())


def _bench_results(scale: float) -> dict:
    """Results shaped like ``houchu bench``'s (vLLM-style keys), scaled."""
    out = {"output_throughput": 120.0 * scale, "request_throughput": 2.0 * scale}
    for metric in ("ttft", "tpot", "itl", "e2el"):
        for stat in ("mean", "median", "p90", "p99"):
            out[f"{stat}_{metric}_ms"] = 100.0 / scale
    return out


def _traffic(srv: Server, stop: threading.Event, errors: list[str]) -> None:
    """Streams of requests until ``stop``: several at once, with repeated prompts."""

    async def one(i: int) -> None:
        prompt = LONG_PROMPT if i % 2 else f"Request {i}: tell me a short fact about bread."
        got = await ws_generate(srv.ws_url, {"prompt": prompt, "max_tokens": 24, "temperature": 0})
        if got["error"] is not None:
            errors.append(str(got["error"]))

    async def loop() -> None:
        i = 0
        while not stop.is_set() and i < 40:
            await asyncio.gather(*(one(i + k) for k in range(3)))
            i += 3

    asyncio.run(loop())


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian chromium is not installed")
def test_dashboard_in_a_real_browser(dash):
    from playwright.sync_api import sync_playwright

    for name, scale in (("baseline", 1.0), ("radix cache", 1.6)):
        run = {"name": name, "settings": {"concurrency": 16}, "results": _bench_results(scale)}
        status, body = asyncio.run(post_json(f"{dash.url}/dashboard/api/bench", run))
        assert status == 201, body
    stop, errors = threading.Event(), []
    traffic = threading.Thread(target=_traffic, args=(dash, stop, errors), daemon=True)
    traffic.start()
    page_errors: list[str] = []
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
            page = browser.new_page(viewport={"width": 1440, "height": 1000})
            page.on("pageerror", lambda e: page_errors.append(str(e)))
            page.goto(f"{dash.url}/dashboard")
            page.wait_for_function(
                "Number(document.body.dataset.snapshots || 0) >= 1", timeout=30_000
            )
            # the timeline shows the running requests' rows, with their stages
            page.wait_for_function(
                "Number(document.getElementById('timeline').dataset.rows || 0) >= 3", timeout=60_000
            )
            page.wait_for_function(
                "(document.getElementById('timeline').dataset.stages || '').includes('decode')",
                timeout=60_000,
            )
            stages = page.get_attribute("#timeline", "data-stages").split(",")
            assert {"tokenize", "prefill", "decode"} <= set(stages)
            drawn = page.evaluate(
                "document.getElementById('timeline').data.filter(t => t.type === 'bar').map(t => t.name)"
            )
            assert "decode" in drawn and page.locator("#timeline .bars .point").count() >= 3
            # live numbers change while requests run
            first = page.get_attribute("#kpi-finished", "data-value")
            page.wait_for_function(
                f"document.getElementById('kpi-finished').dataset.value !== {first!r}",
                timeout=90_000,
            )
            # the ledger shows what the prefix cache saved for the repeated prompt
            page.wait_for_function(
                "Number(document.querySelector('[data-lever=radix_prefix_cache]')"
                "?.dataset.savedTokens || 0) > 0",
                timeout=90_000,
            )
            assert "no samples" not in page.inner_text("[data-lever=radix_prefix_cache]")
            # a click on a row opens that request's detail
            rid = page.evaluate("Timeline.rows()[0].rid")
            page.evaluate(f"Timeline.show({rid!r})")
            page.wait_for_selector(f"#detail[data-rid='{rid}']", timeout=20_000)
            assert "TTFT" in page.inner_text("#detail")
            assert page.locator("#detail [data-param=max_tokens]").count() == 1
            # the two benchmark runs side by side
            assert page.locator("#bench-table tr[data-run]").count() == 2
            assert page.locator("#bench-compare .bench-plot .main-svg").count() >= 3
            page.wait_for_timeout(1500)  # one more push, so the screenshot is current
            ARTIFACTS.mkdir(exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "dashboard.png"), full_page=True)
            browser.close()
    finally:
        stop.set()
        traffic.join(120)
    assert not page_errors, page_errors
    assert not errors, errors
