"""Structured-output values JSON Schema and vLLM allow, through plain HTTP and the
WebSocket API in front of the fake engine: an empty string is a legal item of a choice
list (the output may then be empty), and a schema may be the boolean ``true`` (any JSON
value); the grammar the engine gets follows exactly that (checked with llguidance's
byte tokenizer). ``false`` and integers beyond 64 bits are refused in
``test_api_grammar_words``."""

from __future__ import annotations

import random
from typing import Any

import pytest

from houchu.api.structured.json_schema.integers import (
    MAX_INTEGER,
    MIN_INTEGER,
    out_of_range_integer,
)
from houchu.api.structured.json_schema.numbers import EXACT_INTEGER, engine_text, wrong_number
from tests.support.fake_api import collect
from tests.support.vocab_api import MESSAGES, follows, serve_vocab

pytestmark = pytest.mark.slow


async def _grammar(extra: dict[str, Any], via: str) -> str:
    """The grammar the engine gets for a request with ``extra`` sent ``via`` "chat",
    "completions" or "ws" (a WebSocket prompt frame)."""
    async with serve_vocab() as api:
        if via == "ws":
            async with api.client.ws_connect("/ws") as ws:
                await ws.send_json({"id": "t", "prompt": "Hi", "max_tokens": 2, **extra})
                frames = (await collect(ws, {"t"}))["t"]
            assert frames[-1]["type"] == "final", frames[-1]
        else:
            path, body = (
                ("/v1/chat/completions", {"messages": MESSAGES})
                if via == "chat"
                else ("/v1/completions", {"prompt": "Hi"})
            )
            status, out = await api.post(path, {**body, "max_tokens": 2, **extra})
            assert status == 200, out
        structured = api.engine.requests[0].sampling.structured
    assert structured is not None
    return structured.grammar


@pytest.mark.parametrize("via", ["chat", "completions", "ws"])
@pytest.mark.parametrize(
    "extra",
    [
        {"guided_choice": ["yes", ""]},
        {"structured_outputs": {"choice": ["", "yes"]}},
    ],
)
async def test_an_empty_choice_is_a_legal_alternative(extra: dict[str, Any], via: str) -> None:
    """As in vLLM (the choices are a grammar's alternatives): "" may be chosen, an
    empty output."""
    grammar = await _grammar(extra, via)
    assert follows(grammar, "") and follows(grammar, "yes")
    assert not any(follows(grammar, t) for t in ("y", "yesyes", " "))


async def test_a_list_of_only_the_empty_choice_allows_only_the_empty_output() -> None:
    grammar = await _grammar({"guided_choice": [""]}, "chat")
    assert follows(grammar, "") and not follows(grammar, "a")


@pytest.mark.parametrize(
    ("extra", "param"),
    [
        ({"guided_choice": []}, "guided_choice"),
        ({"structured_outputs": {"choice": []}}, "structured_outputs.choice"),
    ],
)
async def test_an_empty_choice_list_is_still_refused(extra: dict[str, Any], param: str) -> None:
    async with serve_vocab() as api:
        status, out = await api.post("/v1/chat/completions", {"messages": MESSAGES, **extra})
    assert status == 400 and out["error"]["param"] == param, out


#: JSON Schema's ``true`` in each field that takes a schema
TRUE_SCHEMAS = [
    {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": True}}},
    {
        "response_format": {
            "type": "json_schema",
            "json_schema": {"name": "x", "schema": True, "strict": True},
        }
    },
    {"guided_json": True},
    {"guided_json": "true"},  # the schema's text
    {"structured_outputs": {"json": True}},
]


@pytest.mark.parametrize("via", ["chat", "ws"])
@pytest.mark.parametrize("extra", TRUE_SCHEMAS)
async def test_a_true_schema_is_any_json_value(extra: dict[str, Any], via: str) -> None:
    """Not only objects, as ``json_object`` would constrain: any JSON value."""
    grammar = await _grammar(extra, via)
    for text in ('{"a": [1, null]}', "[1, 2]", '"x"', "3", "-0.5", "true", "null"):
        assert follows(grammar, text), text
    for text in ("x", "{", "[1,", "'a'"):
        assert not follows(grammar, text), text


def test_out_of_range_integers_are_found_where_they_are() -> None:
    """The bounds are llguidance's (i64's minimum, u64's maximum); booleans and floats
    are not integers; the pointer escapes ``/`` and ``~`` (RFC 6901)."""
    fits = {"maximum": MAX_INTEGER, "minimum": MIN_INTEGER, "x": [True, 1e300, "9" * 30]}
    assert out_of_range_integer(fits) is None
    assert out_of_range_integer({"maximum": MAX_INTEGER + 1}) == ("#/maximum", MAX_INTEGER + 1)
    schema = {"properties": {"a/b~": {"enum": [1, MIN_INTEGER - 1]}}}
    assert out_of_range_integer(schema) == ("#/properties/a~1b~0/enum/1", MIN_INTEGER - 1)


#: (a const/enum schema, the one text the engine may write): numbers it writes exactly
EXACT_NUMBERS = [
    ({"const": 2**53}, "9007199254740992"),
    ({"const": -(2**53)}, "-9007199254740992"),
    ({"const": 0.1}, "0.1"),
    ({"const": 1e-7}, "0.0000001"),
    ({"const": 3.14}, "3.14"),
    ({"const": 0.30000000000000004}, "0.30000000000000004"),
    ({"enum": [1e22]}, "10000000000000000000000"),
    ({"properties": {"a": {"const": [12345, 2.5]}}, "required": ["a"]}, '{"a": [12345, 2.5]}'),
]


@pytest.mark.parametrize(("schema", "text"), EXACT_NUMBERS)
async def test_const_and_enum_numbers_the_engine_writes_exactly_still_work(
    schema: dict[str, Any], text: str
) -> None:
    """Integers within 2^53 and ordinary decimals pass the check that refuses the ones
    llguidance would write as another number (``schema_numbers``), and come out as
    exactly that number."""
    grammar = await _grammar({"guided_json": schema}, "chat")
    assert follows(grammar, text)


def test_every_integer_within_2_53_is_written_exactly() -> None:
    """The rule ``schema_numbers`` relies on for integers, sampled: what the engine
    writes for ``{"const": n}`` is ``n``; just beyond 2^53 it is not."""
    rng = random.Random(0)
    samples = [rng.randint(-EXACT_INTEGER, EXACT_INTEGER) for _ in range(300)]
    for n in [*samples, EXACT_INTEGER - 1, 10**15 + 1, 0, -1]:
        assert engine_text(n) == str(n), n
    assert engine_text(EXACT_INTEGER + 1) == str(EXACT_INTEGER)
    assert engine_text(2**63) == "9223372036854776000"
    assert wrong_number({"const": EXACT_INTEGER + 1}) is not None
    assert wrong_number({"enum": [EXACT_INTEGER, "x", 0.1, None]}) is None
    assert wrong_number({"default": EXACT_INTEGER + 1, "examples": [1e-25]}) is None
    assert wrong_number({"type": "string", "minimum": 2**63}) is None  # no number here


def test_numbers_the_engine_would_crash_on_are_refused_without_asking_it() -> None:
    """llguidance 1.9 kills its process (SIGSEGV) building a grammar of a const integer
    that rounds to -2^63: ``wrong_number`` refuses every number beyond 2^53 in a const or
    enum without asking the engine, so a request cannot take the gateway down. Checked in
    a child process, whose death would show."""
    import subprocess
    import sys

    code = (
        "from houchu.api.structured.json_schema.numbers import wrong_number\n"
        "for schema in ({'const': -2**63}, {'const': -2**63 + 1}, {'enum': [-2**63]},\n"
        "               {'anyOf': [{'const': -2**63}]}, {'x-ext': {'const': -2**63}}):\n"
        "    at, why = wrong_number(schema)\n"
        "    assert 'beyond 2^53' in why, why\n"
        "assert 'not finite' in wrong_number({'const': float('nan')})[1]\n"
        "print('refused')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=False
    )
    assert done.returncode == 0, (done.returncode, done.stderr[-2000:])
    assert done.stdout.strip() == "refused"


def test_a_multiple_of_zero_or_less_is_refused_where_it_is() -> None:
    """JSON Schema's ``multipleOf`` is strictly positive; llguidance refuses 0 but took
    -1 as given (found by the issue 20 review)."""
    for value in (-1, -0.5, 0):
        at, why = wrong_number({"properties": {"n": {"type": "number", "multipleOf": value}}})
        assert at == "#/properties/n/multipleOf" and "must be greater than 0" in why
    assert wrong_number({"type": "integer", "multipleOf": 3}) is None
    assert wrong_number({"type": "string", "multipleOf": -1}) is None  # no number here


async def test_a_negative_multiple_of_is_a_400() -> None:
    async with serve_vocab() as api:
        schema = {"type": "number", "multipleOf": -1}
        status, out = await api.post(
            "/v1/chat/completions",
            {"messages": MESSAGES, "max_tokens": 2, "guided_json": schema},
        )
    assert status == 400 and "multipleOf" in out["error"]["message"], out
