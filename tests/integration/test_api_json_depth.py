"""Free-form JSON nested deeper than the gateway's walks can follow (issue 20): a JSON
schema (``guided_json``, ``response_format``, ``structured_outputs.json``, a tool's
``parameters``) or ``chat_template_kwargs`` deeper than ``MAX_JSON_DEPTH`` is a 400
naming its field, on chat completions, WebSocket frames and ``/tokenize`` alike, never
a ``RecursionError`` (an HTTP 500); ``MAX_JSON_DEPTH`` is the grammar engine's own
bound, and a schema that deep still compiles."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from llguidance import LLMatcher

from houchu.api.errors import ApiError
from houchu.api.requests.chat_template import template_options
from houchu.api.requests.json_depth import MAX_JSON_DEPTH, nesting_depth, too_deep
from houchu.api.requests.parse import parse_chat, parse_ws_generate
from houchu.api.requests.tools import REQUIRED_WRAP_DEPTH
from houchu.api.structured import guard as grammar_guard
from houchu.api.structured.request import SCHEMA_TOO_DEEP, checked, json_schema_grammar
from houchu.api.tokenize import GatewayTokenizer
from tests.support.fake_api import MAX_CONTEXT, MODEL, serve

pytestmark = pytest.mark.slow

MESSAGES = [{"role": "user", "content": "hi"}]
#: A schema shape: (levels one wrapping adds, the wrapping).
SHAPES: dict[str, tuple[int, Callable[[dict[str, Any]], dict[str, Any]]]] = {
    "anyOf": (2, lambda s: {"anyOf": [s]}),
    "properties": (2, lambda s: {"type": "object", "properties": {"a": s}}),
    "items": (1, lambda s: {"type": "array", "items": s}),
}
#: The depths the reviewer found answered with a 500 (levels of wrapping, by shape).
FOUND_500 = {"anyOf": 400, "properties": 330, "items": 500}


def wrapped(shape: str, times: int, inner: Any = None) -> dict[str, Any]:
    """``inner`` (default ``{"type": "integer"}``) wrapped ``times`` times in ``shape``;
    built in a loop (no recursion)."""
    schema = {"type": "integer"} if inner is None else inner
    wrap = SHAPES[shape][1]
    for _ in range(times):
        schema = wrap(schema)
    return schema


def of_depth(shape: str, depth: int) -> dict[str, Any]:
    """A schema of ``shape`` exactly ``depth`` levels deep (an object schema at the
    bottom: ``{"type": "integer"}``, or an enum of one array for the odd level)."""
    step = SHAPES[shape][0]
    times, left = divmod(depth - 1, step)
    bottom: dict[str, Any] = {"type": "integer"} if left == 0 else {"enum": [1]}
    schema = wrapped(shape, times, bottom)
    assert nesting_depth(schema, 10**6) == depth
    return schema


def deep_list(levels: int) -> list[Any]:
    """``[[[...]]]``, ``levels`` deep (built in a loop)."""
    value: list[Any] = []
    for _ in range(levels - 1):
        value = [value]
    return value


def tool(parameters: dict[str, Any]) -> dict[str, Any]:
    return {"type": "function", "function": {"name": "f", "parameters": parameters}}


def test_nesting_depth_counts_objects_and_arrays() -> None:
    assert [nesting_depth(v) for v in (1, "x", None, {}, [], {"a": [1]}, [[], [[{}]]])] == [
        0,
        0,
        0,
        1,
        1,
        2,
        4,
    ]
    assert nesting_depth(deep_list(5000), 10**6) == 5000  # iterative: any depth
    assert nesting_depth(deep_list(5000), 10) == 11  # stops past the limit
    assert too_deep(deep_list(MAX_JSON_DEPTH + 1)) and not too_deep(deep_list(MAX_JSON_DEPTH))


@pytest.mark.parametrize("shape", SHAPES)
def test_the_bound_is_the_grammar_engines(shape: str) -> None:
    """A schema ``MAX_JSON_DEPTH`` deep compiles, with every layout option; one level
    deeper the engine itself refuses it (so the bound is exactly its own), and the
    gateway says why in words."""
    deepest = of_depth(shape, MAX_JSON_DEPTH)
    for options in ({}, {"strict": True}, {"whitespace": r"[ ]?"}, {"compact": True}):
        checked(json_schema_grammar(deepest, **options), "guided_json", "json_schema")
    checked(json_schema_grammar(deepest, closed=True), "guided_json", "json_schema")
    over = of_depth(shape, MAX_JSON_DEPTH + 1)
    is_error, messages = grammar_guard.validate(LLMatcher.grammar_from_json_schema(over))
    assert is_error and "recursion limit" in messages[0], messages
    with pytest.raises(ValueError, match="nests more than 124 levels") as exc:
        json_schema_grammar(over)
    assert str(exc.value) == SCHEMA_TOO_DEEP


def _fields(schema: dict[str, Any]) -> list[tuple[dict[str, Any], str]]:
    """Every way a request gives ``schema``: (the body's fields, the param the 400
    names)."""
    params = {"type": "object", "properties": {"a": schema}}
    named = {"type": "function", "function": {"name": "f"}}
    return [
        ({"guided_json": schema}, "guided_json"),
        ({"structured_outputs": {"json": schema}}, "structured_outputs.json"),
        (
            {
                "response_format": {
                    "type": "json_schema",
                    "json_schema": {"name": "x", "schema": schema},
                }
            },
            "response_format",
        ),
        ({"tools": [tool(params)], "tool_choice": "required"}, "tools[0].function.parameters"),
        ({"tools": [tool(params)], "tool_choice": named}, "tools[0].function.parameters"),
        ({"tools": [tool(params)]}, "tools[0].function.parameters"),
    ]


@pytest.mark.parametrize("shape", SHAPES)
def test_a_deep_schema_is_a_400_in_every_field(shape: str) -> None:
    """The depths that gave a 500 (a ``RecursionError`` in the schema walks): a 400
    ``invalid_grammar`` naming the field, on chat completions and WebSocket frames."""
    schema = wrapped(shape, FOUND_500[shape])
    for fields, param in _fields(schema):
        for parse in (parse_chat, parse_ws_generate):
            body = {"messages": MESSAGES, "max_tokens": 3, **fields}
            with pytest.raises(ApiError) as exc:
                parse(body, model_name=MODEL, max_context=MAX_CONTEXT)
            err = exc.value
            assert (err.status, err.code, err.param) == (400, "invalid_grammar", param), err
            assert "nests more than" in err.message and param in err.message, err.message


def test_a_deep_schema_text_is_a_400() -> None:
    """A schema given as text deeper than Python's ``json`` reads (``RecursionError``)."""
    text = "[" * 100_000 + "]" * 100_000
    with pytest.raises(ApiError) as exc:
        parse_chat(
            {"messages": MESSAGES, "guided_json": text}, model_name=MODEL, max_context=MAX_CONTEXT
        )
    assert (exc.value.code, exc.value.param) == ("invalid_grammar", "guided_json")
    assert SCHEMA_TOO_DEEP in exc.value.message


def test_required_leaves_room_for_its_wrapping() -> None:
    """``required`` puts each function's parameters ``REQUIRED_WRAP_DEPTH`` levels down
    in its array's schema: parameters that fit it compile, one level more is a 400 that
    says so (a named call takes them, unwrapped)."""
    room = MAX_JSON_DEPTH - REQUIRED_WRAP_DEPTH
    for depth, fits in ((room, True), (room + 1, False)):
        params = {"type": "object", "properties": {"a": of_depth("items", depth - 2)}}
        assert nesting_depth(params) == depth
        body = {"messages": MESSAGES, "tools": [tool(params)], "tool_choice": "required"}
        if fits:
            assert parse_chat(body, model_name=MODEL, max_context=MAX_CONTEXT).tools
            continue
        with pytest.raises(ApiError) as exc:
            parse_chat(body, model_name=MODEL, max_context=MAX_CONTEXT)
        assert exc.value.param == "tools[0].function.parameters", exc.value
        assert "tool_choice 'required'" in exc.value.message
        named = {"type": "function", "function": {"name": "f"}}
        parsed = parse_chat(
            {**body, "tool_choice": named}, model_name=MODEL, max_context=MAX_CONTEXT
        )
        assert parsed.tools is not None and parsed.tools.choice == "named"


def test_deep_chat_template_kwargs_are_a_400() -> None:
    assert template_options({"x": deep_list(MAX_JSON_DEPTH - 1)}, None, None)
    with pytest.raises(ApiError) as exc:
        template_options({"x": deep_list(900)}, None, None)
    assert (exc.value.code, exc.value.param) == ("invalid_value", "chat_template_kwargs")
    assert "nests more than 124 levels" in exc.value.message


def _raw_body(extra: str) -> str:
    """A chat body (JSON text) with ``extra`` (``"key": value`` text) added."""
    return '{"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, ' + extra + "}"


def _anyof_text(times: int) -> str:
    """``wrapped("anyOf", times)`` as JSON text (a json encoder would recurse)."""
    return '{"anyOf": [' * times + '{"type": "integer"}' + "]}" * times


async def test_deep_schemas_over_http_are_400(real_model_path: Path) -> None:
    """Through the routes: chat completions, WebSocket frames and ``/tokenize`` (whose
    ``tools`` go through the same checks) answer 400, never 500."""
    deep = _anyof_text(FOUND_500["anyOf"])
    params = '{"type": "object", "properties": {"a": ' + deep + "}}"
    tools = '"tools": [{"type": "function", "function": {"name": "f", "parameters": ' + params
    tools += "}}]"
    headers = {"Content-Type": "application/json"}
    async with serve(tokenizer=GatewayTokenizer(real_model_path)) as api:
        for path, extra, param in (
            ("/v1/chat/completions", f'"guided_json": {deep}', "guided_json"),
            ("/v1/chat/completions", tools + ', "tool_choice": "required"', None),
            ("/tokenize", tools, None),
        ):
            async with api.client.post(path, data=_raw_body(extra), headers=headers) as r:
                body = await r.json()
            assert r.status == 400, body
            assert body["error"]["code"] == "invalid_grammar", body
            assert body["error"]["param"] == (param or "tools[0].function.parameters")
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_str(_raw_body(f'"id": "deep", "guided_json": {deep}'))
            err = await ws.receive_json(timeout=30)
            assert (err["id"], err["type"], err["status"]) == ("deep", "error", 400), err
            assert err["error"]["code"] == "invalid_grammar"


async def test_the_deepest_kwargs_a_body_holds_are_a_400() -> None:
    """``chat_template_kwargs`` as deep as the gateway decodes a body (msgspec stops
    near Python's recursion limit): a 400 naming it, not a 500 from the walks after."""
    headers = {"Content-Type": "application/json"}
    async with serve() as api:

        async def answer(levels: int) -> tuple[int, dict[str, Any]]:
            kwargs = '"chat_template_kwargs": {"x": ' + "[" * levels + "]" * levels + "}"
            async with api.client.post(
                "/v1/chat/completions", data=_raw_body(kwargs), headers=headers
            ) as r:
                return r.status, await r.json()

        low, high = MAX_JSON_DEPTH, 5000  # decoded, not decoded
        assert (await answer(high))[1]["error"]["message"] == "request body is nested too deeply"
        while high - low > 1:
            mid = (low + high) // 2
            status, body = await answer(mid)
            if body.get("error", {}).get("message") == "request body is nested too deeply":
                high = mid
                continue
            assert status == 400, (mid, status, body)
            assert body["error"]["param"] == "chat_template_kwargs", body
            low = mid
        assert low > 500  # the deepest value a body holds was tried
