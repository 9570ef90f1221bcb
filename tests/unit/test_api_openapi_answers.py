"""The OpenAPI document describes what the gateway sends: whole answers (tool calls and
``content: null`` included) and every server-sent chunk validate against the
document's schemas (``ChatCompletion``, ``ChatCompletionChunk``, ``Completion``,
``CompletionChunk``, ``ErrorResponse``); ``finish_reason`` is an enum."""

from __future__ import annotations

from typing import Any

import jsonschema
import pytest

from tests.support.fake_api import FakeEngine, read_sse, serve
from tests.support.openapi import DOC, event_validator, validator
from tests.support.tool_calls import HERMES_WEATHER, MESSAGES, WEATHER, ScriptedEngine

NAMED = {"type": "function", "function": {"name": "get_weather"}}


#: (engine, path, body, the whole answer's schema)
CASES = [
    (
        lambda: ScriptedEngine(HERMES_WEATHER),
        "/v1/chat/completions",
        {"messages": MESSAGES, "tools": [WEATHER]},
        "ChatCompletion",
    ),
    (
        lambda: ScriptedEngine('{"city": "Oslo"}'),
        "/v1/chat/completions",
        {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": NAMED},
        "ChatCompletion",
    ),
    (
        FakeEngine,
        "/v1/chat/completions",
        {"messages": MESSAGES, "n": 2, "logprobs": True, "top_logprobs": 2},
        "ChatCompletion",
    ),
    (
        FakeEngine,
        "/v1/completions",
        {"prompt": "Hi", "n": 2, "logprobs": 2},
        "Completion",
    ),
]


@pytest.mark.parametrize(("engine", "path", "body", "schema"), CASES)
async def test_answers_and_chunks_validate_against_the_document(
    engine: Any, path: str, body: dict[str, Any], schema: str
) -> None:
    async with serve(engine()) as api:
        status, whole = await api.post(path, body)
        assert status == 200
        validator(schema).validate(whole)
        stream = {**body, "stream": True, "stream_options": {"include_usage": True}}
        async with api.client.post(path, json=stream) as r:
            chunks = await read_sse(r)
    events = event_validator(path)
    for chunk in chunks:
        events.validate(chunk)
    if "tools" in body:  # the reply is a call: no content, and the document says so
        (choice,) = whole["choices"]
        assert choice["message"]["content"] is None and choice["message"]["tool_calls"]
        assert choice["finish_reason"] == "tool_calls"
        assert any("tool_calls" in c["choices"][0]["delta"] for c in chunks if c["choices"])


async def test_a_stream_that_fails_midway_validates() -> None:
    """The last chunk of a failed stream (``finish_reason: "error"``) and the error
    event are the document's."""
    async with serve(FakeEngine()) as api:
        body = {"prompt": "FAIL_LATER", "stream": True}
        async with api.client.post("/v1/completions", json=body) as r:
            chunks = await read_sse(r)
    assert chunks[-2]["choices"][0]["finish_reason"] == "error" and "error" in chunks[-1]
    events = event_validator("/v1/completions")
    for chunk in chunks:
        events.validate(chunk)


@pytest.mark.parametrize(
    ("schema", "answer"),
    [
        ("ChatChoice", {"index": 0, "message": {"role": "assistant"}, "finish_reason": "stop"}),
        (
            "ChatChoice",
            {
                "index": 0,
                "message": {"role": "assistant", "content": "x"},
                "finish_reason": "done",
            },
        ),
        ("CompletionChunkChoice", {"index": 0, "text": "", "logprobs": None}),
        ("ToolCall", {"id": "c", "type": "function", "function": {"name": "f"}}),
    ],
)
def test_the_document_refuses_what_the_gateway_never_sends(
    schema: str, answer: dict[str, Any]
) -> None:
    """A message without ``content`` (null is given, not left out), a finish reason
    houchu does not send, a chunk choice without ``finish_reason``, a call without
    ``arguments``."""
    with pytest.raises(jsonschema.ValidationError):
        validator(schema).validate(answer)


def test_finish_reason_is_an_enum() -> None:
    schemas = DOC["components"]["schemas"]
    reasons = {"stop", "length", "tool_calls", "abort", "error"}
    assert set(schemas["ChatChoice"]["properties"]["finish_reason"]["enum"]) == reasons
    chunk = schemas["ChatChunkChoice"]["properties"]["finish_reason"]["anyOf"]
    assert {"type": "null"} in chunk and any(set(s.get("enum", ())) == reasons for s in chunk)
