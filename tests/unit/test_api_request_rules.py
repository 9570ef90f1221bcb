"""Request rules OpenAI (or vLLM) states and a client relies on, through the official
``openai`` client, plain HTTP and the WebSocket API in front of the fake engine:
parameters an output grammar would override are refused, a ``tool`` turn names the call
it answers, ``response_format.json_schema.name`` has OpenAI's form, and a bad
``logit_bias`` entry's 400 names its key and the allowed range. ``ignore_eos`` beside a
grammar keeps EOS a stop token (``houchu.text.stop``)."""

from __future__ import annotations

from typing import Any

import pytest

from houchu.text.stop import stop_ids
from houchu.transport.messages import SamplingParams
from houchu.transport.structured import StructuredOutput
from tests.support.fake_api import collect
from tests.support.vocab_api import MESSAGES, VOCAB, chat_error, follows, serve_vocab

NAMED = {"type": "function", "function": {"name": "f"}}
TOOL_F = {"type": "function", "function": {"name": "f", "parameters": {"type": "object"}}}


#: (extra body, the conflicting parameter, the grammar's parameter)
CONFLICTS = [
    ({"guided_choice": ["yes", "no"], "min_tokens": 10}, "min_tokens", "guided_choice"),
    (
        {"response_format": {"type": "json_object"}, "min_tokens": 1},
        "min_tokens",
        "response_format",
    ),
    ({"regex": "[ab]+", "allowed_token_ids": [1, 2]}, "allowed_token_ids", "regex"),
    ({"tools": [TOOL_F], "tool_choice": NAMED, "min_tokens": 3}, "min_tokens", "tool_choice"),
    (
        {"tools": [TOOL_F], "tool_choice": "required", "allowed_token_ids": [5]},
        "allowed_token_ids",
        "tool_choice",
    ),
    ({"guided_choice": ["Paris"], "bad_words": ["Paris"]}, "bad_words", "guided_choice"),
    (
        {"structured_outputs": {"choice": [" yes", "no"]}, "bad_words": ["yes", " no", "x"]},
        "bad_words",
        "structured_outputs.choice",
    ),
]


@pytest.mark.parametrize(("extra", "param", "grammar"), CONFLICTS)
async def test_a_grammar_beside_min_tokens_or_allowed_token_ids_is_refused(
    extra: dict[str, Any], param: str, grammar: str
) -> None:
    """Over HTTP and on the WebSocket API: a 400 naming both parameters, and nothing
    reaches the engine."""
    async with serve_vocab() as api:
        kw = {k: v for k, v in extra.items() if k in ("tools", "tool_choice", "response_format")}
        body = await chat_error(api, messages=MESSAGES, extra_body=extra, **kw)
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", "messages": MESSAGES, **extra})
            (frame,) = (await collect(ws, {"t"}))["t"]
    for error in (body, frame["error"]):
        assert error["param"] == param and error["code"] == "invalid_value"
        assert f"'{param}'" in error["message"] and f"'{grammar}'" in error["message"]
    assert frame["status"] == 400 and api.engine.requests == []


@pytest.mark.parametrize(
    "extra",
    [
        {"guided_choice": ["Paris", "London"], "bad_words": ["Paris"]},  # London is left
        {"guided_choice": ["Paris!"], "bad_words": ["Paris"]},  # token-level, as vLLM's
        {"guided_regex": "Paris", "bad_words": ["Paris"]},  # the grammar wins (README)
    ],
)
async def test_bad_words_beside_a_grammar_that_can_avoid_them_are_accepted(
    extra: dict[str, Any],
) -> None:
    async with serve_vocab() as api:
        status, _ = await api.post("/v1/chat/completions", {"messages": MESSAGES, **extra})
    assert status == 200 and api.engine.requests[0].sampling.bad_words == extra["bad_words"]


async def test_zero_min_tokens_beside_a_grammar_is_accepted() -> None:
    async with serve_vocab() as api:
        body = {"messages": MESSAGES, "guided_choice": ["yes", "no"], "min_tokens": 0}
        status, _ = await api.post("/v1/chat/completions", body)
    assert status == 200 and api.engine.requests[0].sampling.structured is not None


def test_ignore_eos_beside_a_grammar_keeps_eos_a_stop_token() -> None:
    """The grammar's end (where it allows only EOS) ends the output, with or without
    ``ignore_eos``; a free request with ``ignore_eos`` has no EOS stop."""
    grammar = StructuredOutput(kind="choice", grammar="x", param="guided_choice")
    free = SamplingParams(ignore_eos=True, stop_token_ids=[7])
    assert stop_ids(free, [2]) == [7]
    constrained = SamplingParams(ignore_eos=True, stop_token_ids=[7], structured=grammar)
    assert stop_ids(constrained, [2]) == [7, 2]


async def test_a_tool_turn_needs_its_tool_call_id() -> None:
    """OpenAI refuses a ``tool`` message without ``tool_call_id``; with it, accepted."""
    call = {"id": "call_1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
    history = [
        *MESSAGES,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "content": "42"},
    ]
    async with serve_vocab() as api:
        body = await chat_error(api, messages=history)
        assert body["param"] == "messages[2].tool_call_id"
        assert body["code"] == "missing_required_parameter"
        history[2]["tool_call_id"] = "call_1"
        status, _ = await api.post("/v1/chat/completions", {"messages": history})
    assert status == 200


@pytest.mark.parametrize("name", ["my schema", "x" * 65, "", "naïve", "a.b", "abc\n"])
async def test_a_json_schema_name_outside_openais_pattern_is_refused(name: str) -> None:
    fmt = {"type": "json_schema", "json_schema": {"name": name, "schema": {"type": "object"}}}
    async with serve_vocab() as api:
        body = await chat_error(api, messages=MESSAGES, response_format=fmt)
    assert body["param"] == "response_format.json_schema.name"
    # OpenAI's pattern ^[a-zA-Z0-9_-]{1,64}$, said in words rather than as a regex
    assert "must be 1-64 characters of a-z, A-Z, 0-9, _ or -, got" in body["message"]
    assert "^[" not in body["message"] and "(?!" not in body["message"]


async def test_a_json_schema_without_schema_is_any_json_object() -> None:
    """``json_schema`` without ``schema`` constrains as ``json_object`` does (README)."""
    grammars = []
    async with serve_vocab() as api:
        for fmt in (
            {"type": "json_schema", "json_schema": {"name": "Any_1-x" + "y" * 57}},
            {"type": "json_object"},
        ):
            status, _ = await api.post(
                "/v1/chat/completions", {"messages": MESSAGES, "response_format": fmt}
            )
            assert status == 200
            structured = api.engine.requests[-1].sampling.structured
            assert structured is not None
            grammars.append(structured.grammar)
    assert grammars[0] == grammars[1]
    assert follows(grammars[0], '{"a": [1]}') and not follows(grammars[0], "[1]")


#: (logit_bias, what the message must say)
BAD_BIAS = [
    ({"-1": 5}, ["'-1'", f"0..{VOCAB - 1}"]),
    ({"abc": 5}, ["'abc'", f"0..{VOCAB - 1}"]),
    ({str(VOCAB): 5}, [f"'{VOCAB}'", f"0..{VOCAB - 1}", "vocabulary"]),
    ({"3": 101}, ["'3'", "101", "-100 to 100"]),
    ({"3": -100.5}, ["'3'", "-100.5", "-100 to 100"]),
    ({"3": "x"}, ["'3'", "-100 to 100"]),
]


@pytest.mark.parametrize(("bias", "says"), BAD_BIAS)
async def test_a_bad_logit_bias_entry_names_its_key_and_the_range(
    bias: dict[str, Any], says: list[str]
) -> None:
    """Chat, completions and WebSocket alike."""
    async with serve_vocab() as api:
        errors = []
        for path, body in (
            ("/v1/chat/completions", {"messages": MESSAGES}),
            ("/v1/completions", {"prompt": "Hi"}),
        ):
            status, out = await api.post(path, {**body, "logit_bias": bias})
            assert status == 400
            errors.append(out["error"])
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", "prompt": "Hi", "logit_bias": bias})
            (frame,) = (await collect(ws, {"t"}))["t"]
            errors.append(frame["error"])
    for error in errors:
        assert error["param"] == "logit_bias" and error["code"] == "invalid_value"
        assert all(s in error["message"] for s in says), error["message"]
        assert "msgspec" not in error["message"] and "Expected" not in error["message"]


#: (pattern, texts it takes, texts it refuses): ``\d`` is ASCII, as in xgrammar and
#: outlines; an escaped backslash and other classes are left as they are
DIGITS = [
    (r"\d{4}", ["1234"], ["١٢٣٤", "🯸183", "12a4"]),
    (r"[\d_]+", ["1_2"], ["١"]),
    (r"\D\d", ["x1", "١1"], ["11", "x١"]),
    (r"[^\d]", ["١", "x"], ["5"]),
    (r"\\d", ["\\d"], ["1"]),
    (r"\p{Nd}", ["١", "1"], ["x"]),
    (r"\w/\d", ["é/1"], ["é/١"]),
]


@pytest.mark.parametrize(("pattern", "takes", "refuses"), DIGITS)
@pytest.mark.parametrize("field", ["guided_regex", "regex", "structured_outputs", "ws"])
async def test_a_regex_reads_backslash_d_as_ascii_digits(
    pattern: str, takes: list[str], refuses: list[str], field: str
) -> None:
    """``guided_regex``, SGLang's ``regex``, ``structured_outputs.regex`` and a WebSocket
    frame's: the grammar the engine gets reads ``\\d`` as ``[0-9]``."""
    async with serve_vocab() as api:
        if field == "ws":
            async with api.client.ws_connect("/ws") as ws:
                await ws.send_json({"id": "t", "prompt": "Hi", "guided_regex": pattern})
                frames = (await collect(ws, {"t"}))["t"]
            assert frames[-1]["type"] == "final"
        else:
            value = {"regex": pattern} if field == "structured_outputs" else pattern
            status, _ = await api.post("/v1/completions", {"prompt": "Hi", field: value})
            assert status == 200
        structured = api.engine.requests[0].sampling.structured
    assert structured is not None
    assert all(follows(structured.grammar, t) for t in takes)
    assert not any(follows(structured.grammar, t) for t in refuses)


@pytest.mark.parametrize("pattern", ["(\\d", "\\d^a"])
async def test_a_bad_regex_with_backslash_d_is_refused_in_its_own_terms(pattern: str) -> None:
    async with serve_vocab() as api:
        status, body = await api.post("/v1/completions", {"prompt": "Hi", "guided_regex": pattern})
    assert status == 400 and body["error"]["code"] == "invalid_grammar"
    assert "[0-9]" not in body["error"]["message"]
