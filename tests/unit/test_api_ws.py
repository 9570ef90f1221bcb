"""The WebSocket API against the fake engine: multiplexing, error frames on a socket that
stays usable, abort messages, and aborts when the socket closes."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from tests.support.fake_api import (
    ANSWER,
    CACHED_TOKENS,
    PIECES,
    PROMPT_TOKENS,
    Api,
    FakeEngine,
    collect,
    recv,
    serve,
    text_of,
    wait_for,
)

USAGE = {
    "prompt_tokens": PROMPT_TOKENS,
    "completion_tokens": len(PIECES),
    "total_tokens": PROMPT_TOKENS + len(PIECES),
    "prompt_tokens_details": {"cached_tokens": CACHED_TOKENS},
}


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serve(FakeEngine(delay_s=0.002)) as a:
        yield a


async def test_one_request(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "a", "prompt": "Hello", "max_tokens": 5})
        frames = (await collect(ws, {"a"}))["a"]
    *deltas, final = frames
    assert [d["type"] for d in deltas] == ["delta"] * len(PIECES)
    assert [d["text"] for d in deltas] == PIECES
    assert [d["token_ids"] for d in deltas] == [[100 + i] for i in range(len(PIECES))]
    assert all("logprobs" not in d for d in deltas)
    assert final == {
        "id": "a",
        "type": "final",
        "finish_reason": "length",
        "stop_reason": None,
        "usage": USAGE,
        "text": "",
    }
    (req,) = api.engine.requests
    assert req.rid.startswith("ws-") and req.rid.endswith("-a") and req.sampling.max_tokens == 5
    assert api.engine.aborted == []


async def test_multiplexed_requests(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "a", "prompt": "Hello"})
        await ws.send_json({"id": 7, "messages": [{"role": "user", "content": "Hi"}]})
        order: list[Any] = []
        frames: dict[Any, list[dict]] = {"a": [], 7: []}
        while sum(f["type"] == "final" for fs in frames.values() for f in fs) < 2:
            frame = await recv(ws)
            order.append(frame["id"])
            frames[frame["id"]].append(frame)
    assert text_of(frames["a"]) == text_of(frames[7]) == ANSWER
    assert order.index(7) < len(order) - order[::-1].index("a") - 1, "not interleaved"
    rids = [r.rid for r in api.engine.requests]
    assert len(set(rids)) == 2 and rids[0].endswith("-a") and rids[1].endswith("-7")
    assert api.engine.requests[1].messages is not None


async def test_same_client_ids_on_two_sockets_are_distinct_requests(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws1, api.client.ws_connect("/ws") as ws2:
        await ws1.send_json({"id": "x", "prompt": "Hello"})
        await ws2.send_json({"id": "x", "prompt": "Hello"})
        assert text_of((await collect(ws1, {"x"}))["x"]) == ANSWER
        assert text_of((await collect(ws2, {"x"}))["x"]) == ANSWER
    assert len({r.rid for r in api.engine.requests}) == 2


async def test_errors_keep_the_socket_usable(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_str("{oops")
        err = await recv(ws)
        assert err["type"] == "error" and err["id"] is None
        assert err["error"]["code"] == "invalid_json" and err["error"]["message"]

        await ws.send_str("[1, 2]")
        assert (await recv(ws))["error"]["code"] == "invalid_type"

        await ws.send_bytes(b'{"id": "b"}')
        assert (await recv(ws))["type"] == "error"

        await ws.send_json({"id": "t", "type": "dance"})
        err = await recv(ws)
        assert (err["id"], err["error"]["param"]) == ("t", "type")

        await ws.send_json({"id": "p", "prompt": "Hi", "temperature": "hot"})
        err = await recv(ws)
        assert err["id"] == "p" and err["error"]["param"] == "temperature"
        assert "temperature" in err["error"]["message"]

        await ws.send_json({"id": "q", "prompt": ""})
        assert (await recv(ws))["error"]["param"] == "prompt"

        await ws.send_json({"id": "r"})
        assert (await recv(ws))["error"]["code"] == "missing_required_parameter"

        await ws.send_json({"id": "s", "prompt": "Hi", "suffix": "x"})  # not dropped silently
        assert (await recv(ws))["error"]["param"] == "suffix"

        await ws.send_json({"id": {"x": 1}, "prompt": "Hi"})
        assert (await recv(ws))["error"]["param"] == "id"

        await ws.send_json({"id": "e", "prompt": "FAIL_NOW"})
        err = await recv(ws)
        assert err["id"] == "e" and err["error"]["code"] == "context_length_exceeded"

        await ws.send_json({"id": "f", "prompt": "FAIL_LATER"})
        frames = (await collect(ws, {"f"}))["f"]
        final = frames[-1]  # one final frame: finish_reason "error", the error, its status
        assert final["type"] == "final" and final["finish_reason"] == "error", final
        assert final["status"] == 500 and final["error"]["message"] == "the runner died"
        assert text_of(frames[:-1]) == "".join(PIECES[:2])

        await ws.send_json({"id": "c", "prompt": "CRASH"})
        err = await recv(ws)
        assert err["id"] == "c" and err["error"]["type"] == "internal_server_error"

        await ws.send_json({"id": "z", "prompt": "Hello", "max_tokens": 3})
        good = (await collect(ws, {"z"}))["z"]
        assert text_of(good) == ANSWER and good[-1]["usage"] == USAGE
    assert api.in_flight == 0


async def test_duplicate_in_flight_id(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "s", "prompt": "SLOW"})
        assert (await recv(ws))["type"] == "delta"
        await ws.send_json({"id": "s", "prompt": "Hello"})
        while (frame := await recv(ws))["type"] != "error":
            assert frame["type"] == "delta"
        assert frame["id"] == "s" and frame["error"]["code"] == "duplicate_id"
        assert len(api.engine.requests) == 1
        await ws.send_json({"type": "abort", "id": "s"})
        frames = (await collect(ws, {"s"}))["s"]
        assert frames[-1]["finish_reason"] == "abort"
        # the id is free again
        await ws.send_json({"id": "s", "prompt": "Hello"})
        assert text_of((await collect(ws, {"s"}))["s"]) == ANSWER


async def test_abort_message(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "s", "prompt": "SLOW"})
        await ws.send_json({"id": "k", "prompt": "SLOW"})
        seen = set()
        while len(seen) < 2:
            seen.add((await recv(ws))["id"])
        await ws.send_json({"type": "abort", "id": "s"})
        frames = (await collect(ws, {"s"}))["s"]
        final = frames[-1]
        assert final["type"] == "final" and final["finish_reason"] == "abort"
        assert final["usage"]["prompt_tokens"] == PROMPT_TOKENS
        assert final["usage"]["completion_tokens"] >= 1
        s_rid, k_rid = (r.rid for r in api.engine.requests)
        assert api.engine.aborted == [s_rid]  # "k" runs on
        assert (await recv(ws))["id"] == "k"

        await ws.send_json({"type": "abort", "id": "nope"})
        while (frame := await recv(ws))["type"] != "error":
            assert frame["id"] == "k"
        assert frame["id"] == "nope" and frame["error"]["code"] == "not_in_flight"
        await ws.send_json({"type": "abort", "id": "k"})
        assert (await collect(ws, {"k"}))["k"][-1]["finish_reason"] == "abort"
    assert sorted(api.engine.aborted) == sorted([s_rid, k_rid])
    assert api.in_flight == 0


async def test_closing_the_socket_aborts_in_flight_requests(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws:
        for cid in ("a", "b"):
            await ws.send_json({"id": cid, "prompt": "SLOW"})
        seen = set()
        while len(seen) < 2:
            seen.add((await recv(ws))["id"])
        await ws.send_json({"id": "done", "prompt": "Hello"})
        await collect(ws, {"done"})
    rids = {r.rid for r in api.engine.requests if r.rid.endswith(("-a", "-b"))}
    await wait_for(lambda: set(api.engine.aborted) == rids)
    await wait_for(lambda: api.in_flight == 0)


async def test_missing_id_is_assigned(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"prompt": "Hello"})
        first = await recv(ws)
        cid = first["id"]
        assert isinstance(cid, str) and cid
        frames = (await collect(ws, {cid}))[cid]
        assert text_of([first, *frames]) == ANSWER
    assert api.engine.requests[0].rid.endswith(f"-{cid}")


async def test_logprobs_frames(api: Api) -> None:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "l", "prompt": "Hello", "logprobs": True, "top_logprobs": 2})
        await ws.send_json({"id": "m", "prompt": "Hello", "logprobs": 1})
        frames = await collect(ws, {"l", "m"})
    first = frames["l"][0]["logprobs"]
    assert first == [
        {
            "token": "Hel",
            "token_id": 100,
            "logprob": -0.25,
            "bytes": list(b"Hel"),
            "top_logprobs": [
                {"token": "Hel", "token_id": 100, "logprob": -0.25},
                {"token": "alt", "token_id": 7, "logprob": -1.25},
            ],
        }
    ]
    assert all(len(f["logprobs"][0]["top_logprobs"]) == 1 for f in frames["m"][:-1])
    sampling = {r.rid[-1]: r.sampling for r in api.engine.requests}
    assert (sampling["l"].logprobs, sampling["l"].top_logprobs) == (True, 2)
    assert (sampling["m"].logprobs, sampling["m"].top_logprobs) == (True, 1)


async def test_n_choices_with_a_named_tool(api: Api) -> None:
    """``n: 2`` with a forced tool: every delta names its choice, and the final frame
    gives each choice's tool call (the fake engine's answer is the arguments)."""
    tool = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}
    frame = {
        "id": "t",
        "messages": [{"role": "user", "content": "Hi"}],
        "max_tokens": 5,
        "n": 2,
        "tools": [tool],
        "tool_choice": {"type": "function", "function": {"name": "f"}},
    }
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json(frame)
        frames = (await collect(ws, {"t"}))["t"]
    deltas = [f for f in frames if f["type"] == "delta"]
    for i in (0, 1):
        args = "".join(
            t["function"].get("arguments", "")
            for f in deltas
            if f["index"] == i
            for t in f.get("tool_calls", [])
        )
        assert args == ANSWER
    final = frames[-1]
    assert final["type"] == "final" and final["finish_reason"] == "length"
    assert [c["index"] for c in final["choices"]] == [0, 1]
    for c in final["choices"]:
        (call,) = c["tool_calls"]
        assert call["function"] == {"name": "f", "arguments": ANSWER}
    assert final["tool_calls"] == final["choices"][0]["tool_calls"]


async def test_a_slow_parse_holds_up_no_other_frame(api: Api, monkeypatch) -> None:
    """A frame whose parse waits (a grammar's check in the engine's child can take
    seconds) is parsed on a task of its own: a later frame on the socket runs meanwhile,
    and an abort of the waiting one ends it at once with a final "abort" frame (found by
    a review: the receive loop waited for the parse, and an abort took 10 s)."""
    import threading

    import houchu.api.ws.routes as ws_api

    release = threading.Event()
    real = ws_api.parse_ws_generate

    def parse(body: dict, **kw: Any):
        if body.get("prompt") == "slow":
            release.wait(timeout=30)  # a check that takes until the test says
        return real(body, **kw)

    monkeypatch.setattr(ws_api, "parse_ws_generate", parse)
    try:
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "slow", "prompt": "slow", "max_tokens": 5})
            await ws.send_json({"id": "fast", "prompt": "Hi", "max_tokens": 5})
            fast = (await collect(ws, {"fast"}))["fast"]
            assert fast[-1]["type"] == "final" and fast[-1]["finish_reason"] == "length"
            await ws.send_json({"type": "abort", "id": "slow"})
            (final,) = (await collect(ws, {"slow"}))["slow"]
            assert final["type"] == "final" and final["finish_reason"] == "abort"
            assert final["usage"]["completion_tokens"] == 0
            await ws.send_json({"id": "slow", "prompt": "Hi", "max_tokens": 5})  # id free
            again = (await collect(ws, {"slow"}))["slow"]
            assert again[-1]["type"] == "final"
    finally:
        release.set()
    assert len(api.engine.requests) == 2  # the aborted one never reached the engine
