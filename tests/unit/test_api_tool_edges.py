"""Tool calls at their edges, through the official ``openai`` client and the WebSocket
API in front of a scripted engine: a function declared without ``parameters`` takes
only ``{}``, a reply made only of calls streams no blank content, WebSocket deltas
carry the content (never the call markup) and the calls' deltas, and ``tools`` on a
prompt frame are refused as the completions API refuses them."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import msgspec
import openai
import pytest
from llguidance import LLMatcher, LLTokenizer
from openai import AsyncOpenAI

from houchu.transport.messages import GenerateRequest, TextDelta, TokenLogprob
from tests.support.fake_api import MODEL, collect, read_sse, serve
from tests.support.tool_calls import HERMES_WEATHER, MESSAGES, WEATHER, ScriptedEngine

PING = {"type": "function", "function": {"name": "ping", "description": "No arguments."}}
HERMES_PING = '<tool_call>{"name": "ping", "arguments": {}}</tool_call>'
#: (the model's reply, the content the whole reply has): calls and whitespace only have
#: none; with text beside them, the text and every blank between calls stay.
REPLIES = [
    (HERMES_WEATHER + "\n" + HERMES_PING, None),
    ("\n  " + HERMES_WEATHER + "\n\n" + HERMES_PING + "\n", None),
    ("Sure.\n" + HERMES_WEATHER + "\n" + HERMES_PING + "\n", "Sure.\n\n\n"),
    (HERMES_WEATHER + "\nDone.", "\nDone."),
    ("\n\n", "\n\n"),
]


def _follows(grammar: str, text: str) -> bool:
    """Whether llguidance's matcher (on a byte tokenizer) takes ``text`` whole."""
    m = LLMatcher(LLTokenizer("byte"), grammar, log_level=0)
    return m.consume_tokens(list(text.encode())) and m.is_accepting()


def _client(api: Any) -> AsyncOpenAI:
    return AsyncOpenAI(base_url=str(api.client.make_url("/v1")), api_key="x", max_retries=0)


@pytest.mark.parametrize(
    ("choice", "empty", "other"),
    [
        ({"type": "function", "function": {"name": "ping"}}, "{}", '{"x": 1}'),
        (
            "required",
            '[{"name": "ping", "parameters": {}}]',
            '[{"name": "ping", "parameters": {"{{d:5}}:x was a sole baker": 1}}]',
        ),
    ],
)
@pytest.mark.parametrize("declared", [{}, {"parameters": {}}], ids=["missing", "empty"])
async def test_a_function_without_parameters_takes_only_empty_arguments(
    choice: Any, empty: str, other: str, declared: dict
) -> None:
    """OpenAI reads a missing ``parameters`` as no parameters, and an empty
    ``parameters: {}`` declares none either: the forced call's grammar allows ``{}``
    only (not a JSON string or any object), and the chat template is told the same."""
    ping = {"type": "function", "function": {**PING["function"], **declared}}
    async with serve(ScriptedEngine("{}")) as api:
        client = _client(api)
        try:
            await client.chat.completions.create(
                model=MODEL, messages=MESSAGES, tools=[ping], tool_choice=choice
            )
        finally:
            await client.close()
    (req,) = api.engine.requests
    assert req.sampling.structured is not None
    grammar = req.sampling.structured.grammar
    assert _follows(grammar, empty) and not _follows(grammar, other)
    assert req.tools is not None
    params = req.tools[0]["function"]["parameters"]
    assert params == {"type": "object", "properties": {}, "additionalProperties": False}


@pytest.mark.parametrize("step", [1, 3, 1000])
@pytest.mark.parametrize(("reply", "content"), REPLIES)
async def test_streamed_content_is_the_whole_replys_content(
    reply: str, content: str | None, step: int
) -> None:
    """``auto``: whitespace between and around calls is not streamed as content when
    the reply is only calls (the whole reply's ``content`` is null); with text beside
    the calls the streamed content is the whole reply's, blanks included."""
    async with serve(ScriptedEngine(reply, step)) as api:
        client = _client(api)
        args: dict[str, Any] = {"model": MODEL, "messages": MESSAGES, "tools": [WEATHER, PING]}
        try:
            whole = await client.chat.completions.create(**args)
            pieces = []
            async for chunk in await client.chat.completions.create(**args, stream=True):
                if chunk.choices and chunk.choices[0].delta.content:
                    pieces.append(chunk.choices[0].delta.content)
        finally:
            await client.close()
    assert whole.choices[0].message.content == content
    assert ("".join(pieces) or None) == content
    if content is None:
        assert pieces == []


def _ws_reassembled(deltas: list[dict[str, Any]]) -> list[dict[str, str]]:
    """The calls the ``tool_calls`` deltas of ``deltas`` build, by index."""
    calls: dict[int, dict[str, str]] = {}
    for d in deltas:
        for t in d.get("tool_calls", []):
            call = calls.setdefault(t["index"], {"name": "", "arguments": ""})
            call["name"] += t.get("function", {}).get("name", "")
            call["arguments"] += t.get("function", {}).get("arguments", "")
    return [calls[i] for i in sorted(calls)]


@pytest.mark.parametrize(("reply", "content"), REPLIES)
async def test_websocket_deltas_carry_the_content_only(reply: str, content: str | None) -> None:
    """``auto`` on the WebSocket API: the delta texts are the reply's content (the
    final frame's, "" where that is null), never the call markup; the calls come as
    ``tool_calls`` deltas that rebuild the final frame's calls."""
    async with serve(ScriptedEngine(reply, 4)) as api:
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", "messages": MESSAGES, "tools": [WEATHER, PING]})
            *deltas, final = (await collect(ws, {"t"}))["t"]
    assert final["type"] == "final" and final["content"] == content
    texts = [d["text"] for d in deltas]
    assert "".join(texts) == (content or "")
    assert not any("<tool_call>" in t or "tool_call>" in t for t in texts)
    assert _ws_reassembled(deltas) == [c["function"] for c in final["tool_calls"]]


async def test_websocket_forced_call_streams_its_arguments() -> None:
    """A named ``tool_choice``: no delta text (the reply is the arguments, not content),
    the arguments streamed piece by piece as the SSE path streams them, and the final
    frame's call is what they build."""
    args = '{"city": "Oslo"}'
    named = {"type": "function", "function": {"name": "get_weather"}}
    async with serve(ScriptedEngine(args, 3)) as api:
        async with api.client.ws_connect("/ws") as ws:
            frame = {"id": "t", "messages": MESSAGES, "tools": [WEATHER], "tool_choice": named}
            await ws.send_json(frame)
            *deltas, final = (await collect(ws, {"t"}))["t"]
    assert [d["text"] for d in deltas] == [""] * len(deltas)
    pieces = [t["function"]["arguments"] for d in deltas for t in d.get("tool_calls", [])]
    assert len(pieces) == len(deltas) > 1 and "".join(pieces) == args
    assert final["content"] is None and final["text"] == ""
    (call,) = final["tool_calls"]
    assert (
        _ws_reassembled(deltas)
        == [call["function"]]
        == [{"name": "get_weather", "arguments": args}]
    )


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("tools", [WEATHER], "'tools' are accepted on chat requests only"),
        ("tool_choice", "required", "'tool_choice' is accepted on chat requests only"),
        ("tool_choice", "none", "'tool_choice' is accepted on chat requests only"),
    ],
)
async def test_tools_on_a_prompt_are_refused_alike_over_http_and_websocket(
    field: str, value: Any, message: str
) -> None:
    """``tools`` or ``tool_choice`` with a prompt (not ``messages``): the same 400, code
    and message on ``POST /v1/completions`` and on a WebSocket prompt frame."""
    async with serve(ScriptedEngine("x")) as api:
        status, body = await api.post(
            "/v1/completions", {"model": MODEL, "prompt": "Hi", field: value}
        )
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", "prompt": "Hi", field: value})
            (frame,) = (await collect(ws, {"t"}))["t"]
    assert status == 400 and frame["type"] == "error" and frame["status"] == 400
    assert body["error"]["code"] == frame["error"]["code"] == "unsupported_value"
    assert body["error"]["message"] == frame["error"]["message"] == message
    assert body["error"]["param"] == frame["error"]["param"] == field


async def test_an_empty_tools_array_is_refused_alike_over_http_and_websocket() -> None:
    """``tools: []`` is a 400 (OpenAI refuses an empty array), not a chat without tools."""
    chat = {"messages": [{"role": "user", "content": "Hi"}], "tools": []}
    async with serve(ScriptedEngine("x")) as api:
        status, body = await api.post("/v1/chat/completions", chat)
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", **chat})
            (frame,) = (await collect(ws, {"t"}))["t"]
        assert api.engine.requests == []
    assert status == 400 and frame["type"] == "error" and frame["status"] == 400
    assert body["error"] == frame["error"]
    assert body["error"]["param"] == "tools" and body["error"]["code"] == "invalid_value"
    assert body["error"]["message"] == "'tools' must have 1 to 128 items, got 0"


async def test_an_empty_tools_array_on_a_prompt_is_refused_as_any_tools_are() -> None:
    """On completions and WebSocket prompt frames any ``tools`` value, ``[]`` included,
    is a 400: tools belong to chat requests."""
    prompt = {"prompt": "Hi", "max_tokens": 2, "tools": []}
    async with serve(ScriptedEngine("x")) as api:
        status, body = await api.post("/v1/completions", prompt)
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", **prompt})
            (frame,) = (await collect(ws, {"t"}))["t"]
        assert api.engine.requests == []
    assert status == 400 and frame["type"] == "error" and frame["status"] == 400
    assert body["error"]["param"] == frame["error"]["param"] == "tools"
    assert "accepted on chat requests only" in body["error"]["message"]


#: (``parameters`` that are not an object schema, how the 400 names what was given)
NOT_OBJECTS = [
    ({"type": "string"}, "got type 'string'"),
    ({"type": "array", "items": {"type": "integer"}}, "got type 'array'"),
    ({"properties": {"a": {"type": "integer"}}}, "got a schema without 'type'"),
    ({"type": ["object", "null"]}, "got type ['object', 'null']"),
]


@pytest.mark.parametrize("choice", ["auto", "required", "named"])
@pytest.mark.parametrize(("parameters", "got"), NOT_OBJECTS)
async def test_parameters_that_are_not_an_object_schema_are_refused(
    parameters: dict[str, Any], got: str, choice: Any
) -> None:
    """OpenAI: a function's ``parameters`` is a JSON Schema of ``type: "object"``;
    anything else is a 400 (before, ``required`` returned arguments that were not an
    object). The official client over HTTP and a WebSocket frame alike."""
    tool = {"type": "function", "function": {"name": "f", "parameters": parameters}}
    if choice == "named":
        choice = {"type": "function", "function": {"name": "f"}}
    async with serve(ScriptedEngine("{}")) as api:
        client = _client(api)
        try:
            with pytest.raises(openai.BadRequestError) as err:
                await client.chat.completions.create(
                    model=MODEL, messages=MESSAGES, tools=[PING, tool], tool_choice=choice
                )
        finally:
            await client.close()
        async with api.client.ws_connect("/ws") as ws:
            frame = {"id": "t", "messages": MESSAGES, "tools": [PING, tool], "tool_choice": choice}
            await ws.send_json(frame)
            (answer,) = (await collect(ws, {"t"}))["t"]
        assert api.engine.requests == []
    assert answer["type"] == "error" and answer["status"] == 400
    body = err.value.body
    assert isinstance(body, dict) and body == answer["error"]
    assert body["param"] == "tools[1].function.parameters"
    assert body["code"] == "invalid_function_parameters"
    assert 'must be a JSON Schema of type "object"' in body["message"] and got in body["message"]


@pytest.mark.parametrize(
    ("choice", "reply"),
    [
        ({"type": "function", "function": {"name": "get_weather"}}, '{"city": "Oslo"}'),
        ("required", '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'),
    ],
    ids=["named", "required"],
)
async def test_a_forced_call_streams_no_empty_content(choice: Any, reply: str) -> None:
    """While a forced call's wrapper text is held back no empty content delta is sent
    (SSE: only the first role delta has ``content: ""``; WebSocket: every delta frame
    has text or a call), and every token id and logprob still comes, once."""
    async with serve(LogprobEngine(reply)) as api:
        body = {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": choice}
        body["logprobs"] = True
        async with api.client.post("/v1/chat/completions", json={**body, "stream": True}) as r:
            chunks = await read_sse(r)
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", **body})
            frames = (await collect(ws, {"t"}))["t"]
    deltas = [c["choices"][0]["delta"] for c in chunks if c["choices"]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert all(d.get("content") != "" for d in deltas[1:]), deltas
    assert any("tool_calls" in d for d in deltas)
    sent = [f for f in frames if f["type"] == "delta"]
    assert sent and all(f["text"] or f.get("tool_calls") for f in sent), sent
    sse_lps = [lp["token"] for c in chunks if c["choices"] for lp in _lps(c["choices"][0])]
    ws_lps = [lp["token"] for f in sent for lp in f["logprobs"]]
    assert "".join(sse_lps) == "".join(ws_lps) == reply
    ids = [t for f in sent for t in f["token_ids"]]
    assert (
        ids == list(range(100, 100 + len(ids)))
        and len(ids) == frames[-1]["usage"]["completion_tokens"]
    )


def _lps(choice: dict[str, Any]) -> list[dict[str, Any]]:
    return (choice.get("logprobs") or {}).get("content") or []


class LogprobEngine(ScriptedEngine):
    """``ScriptedEngine`` whose deltas carry each piece's logprob (one token a piece)."""

    async def generate(
        self, req: GenerateRequest, record: dict | None = None
    ) -> AsyncIterator[TextDelta]:
        async for d in super().generate(req, record):
            lp = TokenLogprob(d.text, d.token_ids[0], -0.5, list(d.text.encode()))
            yield msgspec.structs.replace(d, logprobs=[lp])
