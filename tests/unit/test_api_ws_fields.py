"""WebSocket frames against the HTTP request bodies, field by field: every field of
``POST /v1/completions`` and ``POST /v1/chat/completions`` is a frame field, served
with HTTP's meaning (``max_completion_tokens``) or refused with a typed error frame
(``stream: false``, ``stream_options``), never dropped."""

from __future__ import annotations

from typing import Any

import pytest

from houchu.api.schema.bodies import ChatCompletionRequest, CompletionRequest, WsGenerateRequest
from tests.support.fake_api import Api, FakeEngine, collect, serve

CHAT = [{"role": "user", "content": "Hi"}]


def test_every_http_field_is_a_frame_field() -> None:
    """``decode_request`` drops the keys a body's type does not list: a field HTTP
    serves and a frame's type lacked was silently ignored on the WebSocket API."""
    http = set(CompletionRequest.__struct_fields__) | set(ChatCompletionRequest.__struct_fields__)
    assert http <= set(WsGenerateRequest.__struct_fields__)


async def _frame(api: Api, frame: dict[str, Any]) -> list[dict[str, Any]]:
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "t", **frame})
        return (await collect(ws, {"t"}))["t"]


@pytest.mark.parametrize(
    ("fields", "limit"),
    [
        ({"max_completion_tokens": 2}, 2),
        ({"max_completion_tokens": 3, "max_tokens": 7}, 3),  # HTTP's rule: it wins
        ({"max_tokens": 7}, 7),
    ],
)
@pytest.mark.parametrize("source", [{"messages": CHAT}, {"prompt": "Hi"}], ids=["chat", "prompt"])
async def test_max_completion_tokens_limits_a_frame_as_it_limits_chat(
    fields: dict[str, Any], limit: int, source: dict[str, Any]
) -> None:
    async with serve(FakeEngine()) as api:
        frames = await _frame(api, {**source, **fields})
        assert frames[-1]["type"] == "final"
        (req,) = api.engine.requests
        assert req.sampling.max_tokens == limit and not req.sampling.max_tokens_is_default
        assert api.engine.records[0]["max_tokens"] == limit  # the dashboard's request view
        if "messages" in source:
            status, _ = await api.post("/v1/chat/completions", {**source, **fields})
            assert status == 200 and api.engine.requests[1].sampling.max_tokens == limit


@pytest.mark.parametrize(
    ("fields", "param", "says"),
    [
        ({"stream": False}, "stream", "always true on WebSocket frames"),
        ({"stream_options": {"include_usage": True}}, "stream_options", "always carries 'usage'"),
        ({"max_completion_tokens": 0}, "max_completion_tokens", "at least 1"),
        ({"max_completion_tokens": 10**6}, "max_completion_tokens", "context window"),
    ],
)
async def test_an_http_field_a_frame_does_not_serve_is_a_typed_error(
    fields: dict[str, Any], param: str, says: str
) -> None:
    async with serve(FakeEngine()) as api:
        (frame,) = await _frame(api, {"messages": CHAT, **fields})
        assert api.engine.requests == []
    assert frame["type"] == "error" and frame["status"] == 400
    assert frame["error"]["param"] == param and says in frame["error"]["message"]


async def test_neutral_streaming_fields_are_accepted() -> None:
    async with serve(FakeEngine()) as api:
        frames = await _frame(api, {"prompt": "Hi", "stream": True, "stream_options": {}})
    assert frames[-1]["type"] == "final"


#: (a frame's fields, the error code its error frame carries): as HTTP names the kind
FRAME_ERRORS = [
    ({"prompt": "Hi", "messages": CHAT}, "invalid_value"),  # /tokenize's code for both
    ({"max_tokens": 2}, "missing_required_parameter"),
    ({"prompt": "Hi", "temperature": 9}, None),  # any code, not null
    ({"prompt": "Hi", "guided_regex": "("}, "invalid_grammar"),
]


@pytest.mark.parametrize(("fields", "code"), FRAME_ERRORS)
async def test_an_error_frame_has_a_code(fields: dict[str, Any], code: str | None) -> None:
    """Every error frame has a machine-readable ``code``, never null."""
    async with serve(FakeEngine()) as api:
        (frame,) = await _frame(api, fields)
    assert frame["type"] == "error" and frame["status"] == 400
    assert frame["error"]["code"] is not None, frame
    assert code is None or frame["error"]["code"] == code, frame
