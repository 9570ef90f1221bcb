"""Structured output and tool calls through the official openai client and the
WebSocket API, on the real model, with speculation off and on."""

from __future__ import annotations

import asyncio
import json
import re
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from openai import OpenAI

from tests.support.client import ws_generate
from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 20},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "city": {"enum": ["Paris", "Rome", "Oslo"]},
        "student": {"type": "boolean"},
    },
    "required": ["name", "age", "city", "student"],
    "additionalProperties": False,
}
PERSON = [{"role": "user", "content": "Describe a person as JSON."}]
JSON_SCHEMA = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA}}
ITEM = {
    "type": "object",
    "properties": {
        "word": {"type": "string", "maxLength": 30},
        "n": {"type": "integer", "minimum": 0, "maximum": 1000},
    },
    "required": ["word", "n"],
    "additionalProperties": False,
}
ITEMS = {
    "type": "object",
    "properties": {"items": {"type": "array", "items": ITEM, "maxItems": 8}},
    "required": ["items"],
    "additionalProperties": False,
}
ITEMS_JSON = {"type": "json_schema", "json_schema": {"name": "items", "schema": ITEMS}}
EXAMPLE = json.dumps({"items": [{"word": "banana bread recipe", "n": n} for n in (12, 13, 14)]})
COPY = [
    {"role": "user", "content": f"Copy this JSON exactly, twice if you like: {EXAMPLE} {EXAMPLE}"}
]
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "The weather in a city.",
        "parameters": {
            "type": "object",
            "properties": {
                "city": {"type": "string", "maxLength": 30},
                "unit": {"enum": ["celsius", "fahrenheit"]},
            },
            "required": ["city", "unit"],
            "additionalProperties": False,
        },
    },
}
NAMED = {"type": "function", "function": {"name": "get_weather"}}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.fixture(scope="module")
def ngram_server(real_model_path):
    """A server that speculates with n-gram proposals whatever the batch."""
    srv = start_server(
        real_model_path,
        "--kv-cache-mb",
        "128",
        "--speculative",
        "ngram",
        "--speculative-max-batch",
        "32",
    )
    yield srv
    stop_server(srv)


@pytest.fixture(params=["plain", "ngram"])
def any_server(request, server):
    return server if request.param == "plain" else request.getfixturevalue("ngram_server")


def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def chat(server, **kw):
    return client(server).chat.completions.create(model=_model(server), **kw)


def _stats(server) -> dict:
    with urllib.request.urlopen(f"{server.url}/stats", timeout=10) as r:
        return json.load(r)


def _model(server) -> str:
    return client(server).models.list().data[0].id


def _spec(server) -> tuple[int, int]:
    """The server's speculation counters: (verification steps, proposals accepted)."""
    st = _stats(server)  # without speculation, none of them
    return st.get("spec_verify_steps", 0), st.get("spec_accepted_tokens", 0)


def test_json_schema_20_seeds_validate(any_server) -> None:
    """20 samples at temperature 1.0 (10 seeds, ``n=2``: choice ``i`` samples with
    ``seed + i``), batched, all validate. The prompt holds the JSON to write, so on the
    n-gram server speculation runs (its counters move) and proposes the JSON's end and
    EOS as it ends the prompt's copy: proposals past the grammar's stop, which once left
    the matcher a token behind and failed valid requests with a 400."""

    def one(seed: int) -> list[str]:
        out = chat(
            any_server,
            messages=COPY,
            response_format=ITEMS_JSON,
            temperature=1.0,
            seed=seed,
            n=2,
            max_tokens=200,
        )
        assert [c.index for c in out.choices] == [0, 1]
        assert all(c.finish_reason == "stop" for c in out.choices)
        return [c.message.content for c in out.choices]

    forced, spec = _stats(any_server)["jump_forward_tokens"], _spec(any_server)
    with ThreadPoolExecutor(2) as pool:  # four sequences at a time
        texts = [t for ts in pool.map(one, range(0, 100, 10)) for t in ts]
    assert len(texts) == 20
    for t in texts:
        jsonschema.validate(json.loads(t), ITEMS)
    assert len(set(texts)) > 1
    # jump-forward (on by default) forced the keys: at least `"word": "` per reply
    assert _stats(any_server)["jump_forward_tokens"] - forced >= 3 * len(texts)
    steps, accepted = _spec(any_server)
    if _stats(any_server).get("speculative") == "ngram":
        assert steps - spec[0] >= 20 and accepted - spec[1] >= 40, (steps, accepted, spec)
    else:
        assert (steps, accepted) == spec == (0, 0)


def test_regex_choice_grammar_and_json_object(server) -> None:
    msg = [{"role": "user", "content": "Give me a phone number."}]
    # ASCII digits: \d also allows Unicode digits, several tokens each, which a small
    # model may pick and then run out of max_tokens before the pattern ends
    phone = r"[0-9]{3}-[0-9]{4}"
    out = chat(server, messages=msg, max_tokens=20, extra_body={"guided_regex": phone})
    assert re.fullmatch(phone, out.choices[0].message.content)
    choices = ["sunny", "rainy", "cloudy"]
    for seed in range(4):
        out = chat(
            server,
            messages=ASK_WEATHER,
            max_tokens=8,
            temperature=1.0,
            seed=seed,
            extra_body={"structured_outputs": {"choice": choices}},
        )
        assert out.choices[0].message.content in choices
    lark = 'start: "The answer is " NUM "."\nNUM: /[0-9]{1,3}/'
    out = chat(server, messages=msg, max_tokens=16, extra_body={"guided_grammar": lark})
    assert re.fullmatch(r"The answer is [0-9]{1,3}\.", out.choices[0].message.content)
    cmpl = client(server).completions.create(
        model=_model(server),
        prompt="The year was",
        max_tokens=8,
        extra_body={"ebnf": 'root ::= " " [0-9] [0-9] [0-9] [0-9]'},
    )
    assert re.fullmatch(r" [0-9]{4}", cmpl.choices[0].text)
    # json_object bounds no string's length, and this small model can fill max_tokens
    # inside one: a finished reply parses as an object, a cut one is an object's start
    out = chat(server, messages=PERSON, max_tokens=120, response_format={"type": "json_object"})
    text, reason = out.choices[0].message.content, out.choices[0].finish_reason
    if reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert reason == "length" and text.startswith("{")
        _assert_cut_json_prefix(text)


def test_ignore_eos_ends_where_the_grammar_ends(server) -> None:
    """``ignore_eos`` beside a grammar: the output ends with the grammar (finish "stop"),
    with no EOS tokens forced after it until ``max_tokens``."""
    out = chat(
        server,
        messages=[{"role": "user", "content": "Yes or no?"}],
        max_tokens=20,
        temperature=0,
        extra_body={"guided_choice": ["yes", "no"], "ignore_eos": True},
    )
    assert out.choices[0].message.content in ("yes", "no")
    assert out.choices[0].finish_reason == "stop"
    assert out.usage.completion_tokens <= 3  # the choice's tokens and the EOS


def _assert_cut_json_prefix(text: str) -> None:
    """A reply cut by max_tokens fails to parse only at its end: an unfinished value,
    or a string cut inside a ``\\uXXXX`` escape (fewer than four hex digits left)."""
    with pytest.raises(json.JSONDecodeError) as err:
        json.loads(text)
    if "escape" in err.value.msg:
        assert re.fullmatch(r"\\?u[0-9a-fA-F]{0,3}", text[err.value.pos :]), (err.value, text)
    else:
        assert re.match("Unterminated|Expecting", err.value.msg), (err.value, text)


def test_bad_input_is_400_and_the_server_keeps_serving(server) -> None:
    bad = [
        {"extra_body": {"guided_grammar": "start: undefined_rule"}},
        {"extra_body": {"regex": "[a-"}},
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": 7}},
            }
        },
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
    ]
    for kw in bad:
        with pytest.raises(openai.BadRequestError) as err:
            chat(server, messages=PERSON, max_tokens=8, **kw)
        assert err.value.status_code == 400 and err.value.body["message"]
    # compiled by llguidance, but a schema that matches nothing, an anchor it does not
    # take and a grammar with no finite string: each a 400 saying so, in words
    nothing = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"not": {}}}}
    for kw, words in (
        ({"response_format": nothing}, "matches no JSON value"),
        ({"extra_body": {"guided_regex": "a^"}}, "'^' in the middle of /a^/"),
        ({"extra_body": {"ebnf": 'root ::= "a" root'}}, "the grammar has no finite string"),
    ):
        with pytest.raises(openai.BadRequestError) as err:
            chat(server, messages=PERSON, max_tokens=8, **kw)
        assert err.value.body["code"] == "invalid_grammar"
        assert words in err.value.body["message"], err.value.body
    out = chat(server, messages=PERSON, max_tokens=4, temperature=0)
    assert out.choices[0].finish_reason == "length"


def test_named_tool_choice_validates_against_the_schema(any_server) -> None:
    """The arguments validate; the question spells them out, so on the n-gram server
    the proposer copies them from the prompt and speculation runs."""
    args = '{"city": "Paris, Ile-de-France, France", "unit": "celsius"}'
    ask = [{"role": "user", "content": f"What is the weather in Paris? Call it with {args}"}]
    spec = _spec(any_server)
    for seed in range(2):
        out = chat(
            any_server,
            messages=ask,
            tools=[WEATHER],
            tool_choice=NAMED,
            temperature=1.0,
            seed=seed,
            max_tokens=60,
        )
        (call,) = out.choices[0].message.tool_calls
        assert call.type == "function" and call.function.name == "get_weather"
        jsonschema.validate(json.loads(call.function.arguments), WEATHER["function"]["parameters"])
        assert out.choices[0].finish_reason == "tool_calls"
    if _stats(any_server).get("speculative") == "ngram":
        assert _spec(any_server)[0] > spec[0], "no proposal was verified"


def test_a_function_without_parameters_is_called_with_no_arguments(server) -> None:
    """OpenAI reads a missing ``parameters`` as none: a forced call's arguments are
    ``{}`` on the real model, named or ``required``. ``required`` may write several
    calls: one cut by ``max_tokens`` comes back as the call it began (finish_reason
    ``length``), its arguments the part written."""
    ping = {"type": "function", "function": {"name": "ping"}}
    sampled = {"temperature": 1.0, "seed": 5, "max_tokens": 40}
    for choice in ({"type": "function", "function": {"name": "ping"}}, "required"):
        out = chat(server, messages=ASK_WEATHER, tools=[ping], tool_choice=choice, **sampled)
        calls = out.choices[0].message.tool_calls
        assert calls and all(c.function.name == "ping" for c in calls)
        whole = calls[:-1] if out.choices[0].finish_reason == "length" else calls
        assert all(c.function.arguments == "{}" for c in whole)
        assert "{}".startswith(calls[-1].function.arguments)


def test_required_tool_choice_calls_a_tool(server) -> None:
    out = chat(server, messages=ASK_WEATHER, tools=[WEATHER], tool_choice="required", max_tokens=80)
    calls = out.choices[0].message.tool_calls
    assert calls and all(c.function.name == "get_weather" for c in calls)
    for c in calls:
        jsonschema.validate(json.loads(c.function.arguments), WEATHER["function"]["parameters"])


def test_start_up_notes_a_template_that_ignores_tools(server) -> None:
    """The default model's chat template has no ``tools`` variable: ``houchu serve``
    says so in one line (``auto`` cannot call a tool on it)."""
    notes = [line for line in server.lines if "chat template ignores 'tools'" in line]
    assert len(notes) == 1


def test_auto_without_a_call_is_plain_content(server) -> None:
    msg = [{"role": "user", "content": "Say hello."}]
    out = chat(server, messages=msg, tools=[WEATHER], temperature=0, max_tokens=16)
    m = out.choices[0].message
    assert m.content and not m.tool_calls
    assert out.choices[0].finish_reason in ("stop", "length")


def test_streamed_tool_call_deltas_reassemble_to_the_same_call(server) -> None:
    """Streamed with ``n=2``: every chunk names its choice, and each choice's tool-call
    deltas reassemble to the non-streamed call (greedy: both choices make it)."""
    kw = {"messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": NAMED, "temperature": 0}
    whole = chat(server, max_tokens=60, **kw).choices[0].message.tool_calls[0]
    calls: dict[int, dict[int, dict]] = {0: {}, 1: {}}  # choice -> call index -> call
    reasons: dict[int, list] = {0: [], 1: []}
    for chunk in chat(server, max_tokens=60, stream=True, n=2, **kw):
        (choice,) = chunk.choices
        reasons[choice.index].append(choice.finish_reason)
        for d in choice.delta.tool_calls or []:
            c = calls[choice.index].setdefault(d.index, {"id": None, "name": "", "arguments": ""})
            c["id"] = c["id"] or d.id
            if d.function is not None:
                c["name"] += d.function.name or ""
                c["arguments"] += d.function.arguments or ""
    for i in (0, 1):
        assert list(calls[i]) == [0] and calls[i][0]["id"]
        assert (calls[i][0]["name"], calls[i][0]["arguments"]) == (
            whole.function.name,
            whole.function.arguments,
        )
        assert reasons[i][-1] == "tool_calls"


def test_tool_message_in_the_history_is_accepted(server) -> None:
    history = [
        *ASK_WEATHER,
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Paris"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "call_1", "content": "18 degrees, sunny"},
    ]
    out = chat(server, messages=history, tools=[WEATHER], temperature=0, max_tokens=16)
    assert out.choices[0].message.content


def test_websocket_structured_output_and_tool_calls(server) -> None:
    got = asyncio.run(
        ws_generate(
            server.ws_url,
            {"messages": PERSON, "response_format": JSON_SCHEMA, "seed": 3, "max_tokens": 120},
        )
    )
    assert got["error"] is None
    jsonschema.validate(json.loads(got["text"]), SCHEMA)
    got = asyncio.run(
        ws_generate(
            server.ws_url,
            {"messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": NAMED, "max_tokens": 60},
        )
    )
    final = got["final"]
    assert final["finish_reason"] == "tool_calls"
    (call,) = final["tool_calls"]
    assert got["text"] == ""  # the reply is the call's arguments, not content
    streamed = "".join(t["function"].get("arguments", "") for t in got["tool_calls"])
    assert call["function"]["arguments"] == streamed
    jsonschema.validate(json.loads(streamed), WEATHER["function"]["parameters"])
    got = asyncio.run(ws_generate(server.ws_url, {"messages": PERSON, "regex": "[a-"}))
    assert got["error"]["param"] == "regex"
