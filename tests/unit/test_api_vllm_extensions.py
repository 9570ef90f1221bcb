"""vLLM's extensions that were dropped without a word: ``stream_options.
continuous_usage_stats`` (usage in every chunk), ``guided_whitespace_pattern`` (and
``structured_outputs.whitespace_pattern``: the whitespace of JSON output), vLLM's
``structured_outputs.disable_any_whitespace``, ``disable_additional_properties`` and
``disable_fallback`` (as vLLM's guidance backend reads them), and a
``structured_outputs`` naming no constraint (a 400, as vLLM refuses it)."""

from __future__ import annotations

from typing import Any

import pytest
from llguidance import LLMatcher, LLTokenizer

from houchu.api.openapi import openapi_document
from tests.support.fake_api import PIECES, PROMPT_TOKENS, FakeEngine, collect, read_sse, serve

CHAT = [{"role": "user", "content": "Hi"}]
SCHEMA = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}
LIST_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "array", "items": {"type": "integer"}}},
    "required": ["a"],
}
#: objects under properties, items, anyOf and $defs
NESTED_SCHEMA = {
    "type": "object",
    "properties": {
        "o": {"type": "array", "items": {"anyOf": [{"$ref": "#/$defs/x"}]}},
        "d": {"type": "object", "properties": {"y": {"type": "string"}}, "required": ["y"]},
    },
    "required": ["o", "d"],
    "$defs": {"x": {"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}},
}
OPEN_SCHEMA = {
    "type": "object",
    "properties": {"a": {"type": "integer"}},
    "required": ["a"],
    "additionalProperties": {"type": "integer"},
}


def _follows(grammar: str, text: str) -> bool:
    m = LLMatcher(LLTokenizer("byte"), grammar, log_level=0)
    return m.consume_tokens(list(text.encode())) and m.is_accepting()


@pytest.mark.parametrize(
    ("path", "body"),
    [("/v1/completions", {"prompt": "Hi"}), ("/v1/chat/completions", {"messages": CHAT})],
)
@pytest.mark.parametrize("n", [1, 2])
async def test_continuous_usage_stats_puts_usage_in_every_chunk(
    path: str, body: dict[str, Any], n: int
) -> None:
    """Each chunk of a choice counts the prompt and that choice's tokens so far (vLLM's
    counts); the last chunk has the whole request's usage."""
    options = {"include_usage": True, "continuous_usage_stats": True}
    async with serve(FakeEngine()) as api:
        async with api.client.post(
            path, json={**body, "n": n, "stream": True, "stream_options": options}
        ) as r:
            chunks = await read_sse(r)
    *per_choice, last = chunks
    assert last["choices"] == [] and last["usage"]["completion_tokens"] == n * len(PIECES)
    seen: dict[int, list[int]] = {}
    for chunk in per_choice:
        usage = chunk["usage"]
        assert usage is not None and usage["prompt_tokens"] == PROMPT_TOKENS
        assert usage["total_tokens"] == usage["prompt_tokens"] + usage["completion_tokens"]
        seen.setdefault(chunk["choices"][0]["index"], []).append(usage["completion_tokens"])
    for counts in seen.values():  # each choice's own count, growing to its whole
        assert counts == sorted(counts) and counts[-1] == len(PIECES) and counts[0] >= 1


@pytest.mark.parametrize("options", [{"include_usage": True}, {"continuous_usage_stats": True}])
async def test_without_both_options_chunks_carry_no_running_usage(options: dict) -> None:
    """vLLM: continuous usage only beside ``include_usage``."""
    async with serve(FakeEngine()) as api:
        body = {"prompt": "Hi", "stream": True, "stream_options": options}
        async with api.client.post("/v1/completions", json=body) as r:
            chunks = await read_sse(r)
    with_choices = [c for c in chunks if c["choices"]]
    assert all(c.get("usage") is None for c in with_choices)


#: (fields, JSON the grammar takes, JSON it refuses)
WHITESPACE = [
    ({"guided_json": SCHEMA, "guided_whitespace_pattern": "[ ]?"}, '{ "a": 1 }', '{"a":  1}'),
    (
        {"response_format": {"type": "json_object"}, "guided_whitespace_pattern": "\\n?"},
        '{\n"a":1\n}',
        '{ "a": 1}',
    ),
    (
        {"structured_outputs": {"json": SCHEMA, "whitespace_pattern": " *"}},
        '{  "a" :   1}',
        '{\n"a": 1}',
    ),
    ({"guided_json": SCHEMA}, '{"a": 1}', '{ "a": 1 }'),  # houchu's layout without one
    (  # vLLM's disable_any_whitespace: none at all, not even houchu's ", " and ": "
        {"structured_outputs": {"json": LIST_SCHEMA, "disable_any_whitespace": True}},
        '{"a":[1,2]}',
        '{"a": [1, 2]}',
    ),
    (
        {"structured_outputs": {"json_object": True, "disable_any_whitespace": True}},
        '{"b":{"c":[]}}',
        '{"b": {}}',
    ),
    (  # false: houchu's layout; disable_fallback: accepted, no effect
        {
            "structured_outputs": {
                "json": LIST_SCHEMA,
                "disable_any_whitespace": False,
                "disable_fallback": True,
            }
        },
        '{"a": [1, 2]}',
        '{"a":[1,2]}',
    ),
    (  # an object schema that does not say additionalProperties gets false
        {"structured_outputs": {"json": SCHEMA, "disable_additional_properties": True}},
        '{"a": 1}',
        '{"a": 1, "b": 2}',
    ),
    (  # nested too (under properties, items, anyOf, $defs)
        {"structured_outputs": {"json": NESTED_SCHEMA, "disable_additional_properties": True}},
        '{"o": [{"x": 1}], "d": {"y": "z"}}',
        '{"o": [{"x": 1, "q": 2}], "d": {"y": "z"}}',
    ),
    (
        {"structured_outputs": {"json": NESTED_SCHEMA, "disable_additional_properties": True}},
        '{"o": [{"x": 1}], "d": {"y": "z"}}',
        '{"o": [{"x": 1}], "d": {"y": "z", "w": 1}}',
    ),
    (  # without it, an unnamed property is allowed (JSON Schema's default)
        {"structured_outputs": {"json": NESTED_SCHEMA, "disable_additional_properties": False}},
        '{"o": [{"x": 1, "q": 2}], "d": {"y": "z", "w": 1}}',
        '{"o": [{"x": "1"}], "d": {"y": "z"}}',
    ),
    (  # an object that says additionalProperties keeps it
        {"structured_outputs": {"json": OPEN_SCHEMA, "disable_additional_properties": True}},
        '{"a": 1, "b": 2}',
        '{"a": 1, "b": "2"}',
    ),
]


@pytest.mark.parametrize(("fields", "takes", "refuses"), WHITESPACE)
@pytest.mark.parametrize("over", ["http", "ws"])
async def test_whitespace_pattern_sets_the_json_whitespace(
    fields: dict[str, Any], takes: str, refuses: str, over: str
) -> None:
    async with serve(FakeEngine()) as api:
        if over == "ws":
            async with api.client.ws_connect("/ws") as ws:
                await ws.send_json({"id": "t", "messages": CHAT, **fields})
                assert (await collect(ws, {"t"}))["t"][-1]["type"] == "final"
        else:
            status, _ = await api.post("/v1/chat/completions", {"messages": CHAT, **fields})
            assert status == 200
        structured = api.engine.requests[0].sampling.structured
    assert structured is not None
    assert _follows(structured.grammar, takes) and not _follows(structured.grammar, refuses)


#: (fields, the parameter the 400 names, words of its message)
REFUSED = [
    ({"structured_outputs": {}}, "structured_outputs", "names no constraint"),
    ({"structured_outputs": {"json_object": False}}, "structured_outputs.json_object", "true"),
    (
        {"structured_outputs": {"whitespace_pattern": " *"}},
        "structured_outputs",
        "names no constraint",
    ),
    ({"guided_whitespace_pattern": " *"}, "guided_whitespace_pattern", "none is given"),
    (
        {"guided_regex": "a+", "guided_whitespace_pattern": " *"},
        "guided_whitespace_pattern",
        "not to 'guided_regex'",
    ),
    (
        {"guided_json": SCHEMA, "guided_whitespace_pattern": "("},
        "guided_whitespace_pattern",
        "not a valid regular expression",
    ),
    (
        {
            "structured_outputs": {"json": SCHEMA, "whitespace_pattern": " "},
            "guided_whitespace_pattern": " ",
        },
        "structured_outputs.whitespace_pattern",
        "not both",
    ),
    (
        {"structured_outputs": {"regex": "a+", "disable_any_whitespace": True}},
        "structured_outputs.disable_any_whitespace",
        "not to 'structured_outputs.regex'",
    ),
    (
        {"structured_outputs": {"choice": ["a"], "disable_additional_properties": True}},
        "structured_outputs.disable_additional_properties",
        "applies to a JSON structured output constraint",
    ),
    (
        {
            "structured_outputs": {
                "json": SCHEMA,
                "whitespace_pattern": " ",
                "disable_any_whitespace": True,
            }
        },
        "structured_outputs.whitespace_pattern",
        "not both",
    ),
]


@pytest.mark.parametrize(("fields", "param", "says"), REFUSED)
async def test_extensions_that_name_no_constraint_are_refused(
    fields: dict[str, Any], param: str, says: str
) -> None:
    """Before, these ran unconstrained (or ignored the pattern) without a word."""
    async with serve(FakeEngine()) as api:
        status, body = await api.post("/v1/completions", {"prompt": "Hi", **fields})
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", "prompt": "Hi", **fields})
            (frame,) = (await collect(ws, {"t"}))["t"]
        assert api.engine.requests == []
    assert status == 400 and frame["type"] == "error" and frame["error"] == body["error"]
    assert body["error"]["param"] == param and says in body["error"]["message"]


UNSERVED = [
    ({"skip_special_tokens": False}, "skip_special_tokens", "never holds special tokens"),
    ({"spaces_between_special_tokens": False}, "spaces_between_special_tokens", "not served"),
    ({"length_penalty": 2.0}, "length_penalty", "beam search"),
    ({"truncate_prompt_tokens": 2}, "truncate_prompt_tokens", "never cuts a prompt"),
    ({"truncate_prompt_tokens": -1}, "truncate_prompt_tokens", "never cuts a prompt"),
]


@pytest.mark.parametrize(("fields", "param", "says"), UNSERVED)
async def test_vllm_fields_not_served_are_refused_not_ignored(
    fields: dict[str, Any], param: str, says: str
) -> None:
    """They were ignored whatever their value: a client cutting prompts with
    ``truncate_prompt_tokens`` got its whole prompt run without a word."""
    async with serve(FakeEngine()) as api:
        status, body = await api.post("/v1/completions", {"prompt": "Hi", **fields})
        chat = {"messages": [{"role": "user", "content": "Hi"}], **fields}
        chat_status, chat_body = await api.post("/v1/chat/completions", chat)
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", "prompt": "Hi", **fields})
            (frame,) = (await collect(ws, {"t"}))["t"]
        assert api.engine.requests == []
        ok, _ = await api.post("/v1/completions", {"prompt": "Hi", "skip_special_tokens": True})
    assert status == chat_status == 400 and frame["type"] == "error"
    assert body["error"]["param"] == chat_body["error"]["param"] == param
    assert says in body["error"]["message"] and ok == 200


@pytest.mark.parametrize(
    "field",
    [
        {"chat_template_kwargs": {"a": 1}},
        {"add_generation_prompt": True},
        {"continue_final_message": False},
        {"parallel_tool_calls": True},
        {"top_logprobs": 2},
        {"max_completion_tokens": 10**30},
    ],
)
async def test_chat_fields_on_a_completion_are_refused(field: dict[str, Any]) -> None:
    (name,) = field
    async with serve(FakeEngine()) as api:
        status, body = await api.post("/v1/completions", {"prompt": "Hi", **field})
        assert api.engine.requests == []
    assert status == 400 and body["error"]["param"] == name
    assert "chat requests only" in body["error"]["message"]


def test_the_openapi_document_describes_vllms_structured_output_options() -> None:
    props = openapi_document()["components"]["schemas"]["StructuredOutputs"]["properties"]
    words = {
        "disable_any_whitespace": "no whitespace at all",
        "disable_additional_properties": "additionalProperties: false",
        "disable_fallback": "no fallback",
    }
    for name, says in words.items():
        assert says in props[name]["anyOf"][0]["description"], name
