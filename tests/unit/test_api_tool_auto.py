"""``tool_choice: "auto"`` over HTTP (the official ``openai`` client) and the WebSocket
API, for every ``--tool-call-parser``: a call the model writes to a function the request
did not offer stays content, whole and streamed, and ``finish_reason`` is "tool_calls"
only when the reply holds a call (``houchu.text.tool_calls.parse``)."""

from __future__ import annotations

from typing import Any

import pytest
from openai import AsyncOpenAI

from tests.support.fake_api import MODEL, collect, serve
from tests.support.tool_calls import HERMES_WEATHER, MESSAGES, WEATHER, ScriptedEngine

HERMES_LAUNCH = '<tool_call>{"name": "launch", "arguments": {}}</tool_call>'
MISTRAL_LAUNCH = '[TOOL_CALLS][{"name": "launch", "arguments": {}}]'

#: (parser, the model's reply, the content the client gets, the calls' names)
CASES = [
    ("hermes", "Sure. " + HERMES_LAUNCH, "Sure. " + HERMES_LAUNCH, []),
    ("hermes", HERMES_LAUNCH + HERMES_WEATHER, HERMES_LAUNCH, ["get_weather"]),
    ("hermes", HERMES_WEATHER, None, ["get_weather"]),
    ("mistral", MISTRAL_LAUNCH, MISTRAL_LAUNCH, []),
    ("mistral", MISTRAL_LAUNCH.replace("launch", "get_weather"), None, ["get_weather"]),
    (
        "llama3_json",
        '{"name": "launch", "parameters": {}}',
        '{"name": "launch", "parameters": {}}',
        [],
    ),
    ("llama3_json", '{"name": "get_weather", "parameters": {}}', None, ["get_weather"]),
]
IDS = [f"{c[0]}-{'+'.join(c[3]) or 'content'}-{i}" for i, c in enumerate(CASES)]


def _expected(content: str | None, names: list[str]) -> tuple[str | None, list[str], str]:
    return content, names, "tool_calls" if names else "stop"


@pytest.mark.parametrize(("parser", "reply", "content", "names"), CASES, ids=IDS)
async def test_auto_over_http(
    parser: str, reply: str, content: str | None, names: list[str]
) -> None:
    """The official client, whole and streamed: the same content, calls and finish."""
    async with serve(ScriptedEngine(reply), tool_call_parser=parser) as api:
        client = AsyncOpenAI(base_url=str(api.client.make_url("/v1")), api_key="x", max_retries=0)
        args: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "tools": [WEATHER]}
        try:
            whole = await client.chat.completions.create(**args)
            (choice,) = whole.choices
            calls = choice.message.tool_calls or []
            got = (choice.message.content, [c.function.name for c in calls], choice.finish_reason)
            assert got == _expected(content, names)
            assert api.engine.requests[0].tools == [WEATHER]  # the template is given the tools

            text, streamed, finish = "", {}, None
            async for chunk in await client.chat.completions.create(**args, stream=True):
                delta = chunk.choices[0].delta
                text += delta.content or ""
                for c in delta.tool_calls or []:
                    streamed.setdefault(c.index, c.function.name)
                finish = chunk.choices[0].finish_reason or finish
            got = (text or None, [streamed[i] for i in sorted(streamed)], finish)
            assert got == _expected(content, names)
        finally:
            await client.close()


@pytest.mark.parametrize(("parser", "reply", "content", "names"), CASES, ids=IDS)
async def test_auto_over_websocket(
    parser: str, reply: str, content: str | None, names: list[str]
) -> None:
    """The WebSocket API: the final frame's content, calls and finish, and the deltas'
    ``tool_calls``, agree with the HTTP reply."""
    async with serve(ScriptedEngine(reply), tool_call_parser=parser) as api:
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", "messages": MESSAGES, "tools": [WEATHER]})
            *deltas, final = (await collect(ws, {"t"}))["t"]
    assert final["type"] == "final"
    got = (final["content"], [c["function"]["name"] for c in final["tool_calls"]])
    assert (*got, final["finish_reason"]) == _expected(content, names)
    streamed = [c["function"]["name"] for d in deltas for c in d.get("tool_calls", [])]
    assert streamed == names
