"""The OpenAI-compatible endpoints against the fake engine: streaming and non-streaming
shapes, usage, logprobs, engine errors, client disconnects, the official client."""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import AsyncIterator

import pytest
from openai import AsyncOpenAI

from tests.support.fake_api import (
    ANSWER,
    CACHED_TOKENS,
    MODEL,
    PIECES,
    PROMPT_TOKENS,
    Api,
    assert_openai_error,
    read_sse,
    serve,
    wait_for,
)

CMPL = {"prompt": "Hello", "max_tokens": 5}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}
USAGE = {
    "prompt_tokens": PROMPT_TOKENS,
    "completion_tokens": len(PIECES),
    "total_tokens": PROMPT_TOKENS + len(PIECES),
    "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
}


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serve() as a:
        yield a


async def test_completion_non_streaming(api: Api) -> None:
    before = int(time.time())
    status, body = await api.post("/v1/completions", CMPL)
    assert status == 200
    assert body["id"].startswith("cmpl-") and len(body["id"]) == len("cmpl-") + 32
    assert body["id"] == api.engine.requests[0].rid
    assert body["object"] == "text_completion" and body["model"] == MODEL
    assert before <= body["created"] <= time.time()
    (choice,) = body["choices"]
    assert choice == {
        "index": 0,
        "text": ANSWER,
        "logprobs": None,
        "finish_reason": "length",
        "stop_reason": None,  # vLLM's: no stop string or stop token ended it
    }
    assert body["usage"] == USAGE
    assert api.engine.aborted == [] and api.in_flight == 0


async def test_chat_non_streaming(api: Api) -> None:
    status, body = await api.post("/v1/chat/completions", CHAT)
    assert status == 200
    assert body["id"].startswith("chatcmpl-") and body["object"] == "chat.completion"
    (choice,) = body["choices"]
    assert choice["message"] == {"role": "assistant", "content": ANSWER}
    assert choice["finish_reason"] == "length" and choice["logprobs"] is None
    assert body["usage"] == USAGE


async def test_each_request_gets_a_fresh_id(api: Api) -> None:
    ids = {(await api.post("/v1/completions", CMPL))[1]["id"] for _ in range(3)}
    assert len(ids) == 3


async def test_completion_stream_equals_non_stream(api: Api) -> None:
    async with api.client.post("/v1/completions", json={**CMPL, "stream": True}) as r:
        chunks = await read_sse(r)
    _, full = await api.post("/v1/completions", CMPL)
    assert all(c["object"] == "text_completion" and c["model"] == MODEL for c in chunks)
    assert len({c["id"] for c in chunks}) == 1 and "usage" not in chunks[0]
    text = "".join(c["choices"][0]["text"] for c in chunks)
    assert text == full["choices"][0]["text"] == ANSWER
    assert [c["choices"][0]["finish_reason"] for c in chunks] == [None] * len(PIECES) + ["length"]
    assert chunks[-1]["choices"][0]["text"] == ""
    assert api.engine.aborted == []


async def test_chat_stream_equals_non_stream(api: Api) -> None:
    async with api.client.post("/v1/chat/completions", json={**CHAT, "stream": True}) as r:
        chunks = await read_sse(r)
    _, full = await api.post("/v1/chat/completions", CHAT)
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    deltas = [c["choices"][0]["delta"] for c in chunks]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert deltas[-1] == {} and chunks[-1]["choices"][0]["finish_reason"] == "length"
    assert all(c["choices"][0]["finish_reason"] is None for c in chunks[:-1])
    text = "".join(d.get("content", "") for d in deltas)
    assert text == full["choices"][0]["message"]["content"] == ANSWER
    assert api.engine.aborted == []


@pytest.mark.parametrize(
    ("path", "body"), [("/v1/completions", CMPL), ("/v1/chat/completions", CHAT)]
)
async def test_include_usage_chunk(api: Api, path: str, body: dict) -> None:
    req = {**body, "stream": True, "stream_options": {"include_usage": True}}
    async with api.client.post(path, json=req) as r:
        chunks = await read_sse(r)
    *rest, last = chunks
    assert last["choices"] == [] and last["usage"] == USAGE
    assert all(c["usage"] is None for c in rest)
    assert rest[-1]["choices"][0]["finish_reason"] == "length"
    async with api.client.post(path, json={**req, "stream_options": {}}) as r:
        assert all("usage" not in c for c in await read_sse(r))


async def test_completion_logprobs(api: Api) -> None:
    status, body = await api.post("/v1/completions", {**CMPL, "logprobs": 2})
    assert status == 200
    lp = body["choices"][0]["logprobs"]
    assert set(lp) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    assert lp["tokens"] == PIECES
    assert lp["token_logprobs"] == [-0.25 * (i + 1) for i in range(len(PIECES))]
    assert lp["top_logprobs"][0] == {"Hel": -0.25, "alt": -1.25}
    assert all(len(t) == 2 for t in lp["top_logprobs"])
    offsets = [sum(len(p) for p in PIECES[:i]) for i in range(len(PIECES))]
    assert lp["text_offset"] == offsets
    assert api.engine.requests[0].sampling.top_logprobs == 2

    async with api.client.post(
        "/v1/completions", json={**CMPL, "logprobs": 2, "stream": True}
    ) as r:
        chunks = await read_sse(r)
    parts = [c["choices"][0]["logprobs"] for c in chunks if c["choices"][0]["text"]]
    assert [t for p in parts for t in p["tokens"]] == PIECES
    assert [o for p in parts for o in p["text_offset"]] == offsets


async def test_completion_logprobs_zero_still_reports_the_sampled_token(api: Api) -> None:
    _, body = await api.post("/v1/completions", {**CMPL, "logprobs": 0})
    lp = body["choices"][0]["logprobs"]
    assert lp["top_logprobs"] == [{p: -0.25 * (i + 1)} for i, p in enumerate(PIECES)]


async def test_chat_logprobs(api: Api) -> None:
    body = {**CHAT, "logprobs": True, "top_logprobs": 2}
    status, full = await api.post("/v1/chat/completions", body)
    assert status == 200
    content = full["choices"][0]["logprobs"]["content"]
    assert [c["token"] for c in content] == PIECES
    first = content[0]
    assert set(first) == {"token", "logprob", "bytes", "top_logprobs"}
    assert first["bytes"] == list(b"Hel") and first["logprob"] == -0.25
    assert first["top_logprobs"] == [
        {"token": "Hel", "logprob": -0.25, "bytes": list(b"Hel")},
        {"token": "alt", "logprob": -1.25, "bytes": list(b"alt")},
    ]
    assert content[-1]["bytes"] == list("! 🍜".encode())

    async with api.client.post("/v1/chat/completions", json={**body, "stream": True}) as r:
        chunks = await read_sse(r)
    streamed = [
        t
        for c in chunks
        if c["choices"][0]["logprobs"]
        for t in c["choices"][0]["logprobs"]["content"]
    ]
    assert streamed == content


async def test_engine_rejection_is_http_error(api: Api) -> None:
    for stream in (False, True):
        status, body = await api.post("/v1/completions", {"prompt": "FAIL_NOW", "stream": stream})
        assert status == 400
        assert assert_openai_error(body)["code"] == "context_length_exceeded"
        status, body = await api.post(
            "/v1/chat/completions",
            {"messages": [{"role": "user", "content": "FAIL_NOW"}], "stream": stream},
        )
        assert status == 400 and "context window" in assert_openai_error(body)["message"]
    status, _ = await api.post("/v1/completions", CMPL)
    assert status == 200 and api.in_flight == 0


async def test_engine_failure_mid_request(api: Api) -> None:
    status, body = await api.post("/v1/completions", {"prompt": "FAIL_LATER"})
    assert status == 500
    assert assert_openai_error(body)["message"] == "the runner died"
    async with api.client.post(
        "/v1/completions", json={"prompt": "FAIL_LATER", "stream": True}
    ) as r:
        chunks = await read_sse(r)
    assert "".join(c["choices"][0]["text"] for c in chunks[:-1]) == "".join(PIECES[:2])
    assert chunks[-2]["choices"][0]["finish_reason"] == "error"
    assert assert_openai_error(chunks[-1])["code"] == "internal_error"
    assert api.in_flight == 0


async def test_unexpected_exception_is_500(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR):
        status, body = await api.post("/v1/completions", {"prompt": "CRASH"})
    assert status == 500
    assert assert_openai_error(body)["type"] == "internal_server_error"
    assert any("unexpected error" in r.message for r in caplog.records)
    status, _ = await api.post("/v1/completions", CMPL)
    assert status == 200 and api.in_flight == 0


async def test_unexpected_exception_mid_stream(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    body = {"messages": [{"role": "user", "content": "CRASH_LATER"}], "stream": True}
    with caplog.at_level(logging.ERROR):
        async with api.client.post("/v1/chat/completions", json=body) as r:
            chunks = await read_sse(r)
    assert assert_openai_error(chunks[-1])["type"] == "internal_server_error"
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks[:-1]) == "Hello"
    assert any("unexpected error" in r.message for r in caplog.records)
    status, _ = await api.post("/v1/completions", CMPL)
    assert status == 200 and api.in_flight == 0


@pytest.mark.parametrize("cancel_handler", [False, True])
async def test_client_disconnect_mid_stream_aborts(
    cancel_handler: bool, caplog: pytest.LogCaptureFixture
) -> None:
    async with serve(handler_cancellation=cancel_handler) as api:
        await _disconnect_mid_stream(api, caplog)


async def _disconnect_mid_stream(api: Api, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.WARNING):
        for path, body in [
            ("/v1/completions", {"prompt": "SLOW", "max_tokens": 1000}),
            ("/v1/chat/completions", {"messages": [{"role": "user", "content": "SLOW"}]}),
        ]:
            r = await api.client.post(path, json={**body, "stream": True})
            assert r.status == 200
            seen = 0
            while seen < 3:
                seen += (await r.content.readline()).startswith(b"data: ")
            r.close()  # drop the connection mid-stream
            rid = api.engine.requests[-1].rid
            await wait_for(lambda rid=rid: rid in api.engine.aborted)
        await wait_for(lambda: api.in_flight == 0)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    status, _ = await api.post("/v1/completions", CMPL)
    assert status == 200


@pytest.mark.parametrize("cancel_handler", [False, True])
async def test_client_disconnect_non_streaming_aborts(cancel_handler: bool) -> None:
    async with serve(handler_cancellation=cancel_handler) as api:
        await _disconnect_non_streaming(api)


async def _disconnect_non_streaming(api: Api) -> None:
    task = asyncio.create_task(api.post("/v1/completions", {"prompt": "SLOW"}))
    await wait_for(lambda: len(api.engine.requests) == 1)
    await asyncio.sleep(0.05)
    task.cancel()
    rid = api.engine.requests[0].rid
    await wait_for(lambda: rid in api.engine.aborted)
    await wait_for(lambda: api.in_flight == 0)


async def test_openai_client(api: Api) -> None:
    client = AsyncOpenAI(base_url=str(api.client.make_url("/v1")), api_key="x", max_retries=0)
    try:
        models = await client.models.list()
        assert [m.id for m in models.data] == [MODEL]

        stream = await client.chat.completions.create(
            model=MODEL,
            messages=[{"role": "user", "content": "Hi"}],
            max_tokens=5,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, usage, finish = "", None, None
        async for chunk in stream:
            if chunk.choices:
                text += chunk.choices[0].delta.content or ""
                finish = chunk.choices[0].finish_reason or finish
            if chunk.usage is not None:
                usage = chunk.usage
        assert text == ANSWER and finish == "length"
        assert usage is not None and usage.completion_tokens == len(PIECES)
        assert usage.prompt_tokens_details.cached_tokens == CACHED_TOKENS

        full = await client.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": "Hi"}], logprobs=True, top_logprobs=1
        )
        assert full.choices[0].message.content == ANSWER
        assert [c.token for c in full.choices[0].logprobs.content] == PIECES

        cstream = await client.completions.create(model=MODEL, prompt="Hi", stream=True)
        ctext = ""
        async for chunk in cstream:
            ctext += chunk.choices[0].text
        assert ctext == ANSWER

        out = await client.completions.create(model=MODEL, prompt="Hi", logprobs=1)
        assert out.choices[0].text == ANSWER and out.choices[0].logprobs.tokens == PIECES
        assert out.usage.total_tokens == PROMPT_TOKENS + len(PIECES)
    finally:
        await client.close()
