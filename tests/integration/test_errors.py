"""Bad input gets a 400 (or an error frame) and the server keeps serving; a client that
goes away aborts its request and its pages return to the pool."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest

from tests.support.client import get_json, post_json, ws_collect

pytestmark = pytest.mark.slow

GOOD_CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
GOOD_CMPL = {"prompt": "Hello", "max_tokens": 4}

BAD_CHAT = [
    {"max_tokens": 4},  # no messages
    {"messages": [], "max_tokens": 4},
    {"messages": "hello"},
    {"messages": [{"role": "wizard", "content": "hi"}]},
    {**GOOD_CHAT, "temperature": "hot"},
    {**GOOD_CHAT, "temperature": -1},
    {**GOOD_CHAT, "top_p": 1.5},
    {**GOOD_CHAT, "max_tokens": 0},
    {**GOOD_CHAT, "max_tokens": 1.5},
    {**GOOD_CHAT, "top_logprobs": 50, "logprobs": True},
    {**GOOD_CHAT, "n": 129},
    {**GOOD_CHAT, "logit_bias": {"999999": 5}},  # a token id outside the vocabulary
    {**GOOD_CHAT, "max_tokens": 100000},
]
BAD_CMPL = [
    {"max_tokens": 4},
    {"prompt": ""},
    {"prompt": 42},
    {**GOOD_CMPL, "stop": [""]},
    {**GOOD_CMPL, "presence_penalty": 9},
    {"prompt": "word " * 9000, "max_tokens": 4},  # longer than the context window
]


def _is_openai_error(body) -> bool:
    return isinstance(body, dict) and isinstance(body.get("error", {}).get("message"), str)


@pytest.mark.parametrize("body", BAD_CHAT)
def test_bad_chat_gets_400(server, body):
    status, resp = asyncio.run(post_json(f"{server.url}/v1/chat/completions", body))
    assert status == 400 and _is_openai_error(resp), resp
    status, resp = asyncio.run(post_json(f"{server.url}/v1/chat/completions", GOOD_CHAT))
    assert status == 200, resp


@pytest.mark.parametrize("path", ["/v1/chat/completions", "/v1/completions"])
def test_a_model_not_served_gets_404_model_not_found(server, path):
    """As OpenAI and vLLM answer: 404, code ``model_not_found``; the server keeps serving."""
    good = GOOD_CHAT if "chat" in path else {"prompt": "Hi", "max_tokens": 2}
    status, resp = asyncio.run(post_json(f"{server.url}{path}", {**good, "model": "no-such"}))
    assert status == 404 and _is_openai_error(resp), resp
    assert resp["error"]["code"] == "model_not_found" and resp["error"]["param"] == "model"
    status, resp = asyncio.run(post_json(f"{server.url}{path}", good))
    assert status == 200, resp


@pytest.mark.parametrize("body", BAD_CMPL)
def test_bad_completion_gets_400(server, body):
    status, resp = asyncio.run(post_json(f"{server.url}/v1/completions", body))
    assert status == 400 and _is_openai_error(resp), resp
    status, resp = asyncio.run(post_json(f"{server.url}/v1/completions", GOOD_CMPL))
    assert status == 200, resp


@pytest.mark.parametrize("raw", [b"{not json", b"[1, 2]", b"", b'"text"'])
def test_invalid_json_gets_400(server, raw):
    status, resp = asyncio.run(post_json(f"{server.url}/v1/completions", None, raw=raw))
    assert status == 400 and _is_openai_error(resp), resp


def test_ws_error_frames_keep_socket_usable(server):
    async def go():
        async with aiohttp.ClientSession() as s, s.ws_connect(server.ws_url) as ws:
            await ws.send_str("{oops")
            err = await ws.receive_json(timeout=30)
            assert err["type"] == "error"
            await ws.send_json({"id": "x", "prompt": "", "max_tokens": 3})
            assert (await ws_collect(ws, "x"))["error"] is not None
            await ws.send_json({"id": "y", "prompt": "word " * 9000, "max_tokens": 3})
            assert (await ws_collect(ws, "y"))["error"] is not None
            await ws.send_json({"id": "z", "prompt": "Hello", "max_tokens": 3})
            good = await ws_collect(ws, "z")
            assert good["error"] is None and good["final"]["usage"]["completion_tokens"] == 3

    asyncio.run(go())


def _anyof_text(times: int) -> str:
    """``{"anyOf": [...]}`` nested ``times`` times around an integer schema, as JSON
    text (a JSON encoder would recurse once per level)."""
    return '{"anyOf": [' * times + '{"type": "integer"}' + "]}" * times


def test_deep_schemas_are_400_and_ws_error_frames_name_the_frame_id(server):
    """Issue 20: a schema 400 ``anyOf`` levels deep was a RecursionError, a 500 (the
    WebSocket error frame with ``id: null``, a client waiting on its id hung). Now it is
    a 400 ``invalid_grammar`` over HTTP and on the WebSocket, whose error frames name the
    frame's id, also for a frame too deep to decode; the server keeps serving."""
    deep = _anyof_text(400)
    chat = '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, '
    raw = (chat + '"guided_json": ' + deep + "}").encode()
    status, resp = asyncio.run(post_json(f"{server.url}/v1/chat/completions", None, raw=raw))
    assert status == 400 and resp["error"]["code"] == "invalid_grammar", resp
    assert resp["error"]["param"] == "guided_json" and "nests more than" in resp["error"]["message"]

    async def go():
        async with aiohttp.ClientSession() as s, s.ws_connect(server.ws_url) as ws:
            await ws.send_str(
                '{"id": "deep", "prompt": "x", "max_tokens": 4, "guided_json": ' + deep + "}"
            )
            err = await ws.receive_json(timeout=60)
            assert (err["id"], err["type"], err["status"]) == ("deep", "error", 400), err
            assert err["error"]["code"] == "invalid_grammar"
            undecodable = '{"id": "deeper", "prompt": "x", "guided_json": ' + "[" * 5000
            await ws.send_str(undecodable + "]" * 5000 + "}")
            err = await ws.receive_json(timeout=60)
            assert (err["id"], err["status"], err["error"]["code"]) == (
                "deeper",
                400,
                "invalid_json",
            )
            await ws.send_json({"id": "ok", "prompt": "x", "max_tokens": 2})
            good = await ws_collect(ws, "ok")
            assert good["error"] is None and good["final"]["usage"]["completion_tokens"] == 2

    asyncio.run(go())


async def _ws_error(ws_url: str, body: dict) -> dict:
    """The error frame a WebSocket request gets (it must get one, not deltas)."""
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url) as ws:
        await ws.send_json({"id": "c", **body})
        frame = await ws.receive_json(timeout=300)
        assert frame["type"] == "error" and frame["id"] == "c", frame
        return frame


#: (request, what the message says) by where the limit is found: the gateway from
#: ``max_tokens`` alone, the tokenizer from the text's length before encoding it, the
#: scheduler from the exact prompt (601 tokens).
CONTEXT_CASES = {
    "max_tokens alone": (lambda w: {"prompt": "Hello", "max_tokens": w + 1}, "'max_tokens' asks"),
    "long text": (lambda w: {"prompt": "word " * (w * 40), "max_tokens": 4}, "at least"),
    "tokenized prompt": (
        lambda w: {"prompt": "word " * 600, "max_tokens": w - 300},
        "the prompt has 601 tokens",
    ),
}


@pytest.mark.parametrize("case", sorted(CONTEXT_CASES))
def test_context_limit_is_one_error_over_http_and_websocket(server, case):
    """Whichever actor finds that a request cannot fit the runner's context window,
    HTTP and WebSocket clients get the same error: status 400, code
    ``context_length_exceeded``, the same message naming the window."""
    make_body, says = CONTEXT_CASES[case]

    async def go():
        _, models = await get_json(f"{server.url}/v1/models")
        window = models["data"][0]["max_model_len"]
        body = make_body(window)
        status, http = await post_json(f"{server.url}/v1/completions", body)
        frame = await _ws_error(server.ws_url, body)
        return window, status, http, frame

    window, status, http, frame = asyncio.run(go())
    assert status == 400 and frame["status"] == 400, (http, frame)
    assert http["error"]["code"] == "context_length_exceeded", http
    assert frame["error"] == http["error"]
    message = http["error"]["message"]
    assert f"context window is {window} tokens" in message and says in message, message


async def _wait_idle(server, timeout_s: float = 30.0) -> dict:
    deadline = time.monotonic() + timeout_s
    while True:
        _, stats = await get_json(f"{server.url}/stats")
        if stats["num_running"] == 0 and stats["num_waiting"] == 0 or time.monotonic() > deadline:
            return stats
        await asyncio.sleep(0.1)


def test_disconnect_mid_stream_aborts_and_frees_pages(server):
    async def go():
        _, before = await get_json(f"{server.url}/stats")
        body = {
            "prompt": "Count to one thousand:",
            "max_tokens": 2000,
            "stream": True,
            "ignore_eos": True,
        }
        async with aiohttp.ClientSession() as s:
            r = await s.post(f"{server.url}/v1/completions", json=body)
            got = 0
            async for line in r.content:
                got += line.startswith(b"data: ")
                if got >= 5:
                    break
            r.close()  # drop the connection mid-stream
        # a WebSocket that closes with a request in flight aborts it too
        async with aiohttp.ClientSession() as s, s.ws_connect(server.ws_url) as ws:
            await ws.send_json(
                {"id": "w", "prompt": "Count:", "max_tokens": 2000, "ignore_eos": True}
            )
            await ws.receive_json(timeout=60)
        stats = await _wait_idle(server)
        assert stats["num_running"] == 0
        assert stats["num_pages_free"] + stats["num_pages_cached"] == stats["num_pages_total"]
        assert stats["num_aborted"] >= before["num_aborted"] + 2

    asyncio.run(go())


def test_default_max_tokens_fits_a_small_context_window(real_model_path):
    """A request that does not ask for a number of tokens gets what the window leaves
    after its prompt (the default 512 for chat is lowered), not a context error; one
    that asks for too many is still refused."""
    from tests.support.server import start_server, stop_server

    srv = start_server(real_model_path, "--kv-cache-mb", "64", "--max-context", "48")
    try:

        async def go():
            chat = {"messages": [{"role": "user", "content": "Hi"}], "temperature": 0}
            status, body = await post_json(f"{srv.url}/v1/chat/completions", chat)
            assert status == 200, body
            usage = body["usage"]
            assert usage["prompt_tokens"] + usage["completion_tokens"] <= 48
            prompt = {"prompt": "one two three four five six seven eight nine ten " * 4}
            status, body = await post_json(f"{srv.url}/v1/completions", prompt)
            assert status == 200, body
            assert body["usage"]["prompt_tokens"] + body["usage"]["completion_tokens"] <= 48
            status, body = await post_json(
                f"{srv.url}/v1/chat/completions", {**chat, "max_tokens": 48}
            )
            assert status == 400 and body["error"]["code"] == "context_length_exceeded", body

        asyncio.run(go())
    finally:
        stop_server(srv)
