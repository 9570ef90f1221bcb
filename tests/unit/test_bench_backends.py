"""Load generator against fake servers started in the test (aiohttp): the OpenAI SSE
path and the houchu WebSocket path, with errors, stalls and missing usage."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from houchu.bench.backends.base import GenParams
from houchu.bench.backends.openai import OpenAIBackend
from houchu.bench.backends.ws import HouchuWsBackend
from houchu.bench.core import BenchSpec, benchmark
from houchu.bench.driver import RunConfig, run_sessions
from houchu.bench.metrics import RequestResult
from houchu.bench.prompts import PromptBuilder
from houchu.bench.workloads import RequestSpec, Session, WorkloadConfig

TOKENS = ["Hel", "lo", " wor", "ld"]
BODIES = web.AppKey("bodies", list)
ABORTED = web.AppKey("aborted", list)


def _words(body: dict[str, Any]) -> str:
    if "prompt" in body:
        return body["prompt"]
    return body["messages"][-1]["content"]


def _chunk(chat: bool, text: str | None, finish: str | None = None) -> dict[str, Any]:
    choice: dict[str, Any] = {"index": 0, "finish_reason": finish}
    if chat:
        choice["delta"] = {} if text is None else {"content": text}
    else:
        choice["text"] = text or ""
    return {"id": "x", "choices": [choice]}


async def _openai(request: web.Request) -> web.StreamResponse:
    """A fake OpenAI server whose behaviour the prompt names."""
    body = await request.json()
    mode = _words(body).split()[0]
    chat = request.path.endswith("/chat/completions")
    request.app[BODIES].append(body)
    if mode == "http500":
        return web.json_response({"error": {"message": "boom"}}, status=500)
    resp = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
    await resp.prepare(request)

    async def send(obj: Any) -> None:
        data = obj if isinstance(obj, str) else json.dumps(obj)
        await resp.write(f"data: {data}\n\n".encode())
        await asyncio.sleep(0.005)

    if chat:
        await send(_chunk(True, None))  # role-only first chunk: not a token
    await resp.write(b": keep-alive comment\n\n")
    n = min(body["max_tokens"], len(TOKENS))
    for i, tok in enumerate(TOKENS[:n]):
        if mode == "stall" and i == 1:
            await asyncio.sleep(30)
        if mode == "badjson" and i == 1:
            await send("{not json")
        if mode == "errorevent" and i == 2:
            await send({"error": {"message": "engine died"}})
            return resp
        await send(_chunk(chat, tok))
    await send(_chunk(chat, "", "length"))
    if mode != "nousage" and body.get("stream_options", {}).get("include_usage"):
        await send(
            {"id": "x", "choices": [], "usage": {"prompt_tokens": 3, "completion_tokens": n}}
        )
    if mode != "nodone":
        await send("[DONE]")
    return resp


async def _models(request: web.Request) -> web.Response:
    return web.json_response({"object": "list", "data": [{"id": "fake-model"}]})


@pytest.fixture
async def fake_openai():
    app = web.Application()
    app[BODIES] = []
    app.router.add_post("/v1/completions", _openai)
    app.router.add_post("/v1/chat/completions", _openai)
    app.router.add_get("/v1/models", _models)
    server = TestServer(app)
    await server.start_server()
    yield server, app[BODIES]
    await server.close()


async def _one(backend: Any, prompt: str, chat: bool = False, max_tokens: int = 4) -> RequestResult:
    spec = RequestSpec(prompt, None, max_tokens, "t")
    run = await run_sessions(backend, [Session([spec])], RunConfig(progress=False))
    assert len(run.results) == 1
    return run.results[0]


@pytest.mark.parametrize("api", ["completions", "chat"])
async def test_openai_sse_parsing_and_usage(fake_openai, api: str) -> None:
    server, bodies = fake_openai
    b = OpenAIBackend(str(server.make_url("/v1")), GenParams(api=api, timeout_s=5))
    await b.start()
    try:
        r = await _one(b, "ok fine")
        short = await _one(b, "ok fine", max_tokens=2)
    finally:
        await b.close()
    assert r.ok, r.error_message
    assert r.text == "Hello world"
    assert r.output_tokens == 4 and r.counted_tokens == 4 and r.usage_reported
    assert r.input_tokens == 3 and len(r.token_times) == 4
    assert r.ttft is not None and 0 < r.ttft <= r.e2el
    assert short.output_tokens == 2
    sent = bodies[0]
    assert sent["model"] == "fake-model" and sent["stream"] is True
    assert sent["stream_options"] == {"include_usage": True} and sent["ignore_eos"] is True
    assert ("messages" in sent) == (api == "chat")


async def test_openai_counts_chunks_without_usage(fake_openai) -> None:
    server, bodies = fake_openai
    for include in (True, False):
        b = OpenAIBackend(
            str(server.make_url("/v1")), GenParams(timeout_s=5), include_usage=include
        )
        await b.start()
        try:
            r = await _one(b, "nousage please")
        finally:
            await b.close()
        assert r.ok and not r.usage_reported and r.output_tokens == 4
    assert "stream_options" not in bodies[-1]


@pytest.mark.parametrize(
    ("prompt", "kind"),
    [
        ("http500 x", "http_500"),
        ("badjson x", "protocol"),
        ("errorevent x", "server_error"),
        ("nodone x", None),  # a finish_reason without [DONE] is a complete answer
        ("stall x", "timeout"),
    ],
)
async def test_openai_errors_are_counted(fake_openai, prompt: str, kind: str | None) -> None:
    server, _ = fake_openai
    b = OpenAIBackend(str(server.make_url("/v1")), GenParams(timeout_s=0.5))
    await b.start()
    try:
        r = await _one(b, prompt)
    finally:
        await b.close()
    assert r.error == kind, r.error_message
    assert r.end >= r.start


async def test_openai_connection_refused_is_an_error() -> None:
    b = OpenAIBackend("http://127.0.0.1:9/v1", GenParams(timeout_s=2, model="m"))
    await b.start()
    try:
        r = await _one(b, "ok")
    finally:
        await b.close()
    assert r.error == "connection"


async def test_benchmark_record_over_a_replay_mix(fake_openai, tmp_path) -> None:
    """A whole run with failures mixed in: nothing crashes, errors are tallied."""
    server, _ = fake_openai
    lines = ["ok a", "http500 b", "ok c", "stall d", "errorevent e", "ok f"]
    path = tmp_path / "mix.jsonl"
    path.write_text("\n".join(json.dumps({"prompt": p, "max_tokens": 4}) for p in lines))
    spec = BenchSpec(
        WorkloadConfig(kind="replay", num_requests=6, replay_path=str(path)),
        RunConfig(concurrency=3, progress=False),
        GenParams(timeout_s=0.5),
        warmup=0,
        slo_ms={"ttft": 10_000.0},
    )
    b = OpenAIBackend(str(server.make_url("/v1")), spec.params)
    rec = await benchmark(b, spec, PromptBuilder(None), "mix")
    res = rec["results"]
    assert res["completed"] == 3 and res["failed"] == 3
    assert res["errors"] == {"http_500": 1, "timeout": 1, "server_error": 1}
    assert res["total_output_tokens"] == 12 and res["request_goodput"] > 0
    assert len(rec["requests"]) == 6 and rec["settings"]["backend"] == "openai"
    json.dumps(rec)  # the record is JSON-ready


async def test_multi_turn_resends_history(fake_openai) -> None:
    server, bodies = fake_openai
    turns = [RequestSpec(f"ok turn{i}", None, 4, f"turn{i}") for i in range(3)]
    b = OpenAIBackend(str(server.make_url("/v1")), GenParams(api="chat", timeout_s=5))
    await b.start()
    try:
        run = await run_sessions(b, [Session(turns, multi_turn=True)], RunConfig(progress=False))
    finally:
        await b.close()
    assert all(r.ok for r in run.results)
    msgs = bodies[-1]["messages"]
    assert [m["role"] for m in msgs] == ["user", "assistant", "user", "assistant", "user"]
    assert msgs[1]["content"] == "Hello world" and msgs[4]["content"] == "ok turn2"


async def test_time_limit_cancels_in_flight(fake_openai) -> None:
    server, _ = fake_openai
    specs = [Session([RequestSpec("stall x", None, 4)]) for _ in range(4)]
    request_timeout_s = 30.0
    b = OpenAIBackend(str(server.make_url("/v1")), GenParams(timeout_s=request_timeout_s))
    await b.start()
    try:
        run = await run_sessions(
            b, specs, RunConfig(concurrency=2, max_duration_s=0.5, progress=False)
        )
    finally:
        await b.close()
    assert run.incomplete == 2 and run.not_sent == 2 and run.results == []
    # it ended at the limit (0.5 s), not when the stalled requests' own timeout came
    assert 0.4 < run.duration_s < request_timeout_s


# ---------------------------------------------------------------- WebSocket


async def _ws(request: web.Request) -> web.WebSocketResponse:
    """A fake houchu WebSocket: deltas with token ids, then a final frame with usage."""
    ws = web.WebSocketResponse()
    await ws.prepare(request)
    aborted = request.app[ABORTED]

    async def answer(frame: dict[str, Any]) -> None:
        rid, mode = frame["id"], frame["prompt"].split()[0]
        if mode == "error":
            await ws.send_json({"id": rid, "type": "error", "error": {"message": "bad"}})
            return
        if mode == "stall":
            await asyncio.sleep(30)
        await ws.send_json({"id": rid, "type": "delta", "text": "ab", "token_ids": [1, 2]})
        await asyncio.sleep(0.01)
        await ws.send_json({"id": rid, "type": "delta", "text": "c", "token_ids": [3]})
        usage = {
            "prompt_tokens": 5,
            "completion_tokens": 3,
            "prompt_tokens_details": {"cached_tokens": 2},
        }
        await ws.send_json(
            {"id": rid, "type": "final", "finish_reason": "length", "usage": usage, "text": ""}
        )

    tasks = {}
    async for msg in ws:
        frame = json.loads(msg.data)
        if frame.get("type") == "abort":
            aborted.append(frame["id"])
            tasks[frame["id"]].cancel()
        else:
            tasks[frame["id"]] = asyncio.create_task(answer(frame))
    return ws


@pytest.fixture
async def fake_ws():
    app = web.Application()
    app[ABORTED] = []
    app.router.add_get("/ws", _ws)
    server = TestServer(app)
    await server.start_server()
    yield str(server.make_url("/ws")).replace("http", "ws"), app[ABORTED]
    await server.close()


async def test_ws_backend_frames_errors_and_abort(fake_ws) -> None:
    url, aborted = fake_ws
    b = HouchuWsBackend(url, GenParams(timeout_s=0.5), connections=2)
    sessions = [Session([RequestSpec(p, None, 3)]) for p in ("ok a", "error b", "stall c", "ok d")]
    await b.start()
    try:
        run = await run_sessions(b, sessions, RunConfig(concurrency=4, progress=False))
    finally:
        await b.close()
    by = {r.error: r for r in run.results}
    assert set(by) == {None, "server_error", "timeout"}
    ok = [r for r in run.results if r.ok]
    assert len(ok) == 2
    for r in ok:
        assert r.text == "abc" and r.output_tokens == 3 == r.counted_tokens
        assert r.cached_tokens == 2 and len(r.token_times) == 2 and r.ttft <= r.e2el
    assert len(aborted) == 1


async def test_poisson_arrivals_follow_the_offsets(fake_openai) -> None:
    from houchu.bench.driver import arrival_offsets

    server, _ = fake_openai
    specs = [Session([RequestSpec("ok x", None, 1)]) for _ in range(5)]
    b = OpenAIBackend(str(server.make_url("/v1")), GenParams(timeout_s=5))
    await b.start()
    try:
        run = await run_sessions(
            b, specs, RunConfig(concurrency=None, request_rate=20.0, seed=7, progress=False)
        )
    finally:
        await b.close()
    starts = sorted(r.start for r in run.results)
    want = arrival_offsets(5, 20.0, 7)
    for got, off in zip(starts, want, strict=True):
        assert abs((got - starts[0]) - off) < 0.05


async def test_openai_resends_once_on_a_closed_kept_alive_connection(fake_openai) -> None:
    import aiohttp

    server, bodies = fake_openai
    b = OpenAIBackend(str(server.make_url("/v1")), GenParams(timeout_s=5))
    await b.start()
    real_post, calls = b._session.post, []

    def flaky_post(*args: Any, **kwargs: Any) -> Any:
        calls.append(1)
        if len(calls) in (1, 3, 4):  # the first request once; the second twice
            raise aiohttp.ClientOSError(None, "Can not write request body")
        return real_post(*args, **kwargs)

    b._session.post = flaky_post
    try:
        ok = await _one(b, "ok once")
        bad = await _one(b, "ok twice")
    finally:
        await b.close()
    assert ok.ok and ok.output_tokens == 4 and len(bodies) == 1
    assert bad.error == "connection" and len(calls) == 4


async def test_ws_backend_that_cannot_connect_closes_its_session() -> None:
    """A refused handshake (a router without /ws, say) raises and leaves no open session
    behind (aiohttp would warn "Unclosed client session" at exit)."""
    app = web.Application()  # no /ws route: the handshake gets a 404
    async with TestServer(app) as server:
        url = f"ws://127.0.0.1:{server.port}/ws"
        backend = HouchuWsBackend(url, GenParams("completions", 0.0, True, 10.0, None, None), 2)
        with pytest.raises(Exception, match="404"):
            await backend.start()
        assert backend._session is None  # noqa: SLF001 (what close() releases)
