"""Structured-output constraints the grammar engine (llguidance) would follow badly or
refuses in its own terms get a 400 that says what is wrong, over the official
``openai`` client and the WebSocket API in front of the fake engine: a JSON schema no
value satisfies (``{"not": {}}``), a regex anchor in the middle of a pattern (``a^``),
a grammar with no finite string (``root ::= "a" root``), a schema that is ``false``,
an integer beyond the 64 bits llguidance reads, a ``const``/``enum`` number it would
write as another and a bound it cannot compile or would round; the server keeps serving.
And which rules of a Lark grammar can never finish (``houchu.api.structured.lark_rules``)."""

from __future__ import annotations

from typing import Any

import pytest
from llguidance.gbnf_to_lark import any_to_lark

from houchu.api.structured.lark_rules import endless_rules
from houchu.api.structured.request import json_schema_grammar, no_value_nots
from tests.support.fake_api import collect
from tests.support.vocab_api import MESSAGES, chat_error, serve_vocab

#: an integer beyond the 64 bits llguidance reads (its own error: "not JSON serializable")
BIG = 123456789012345678901234567890


def _schema(schema: dict[str, Any] | bool) -> dict[str, Any]:
    return {
        "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": schema}}
    }


#: (request fields, the parameter named, words the message must hold)
REFUSED = [
    (_schema({"not": {}}), "response_format", ["matches no JSON value", '{"not": {}}']),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"not": True}, "strict": True},
            }
        },
        "response_format",
        ["matches no JSON value"],
    ),
    (
        {"guided_json": {"type": "object", "properties": {"a": {"not": {}}}, "required": ["a"]}},
        "guided_json",
        ["matches no JSON value", "'a'"],
    ),
    (_schema(False), "response_format", ["matches no JSON value"]),  # JSON Schema's false
    ({"guided_json": False}, "guided_json", ["matches no JSON value"]),
    ({"structured_outputs": {"json": "false"}}, "structured_outputs.json", ["no JSON value"]),
    (  # an integer llguidance cannot read: named, with the range, not its internal words
        {"guided_json": {"type": "integer", "maximum": BIG}},
        "guided_json",
        [f"the integer {BIG} at #/maximum does not fit in 64 bits", "-9223372036854775808"],
    ),
    (
        _schema({"type": "object", "properties": {"n": {"type": "integer", "minimum": -BIG}}}),
        "response_format",
        [f"the integer {-BIG} at #/properties/n/minimum does not fit in 64 bits"],
    ),
    (
        {"structured_outputs": {"json": f'{{"type": "array", "maxItems": {BIG}}}'}},
        "structured_outputs.json",
        ["at #/maxItems does not fit in 64 bits"],
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {"type": "object", "properties": {"n": {"enum": [BIG]}}},
                    },
                }
            ]
        },
        "tools[0].function.parameters",
        ["at #/properties/n/enum/0 does not fit in 64 bits"],
    ),
    (  # a const/enum number llguidance would write as another (it reads doubles)
        {"guided_json": {"const": 9007199254740993}},
        "guided_json",
        ["the integer 9007199254740993 at #/const is beyond 2^53", "64-bit doubles"],
    ),
    (
        {"structured_outputs": {"json": {"enum": ["a", -9007199254740993]}}},
        "structured_outputs.json",
        ["-9007199254740993 at #/enum/1 is beyond 2^53"],
    ),
    (
        _schema({"properties": {"p": {"anyOf": [{"const": 123456789.12345679}]}}}),
        "response_format",
        [
            "123456789.12345679 at #/properties/p/anyOf/0/const would be written as 123456789.1234568"
        ],
    ),
    (
        {"guided_json": {"$defs": {"d": {"items": {"const": {"x": [1e-25]}}}}}},
        "guided_json",
        ["at #/$defs/d/items/const/x/0 would be written as 0.0000000000000000000000000999"],
    ),
    (
        {
            "tools": [
                {
                    "type": "function",
                    "function": {
                        "name": "f",
                        "parameters": {
                            "type": "object",
                            "properties": {"n": {"enum": [2**60 + 1]}},
                        },
                    },
                }
            ]
        },
        "tools[0].function.parameters",
        [f"{2**60 + 1} at #/properties/n/enum/0 is beyond 2^53"],
    ),
    (  # bounds beyond the engine's range: its own words were "Failed to generate regex"
        {"guided_json": {"type": "integer", "minimum": -(2**63)}},
        "guided_json",
        ["'minimum' -9223372036854775808 at #/minimum", "strictly between -2^63 and 10^18"],
    ),
    (
        {"guided_json": {"type": "integer", "minimum": 2**63}},
        "guided_json",
        ["'minimum' 9223372036854775808 at #/minimum", "strictly between -2^63 and 10^18"],
    ),
    (
        {"guided_json": {"items": {"type": "number", "maximum": 2**64 - 1}}},
        "guided_json",
        ["'maximum' 18446744073709551615 at #/items/maximum", "between -10^18 and 2^63"],
    ),
    (
        {"guided_json": {"type": ["integer", "null"], "exclusiveMaximum": -1e18}},
        "guided_json",
        ["'exclusiveMaximum' -1e+18 at #/exclusiveMaximum", "between -10^18 and 2^63"],
    ),
    (  # a bound the engine would round: 500000000000000000 would pass
        {"guided_json": {"type": "integer", "exclusiveMinimum": 500000000000000001}},
        "guided_json",
        ["would be read as 500000000000000000", "64-bit doubles"],
    ),
    ({"guided_regex": "a^"}, "guided_regex", ["'^' in the middle of /a^/", "could never match"]),
    ({"regex": "a$b"}, "regex", ["'$' in the middle of /a$b/", "could never match"]),
    ({"guided_json": {"type": "string", "pattern": "x^y"}}, "guided_json", ["'^' in the middle"]),
    ({"guided_regex": r"\bcat"}, "guided_regex", ["word boundaries"]),
    ({"ebnf": 'root ::= "a" root'}, "ebnf", ["no finite string", "'root'", "never finish"]),
    ({"guided_grammar": 'start: "a" start'}, "guided_grammar", ["no finite string", "'start'"]),
    (
        {"structured_outputs": {"grammar": 'root ::= "b" | "a" loop\nloop ::= "c" loop'}},
        "structured_outputs.grammar",
        ["never finish", "'loop'"],
    ),
]


@pytest.mark.parametrize(("extra", "param", "words"), REFUSED)
async def test_the_400_says_what_is_wrong(
    extra: dict[str, Any], param: str, words: list[str]
) -> None:
    async with serve_vocab() as api:
        body = await chat_error(api, messages=MESSAGES, max_tokens=4, extra_body=extra)
        err = body if "message" in body else body["error"]
        assert err["param"] == param and err["code"] == "invalid_grammar", err
        for w in words:
            assert w in err["message"], err["message"]
        internals = ("lookarounds", "Start in regex", "too complex", "Unimplemented", "\n")
        internals += ("Failed to generate",)
        for internal in (*internals, "serializable"):
            assert internal not in err["message"], err["message"]
        async with api.client.ws_connect("/ws") as ws:  # the same 400 over the WebSocket API
            await ws.send_json({"id": "g", "messages": MESSAGES, "max_tokens": 4, **extra})
            (frame,) = (await collect(ws, {"g"}))["g"]
        assert frame["type"] == "error" and frame["status"] == 400
        assert frame["error"]["message"] == err["message"]
        assert api.engine.requests == []  # refused before any work
        status, out = await api.post(
            "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2}
        )
        assert status == 200, out  # still serving


@pytest.mark.parametrize(
    "extra",
    [
        _schema({"type": "object", "properties": {"a": {"not": {}}, "b": {"type": "integer"}}}),
        _schema({"type": "object", "properties": {"not": {}}, "required": ["not"]}),  # a name
        {"guided_regex": "^a(b|c)$"},
        {"ebnf": 'root ::= "a" root | "a"'},
        {"guided_grammar": 'start: x+\nx: "a" | "(" x ")"'},
    ],
)
async def test_what_can_finish_is_served(extra: dict[str, Any]) -> None:
    """An optional property that allows no value, a property named ``not``, anchors at
    the pattern's edges and recursions that can end are served."""
    async with serve_vocab() as api:
        status, out = await api.post(
            "/v1/chat/completions", {"messages": MESSAGES, "max_tokens": 2, **extra}
        )
    assert status == 200, out


def test_not_of_everything_matches_no_value() -> None:
    """``{"not": S}`` with ``S`` every value matches becomes ``allOf: [false]`` where it
    is a schema; a property named ``not`` and other negations are left alone."""
    schema = {
        "type": "object",
        "properties": {
            "not": {},
            "a": {"not": {"description": "x"}},
            "b": {"not": {"type": "string"}},
        },
        "anyOf": [{"not": True}, {"allOf": [{"type": "object"}], "not": {}}],
    }
    got = no_value_nots(schema)
    assert got["properties"]["not"] == {} and got["properties"]["b"] == {"not": {"type": "string"}}
    assert got["properties"]["a"] == {"allOf": [False]}
    assert got["anyOf"] == [{"allOf": [False]}, {"allOf": [{"type": "object"}, False]}]
    assert json_schema_grammar(schema)  # llguidance builds it


@pytest.mark.parametrize(
    ("grammar", "endless"),
    [
        ('root ::= "a" root', ["start"]),
        ('root ::= "a" root | "b"', []),
        ('root ::= "a" x | "b"\nx ::= "c" x', ["x"]),
        ('root ::= ("y" root){2,3}', ["start"]),
        ('root ::= ("y" root){0,3}', []),
        ('root ::= item+ ("," item)* [a-z]?\nitem ::= "x" | ("y" item){2,3} | [^a]', []),
        ('start: a b\na: "x" a\nb: "y"', ["start", "a"]),
        ('start: [a] "z"\na: "x" a', ["a"]),
        ('start: a~1\na: "x" a', ["start", "a"]),
        ('start: a~2..3\na: "x" | a "y"', []),
        ('start: x\nx: "a" x\n  | %json {"type": "object", "x": "}"}', []),
        ('start: x\n// a comment\nx: "a"i | "b".."c" | <|eot|> # another', []),
        ('start[capture]: "x" start', ["start"]),
        ('?start: "q" -> alias', []),
        ("start: A+\nA: /[a-z]/", []),
        ('unused: "x" unused\nstart: "y"', []),  # not reachable: never entered
    ],
)
def test_endless_rules(grammar: str, endless: list[str]) -> None:
    lark = any_to_lark(grammar) if "::=" in grammar else grammar  # as houchu reads them
    assert endless_rules(lark) == endless


@pytest.mark.parametrize("grammar", ['%if x\nstart: "x"', 'start: "x"\n%declare A', "a: b"])
def test_a_grammar_the_reader_does_not_follow_is_not_judged(grammar: str) -> None:
    assert endless_rules(grammar) is None
