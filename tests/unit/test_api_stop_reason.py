"""vLLM's ``stop_reason`` on the HTTP API (issue 20): every choice of a whole answer
has it (the stop string or ``stop_token_ids`` id that ended the choice, else null), and
so has the chunk that ends a streamed choice, as vLLM sends them; the answers and chunks
validate against the OpenAPI document, which describes the field. The WebSocket API's
final frame has it too, per choice."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import pytest

from houchu.transport.messages import GenerateRequest, TextDelta
from tests.support.fake_api import FakeEngine, collect, read_sse, serve
from tests.support.openapi import DOC, event_validator, validator


class StoppingEngine(FakeEngine):
    """``FakeEngine``, with each choice ended as the tokenizer actor ends one that a
    stop string or stop token ended: ``finish_reason`` "stop" and the request's first
    ``stop`` string (else its first ``stop_token_ids`` id) as ``stop_reason``; a request
    with neither ends "stop" (its EOS) with none."""

    def _delta(self, req: GenerateRequest, i: int, last: bool) -> TextDelta:
        delta = super()._delta(req, i, last)
        if not last:
            return delta
        s = req.sampling
        reason = s.stop[0] if s.stop else (s.stop_token_ids[0] if s.stop_token_ids else None)
        return msgspec.structs.replace(delta, finish_reason="stop", stop_reason=reason)


@pytest.fixture
async def api() -> AsyncIterator[Any]:
    async with serve(StoppingEngine()) as a:
        yield a


BODIES = {
    "/v1/completions": ({"prompt": "Hi", "n": 2}, "Completion"),
    "/v1/chat/completions": (
        {"messages": [{"role": "user", "content": "Hi"}], "n": 2},
        "ChatCompletion",
    ),
}


@pytest.mark.parametrize("path", BODIES)
@pytest.mark.parametrize(
    ("fields", "reason"),
    [({"stop": ["\n\n", "END"]}, "\n\n"), ({"stop_token_ids": [42]}, 42), ({}, None)],
)
async def test_stop_reason_whole_and_streamed(
    api: Any, path: str, fields: dict[str, Any], reason: int | str | None
) -> None:
    body, schema = BODIES[path]
    status, whole = await api.post(path, {**body, **fields})
    assert status == 200, whole
    assert [(c["finish_reason"], c["stop_reason"]) for c in whole["choices"]] == [
        ("stop", reason)
    ] * 2
    validator(schema).validate(whole)
    async with api.client.post(path, json={**body, **fields, "stream": True}) as r:
        chunks = await read_sse(r)
    events = event_validator(path)
    for chunk in chunks:
        events.validate(chunk)
    ends = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"] is not None]
    assert sorted((c["index"], c["stop_reason"]) for c in ends) == [(0, reason), (1, reason)]
    others = [c["choices"][0] for c in chunks if c["choices"][0]["finish_reason"] is None]
    assert others and all("stop_reason" not in c for c in others)  # the last chunk only


async def test_another_finish_reason_has_a_null_stop_reason() -> None:
    async with serve(FakeEngine()) as api:  # ends every choice "length"
        status, whole = await api.post("/v1/completions", {"prompt": "Hi", "stop": ["x"]})
        assert status == 200
        (choice,) = whole["choices"]
        assert (choice["finish_reason"], choice["stop_reason"]) == ("length", None)


def test_the_document_describes_stop_reason() -> None:
    schemas = DOC["components"]["schemas"]
    for name in ("ChatChoice", "CompletionChoice"):
        assert "stop_reason" in schemas[name]["required"], name
    for name in ("ChatChoice", "CompletionChoice", "ChatChunkChoice", "CompletionChunkChoice"):
        types = {s.get("type") for s in schemas[name]["properties"]["stop_reason"]["anyOf"]}
        assert types == {"integer", "string", "null"}, (name, types)


@pytest.mark.parametrize(
    ("fields", "reason"),
    [({"stop": ["\n\n", "END"]}, "\n\n"), ({"stop_token_ids": [42]}, 42), ({}, None)],
)
async def test_the_websocket_final_frame_has_stop_reason(
    api: Any, fields: dict[str, Any], reason: int | str | None
) -> None:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "one", "prompt": "Hi", "max_tokens": 3, **fields})
        await ws.send_json({"id": "two", "prompt": "Hi", "max_tokens": 3, "n": 2, **fields})
        frames = await collect(ws, {"one", "two"})
    one, two = frames["one"][-1], frames["two"][-1]
    assert one["type"] == "final" and (one["finish_reason"], one["stop_reason"]) == (
        "stop",
        reason,
    )
    assert [(c["index"], c["stop_reason"]) for c in two["choices"]] == [(0, reason), (1, reason)]
