"""Stop strings and ``stop_token_ids`` beside a grammar: a forced tool call (``required``
or a named function) ends where its grammar ends, so neither cuts it (a cut call came
back as a call whose arguments do not parse, or as the grammar's array markup in the
content); beside ``response_format`` / ``guided_*`` they still end the output early, as
vLLM's do. Checked on the parsed request (HTTP chat and WebSocket frames), through the
real tokenizer's ``RequestText`` (which applies stop strings) and ``stop_ids`` (the ids
the scheduler ends a request on), and on what the served endpoints send the engine."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from openai import AsyncOpenAI

from houchu.api.requests.parse import parse_chat, parse_ws_generate
from houchu.text.request_text import RequestText
from houchu.text.stop import stop_ids
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer
from houchu.transport.messages import SamplingParams, TokenEvent
from tests.support.fake_api import MODEL, collect, serve
from tests.support.tool_calls import MESSAGES, WEATHER, ScriptedEngine

pytestmark = pytest.mark.slow

NAMED = {"type": "function", "function": {"name": "get_weather"}}
#: (tool_choice, the reply its grammar writes)
FORCED = [
    (NAMED, '{"city": "Oslo"}'),
    ("required", '[{"name": "get_weather", "parameters": {"city": "Oslo"}}]'),
]
STOPS: list[dict[str, Any]] = [
    {"stop": ['"']},
    {"stop": "}"},
    {"stop": ["{", "Oslo"], "include_stop_str_in_output": True},
    {"stop_token_ids": [1, 2, 3]},
]


@pytest.fixture(scope="module")
def tok(real_model_path: Path) -> TextTokenizer:
    return load_tokenizer(real_model_path)


def _parse(frame: bool, body: dict[str, Any]) -> SamplingParams:
    """The sampling of ``body`` parsed as an HTTP chat body or a WebSocket frame."""
    parse = parse_ws_generate if frame else parse_chat
    return parse(body, model_name=MODEL, max_context=512, vocab_size=49152).sampling


def _text(tok: TextTokenizer, sampling: SamplingParams, reply: str) -> tuple[str, str | None]:
    """(text, finish_reason) the tokenizer actor gives for ``reply``'s tokens, one event
    per token, the last one followed by EOS."""
    ids = tok.encode(reply)
    state = RequestText("r", tok, tok.encode("p"), sampling, stop_ids(sampling, tok.eos_token_ids))
    text, finish = "", None
    for i, t in enumerate(ids):
        last = i == len(ids) - 1
        ev = TokenEvent(
            rid="r",
            token_ids=[t, tok.eos_token_ids[0]] if last else [t],
            finish_reason="stop" if last else None,
        )
        delta = state.on_event(ev)
        if delta is not None:
            text, finish = text + delta.text, delta.finish_reason
        if state.finished:
            break
    return text, finish


@pytest.mark.parametrize("frame", [False, True], ids=["http", "websocket"])
@pytest.mark.parametrize("stops", STOPS)
@pytest.mark.parametrize(("choice", "reply"), FORCED, ids=["named", "required"])
def test_stops_do_not_end_a_forced_call(
    tok: TextTokenizer, frame: bool, stops: dict[str, Any], choice: Any, reply: str
) -> None:
    """The grammar decides where a forced call ends: its stop strings and stop token
    ids are not the engine's, so the whole call comes back."""
    body = {"messages": MESSAGES, "tools": [WEATHER], "tool_choice": choice, **stops}
    sampling = _parse(frame, body)
    assert (sampling.stop, sampling.stop_token_ids) == ([], [])
    assert stop_ids(sampling, tok.eos_token_ids) == list(tok.eos_token_ids)
    assert _text(tok, sampling, reply) == (reply, "stop")


@pytest.mark.parametrize("frame", [False, True], ids=["http", "websocket"])
@pytest.mark.parametrize(
    "grammar",
    [
        {"response_format": {"type": "json_object"}},
        {"guided_json": {"type": "object"}},
        {"structured_outputs": {"regex": '\\{"city": "[A-Za-z]+"\\}'}},
    ],
)
def test_stops_still_end_other_constrained_output(
    tok: TextTokenizer, frame: bool, grammar: dict[str, Any]
) -> None:
    """Beside ``response_format`` and its extensions, a stop string ends the output
    early and ``stop_token_ids`` end the request, as vLLM does."""
    body = {"messages": MESSAGES, "stop": ['"'], "stop_token_ids": [7], **grammar}
    sampling = _parse(frame, body)
    assert (sampling.stop, sampling.stop_token_ids) == (['"'], [7])
    assert stop_ids(sampling, tok.eos_token_ids)[0] == 7
    assert _text(tok, sampling, '{"city": "Oslo"}') == ("{", "stop")


async def test_served_forced_calls_send_the_engine_no_stops() -> None:
    """Over HTTP (whole and streamed) and WebSocket frames alike, the engine is asked
    for a forced call without the request's stops, and the reply is the whole call."""
    args = '{"city": "Oslo"}'
    stops = {"stop": ['"', "}"], "stop_token_ids": [5]}
    async with serve(ScriptedEngine(args, 3)) as api:
        client = AsyncOpenAI(base_url=str(api.client.make_url("/v1")), api_key="x", max_retries=0)
        kw: dict[str, Any] = {
            "model": MODEL,
            "messages": MESSAGES,
            "tools": [WEATHER],
            "tool_choice": NAMED,
        }
        try:
            whole = await client.chat.completions.create(**kw, extra_body=stops)
            (call,) = whole.choices[0].message.tool_calls or []
            assert call.function.arguments == args
            streamed = await client.chat.completions.create(**kw, stream=True, extra_body=stops)
            pieces = [
                c.function.arguments or ""
                async for chunk in streamed
                for c in chunk.choices[0].delta.tool_calls or []
                if c.function is not None
            ]
            assert "".join(pieces) == args
        finally:
            await client.close()
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json(
                {"id": "t", **{k: v for k, v in kw.items() if k != "model"}, **stops}
            )
            final = (await collect(ws, {"t"}))["t"][-1]
        assert final["tool_calls"][0]["function"]["arguments"] == args
    sent = [(r.sampling.stop, r.sampling.stop_token_ids) for r in api.engine.requests]
    assert sent == [([], [])] * 3
