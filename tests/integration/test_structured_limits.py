"""Structured output at llguidance's limits, and tool calls cut by ``max_tokens``,
through the official openai client and the WebSocket API on the real model.

A grammar llguidance compiles but cannot follow (its lexer builds too many states once
it lexes "bb"s, which no compile-time check sees) ends that request with a 400 naming
the field, over HTTP (whole or streamed) and over the WebSocket, while a free request
beside it runs to its end; a choice list longer than llguidance's Earley row limit
(2000) constrains the output exactly.
"""

from __future__ import annotations

import asyncio
import json
import statistics
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor

import jsonschema
import openai
import pytest
from openai import OpenAI

from tests.support.client import post_json, ws_generate
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

#: Forced prefix, then the lexer bomb; "Hello, " streams before the matcher stops.
BOMB = "Hello, (a|aa)*(b|bb){1000}"
ASK = [{"role": "user", "content": "Say something."}]


@pytest.fixture(scope="module")
def server(real_model_path) -> Iterator[Server]:
    """A server without jump-forward. With it (llguidance's forced tokens consumed
    through ``compute_ff_tokens``), the lexer bomb's request was seen to run to
    ``max_tokens`` ("Hello, bbbb...", finish "length") instead of stopping the matcher,
    so it would not reach the 400 under test. The other tests here do not depend on it."""
    srv = start_server(real_model_path, "--kv-cache-mb", "64", "--jump-forward", "off")
    yield srv
    stop_server(srv)


def client(server) -> OpenAI:
    return OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0)


def _model(server) -> str:
    return client(server).models.list().data[0].id


def chat(server, **kw):
    return client(server).chat.completions.create(model=_model(server), **kw)


def _bb_bias(server) -> dict[str, int]:
    """``logit_bias`` +100 on "bb" and " bb": once the grammar allows them, they are the
    tokens sampled, and the second makes llguidance's lexer give up."""
    ids = []
    for text in ("bb", " bb"):
        status, body = asyncio.run(
            post_json(f"{server.url}/tokenize", {"prompt": text, "add_special_tokens": False})
        )
        assert status == 200 and body["count"] == 1, body
        ids += body["tokens"]
    return {str(t): 100 for t in ids}


def _bomb(server) -> dict:
    return {"guided_regex": BOMB, "logit_bias": _bb_bias(server)}


def test_a_grammar_the_engine_stops_following_fails_that_request_only(server) -> None:
    def free() -> openai.types.chat.ChatCompletion:
        msg = [{"role": "user", "content": "Name three rivers."}]
        return chat(
            server,
            messages=msg,
            temperature=0,
            max_tokens=48,
            extra_body={"ignore_eos": True},
        )

    with ThreadPoolExecutor(2) as pool:
        running = pool.submit(free)
        with pytest.raises(openai.BadRequestError) as err:
            chat(server, messages=ASK, temperature=0, max_tokens=40, extra_body=_bomb(server))
        out = running.result()
    body = err.value.body
    assert err.value.status_code == 400
    assert (body["code"], body["param"]) == ("grammar_too_complex", "guided_regex")
    assert "too many expressions" in body["message"]
    assert out.choices[0].finish_reason == "length" and out.usage.completion_tokens == 48
    again = chat(server, messages=ASK, temperature=0, max_tokens=4)
    assert again.choices[0].finish_reason == "length"


def test_a_stream_whose_grammar_stops_ends_with_an_error(server) -> None:
    stream = chat(
        server, messages=ASK, temperature=0, max_tokens=40, stream=True, extra_body=_bomb(server)
    )
    text, reasons = "", []
    with pytest.raises(openai.APIError) as err:
        for chunk in stream:
            for c in chunk.choices:
                text += c.delta.content or ""
                reasons.append(c.finish_reason)
    assert text.startswith("Hello, ")  # the forced prefix streamed before the stop
    assert reasons[-1] == "error"
    assert err.value.code == "grammar_too_complex" and "guided_regex" in err.value.message


def test_the_websocket_gets_a_typed_error(server) -> None:
    got = asyncio.run(
        ws_generate(
            server.ws_url,
            {"messages": ASK, "temperature": 0, "max_tokens": 40, **_bomb(server)},
        )
    )
    assert got["final"] is None
    err = got["error"]
    assert (err["code"], err["param"]) == ("grammar_too_complex", "guided_regex")


def test_a_choice_list_longer_than_the_row_limit_constrains_exactly(server) -> None:
    choices = [f"option number {i}" for i in range(5000)]
    for seed in range(2):
        out = chat(
            server,
            messages=ASK,
            temperature=1.0,
            seed=seed,
            max_tokens=16,
            extra_body={"guided_choice": choices},
        )
        assert out.choices[0].finish_reason == "stop"
        assert out.choices[0].message.content in choices


WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "unit": {"enum": ["celsius", "kelvin"]}},
            "required": ["city", "unit"],
        },
    },
}
ASK_WEATHER = [{"role": "user", "content": "What is the weather in Paris?"}]


@pytest.mark.parametrize("tool_choice", ["required", "named"])
def test_a_tool_call_cut_by_max_tokens_is_a_partial_call(server, tool_choice) -> None:
    """Cut by ``max_tokens``, a forced call comes back as OpenAI and vLLM give it: the
    call (its name, its arguments as far as they got), ``finish_reason: "length"``, no
    content; the same whole and streamed, and a longer budget finishes the same call."""
    choice = (
        "required"
        if tool_choice == "required"
        else {"type": "function", "function": {"name": "get_weather"}}
    )
    kw = {"messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": choice, "temperature": 0}
    cut = chat(server, max_tokens=12, **kw).choices[0]
    assert cut.finish_reason == "length" and not cut.message.content
    (call,) = cut.message.tool_calls
    assert call.function.name == "get_weather"
    with pytest.raises(json.JSONDecodeError):
        json.loads(call.function.arguments)
    name, args, reasons = "", "", []
    for chunk in chat(server, max_tokens=12, stream=True, **kw):
        for c in chunk.choices:
            assert not c.delta.content
            reasons.append(c.finish_reason)
            for d in c.delta.tool_calls or []:
                assert d.index == 0
                name += (d.function and d.function.name) or ""
                args += (d.function and d.function.arguments) or ""
    assert (name, args, reasons[-1]) == ("get_weather", call.function.arguments, "length")
    whole = chat(server, max_tokens=120, **kw).choices[0]
    done = whole.message.tool_calls[0]
    assert whole.finish_reason == "tool_calls"
    assert done.function.arguments.startswith(call.function.arguments)
    jsonschema.validate(json.loads(done.function.arguments), WEATHER["function"]["parameters"])
    ws = asyncio.run(ws_generate(server.ws_url, {**kw, "max_tokens": 12}))
    assert ws["final"]["finish_reason"] == "length" and not ws["final"]["content"]
    assert [c["function"]["arguments"] for c in ws["final"]["tool_calls"]] == [args]


def test_a_required_call_cut_right_after_its_name_is_a_call(server) -> None:
    """``required`` cut by ``max_tokens`` at every length up to where the arguments
    start: once the call's name is complete the reply is that call (its arguments as far
    as they got, "" right after the name), never the wrapper's text as content; whole,
    streamed and over the WebSocket alike; before that the reply has neither a call nor
    content (the array's markup is never content)."""
    kw = {"messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": "required"}
    kw |= {"temperature": 0}
    empty_args = 0
    for max_tokens in range(1, 13):
        whole = chat(server, max_tokens=max_tokens, **kw).choices[0]
        assert whole.finish_reason == "length"
        streamed: dict[str, str] = {"name": "", "args": "", "content": ""}
        for chunk in chat(server, max_tokens=max_tokens, stream=True, **kw):
            for c in chunk.choices:
                streamed["content"] += c.delta.content or ""
                for d in c.delta.tool_calls or []:
                    streamed["name"] += (d.function and d.function.name) or ""
                    streamed["args"] += (d.function and d.function.arguments) or ""
        ws = asyncio.run(ws_generate(server.ws_url, {**kw, "max_tokens": max_tokens}))
        if not whole.message.tool_calls:  # the name is not complete yet
            assert whole.message.content is None, whole.message
            assert not streamed["content"] and not streamed["name"]
            assert not ws["final"]["tool_calls"] and not ws["final"]["content"]
            continue
        (call,) = whole.message.tool_calls
        assert whole.message.content is None and call.function.name == "get_weather"
        assert (streamed["name"], streamed["args"]) == ("get_weather", call.function.arguments)
        assert not streamed["content"]
        assert ws["final"]["finish_reason"] == "length" and not ws["final"]["content"]
        assert [c["function"] for c in ws["final"]["tool_calls"]] == [
            {"name": "get_weather", "arguments": call.function.arguments}
        ]
        empty_args += call.function.arguments == ""
    assert empty_args, "no budget cut the call between its name and its arguments"


@pytest.mark.parametrize("tool_choice", ["required", "named"])
@pytest.mark.parametrize("stop", ['"', "}", "token ids"])
def test_stops_do_not_cut_a_forced_call(server, tool_choice, stop) -> None:
    """The grammar decides where a forced call ends: a ``stop`` string its text holds,
    or ``stop_token_ids`` naming the tokens of its arguments, do not cut it, whole,
    streamed and over the WebSocket alike; the arguments validate and
    ``finish_reason`` is "tool_calls"."""
    choice = (
        "required"
        if tool_choice == "required"
        else {"type": "function", "function": {"name": "get_weather"}}
    )
    kw = {"messages": ASK_WEATHER, "tools": [WEATHER], "tool_choice": choice, "temperature": 0}
    plain = chat(server, max_tokens=120, **kw).choices[0]
    text = plain.message.tool_calls[0].function.arguments
    assert stop in text or stop == "token ids"
    stops: dict = {"stop": [stop]}
    if stop == "token ids":
        tokenized = {"prompt": text, "add_special_tokens": False}
        _, body = asyncio.run(post_json(f"{server.url}/tokenize", tokenized))
        stops = {"stop_token_ids": sorted(set(body["tokens"]))}
    whole = chat(server, max_tokens=120, extra_body=stops, **kw).choices[0]
    assert (whole.finish_reason, whole.message.content) == ("tool_calls", None)
    calls = [(c.function.name, c.function.arguments) for c in whole.message.tool_calls]
    assert calls == [(c.function.name, c.function.arguments) for c in plain.message.tool_calls]
    jsonschema.validate(json.loads(calls[0][1]), WEATHER["function"]["parameters"])
    content, args, reasons = "", "", []
    for chunk in chat(server, max_tokens=120, stream=True, extra_body=stops, **kw):
        for c in chunk.choices:
            content += c.delta.content or ""
            reasons.append(c.finish_reason)
            args += "".join(
                (d.function and d.function.arguments) or "" for d in c.delta.tool_calls or []
            )
    assert (content, reasons[-1]) == ("", "tool_calls")
    assert args == "".join(a for _, a in calls)
    ws = asyncio.run(ws_generate(server.ws_url, {**kw, **stops, "max_tokens": 120}))
    assert ws["final"]["finish_reason"] == "tool_calls" and not ws["final"]["content"]
    assert [c["function"]["arguments"] for c in ws["final"]["tool_calls"]] == [a for _, a in calls]


#: (a constraint forcing a special token's text, the only output it allows)
SPECIAL_TEXT = [
    ({"guided_choice": ["<|im_end|>"]}, "<|im_end|>"),
    ({"guided_regex": r"<\|im_end\|>"}, "<|im_end|>"),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {
                    "name": "t",
                    "schema": {
                        "type": "object",
                        "properties": {"t": {"const": "<|endoftext|>"}},
                        "required": ["t"],
                        "additionalProperties": False,
                    },
                },
            }
        },
        '{"t": "<|endoftext|>"}',
    ),
]


@pytest.mark.parametrize(("fields", "text"), SPECIAL_TEXT)
def test_forced_special_token_text_is_written_as_text(server, fields, text) -> None:
    """Before, these ended with a 400 ``grammar_too_complex`` ("simplify it"): the
    forced text was tokenized into the special token."""
    kw = {"model": _model(server), "prompt": "x", "max_tokens": 20}
    out = client(server).completions.create(**kw, extra_body=fields)
    assert (out.choices[0].text, out.choices[0].finish_reason) == (text, "stop")
    ws = asyncio.run(ws_generate(server.ws_url, {"prompt": "x", "max_tokens": 20, **fields}))
    assert ws["error"] is None and ws["text"] == text


def test_a_tool_argument_with_special_token_text(server) -> None:
    tool = {
        "type": "function",
        "function": {
            "name": "f",
            "parameters": {
                "type": "object",
                "properties": {"s": {"enum": ["<|im_end|>"]}},
                "required": ["s"],
                "additionalProperties": False,
            },
        },
    }
    out = chat(
        server,
        messages=ASK,
        max_tokens=30,
        tools=[tool],
        tool_choice="required",
        parallel_tool_calls=False,
    )
    (call,) = out.choices[0].message.tool_calls
    assert json.loads(call.function.arguments) == {"s": "<|im_end|>"}


def _rule_chain(n: int) -> str:
    """A Lark chain of ``n`` rules: past some thousands the engine's recursion crashes
    its process (``houchu.api.structured.guard``)."""
    rules = "\n".join(f'r{i}: r{i + 1} | "x"' for i in range(n - 1))
    return f'start: r0\n{rules}\nr{n - 1}: "x"'


def test_health_answers_while_grammars_are_checked(server) -> None:
    """Grammars are checked one at a time in a child process, off the gateway's event
    loop: while six crashing grammars wait their turn (each crash restarts the child),
    ``/health`` and ``/v1/models`` keep answering (found by the issue 20 review: parsed on
    the loop, four such grammars held every endpoint for 7.8 s).

    The probe asks ``/health`` and ``/v1/models`` over and over until the last grammar is
    refused. Checked on the loop, a probe would wait for a whole check (a sixth of the
    batch); off it, a probe takes milliseconds however fast this CPU crashes the child."""
    url = f"{server.url}/v1/chat/completions"
    model = _model(server)

    async def timed(session, method: str, target: str, body=None) -> tuple[int, float]:
        """(HTTP status, seconds from asking to the whole answer)."""
        begun = asyncio.get_running_loop().time()
        async with session.request(method, target, json=body) as r:
            await r.read()
            return r.status, asyncio.get_running_loop().time() - begun

    async def run() -> tuple[list[tuple[int, float]], list[tuple[int, float]], float, int]:
        import aiohttp

        async with aiohttp.ClientSession() as s:
            begun = asyncio.get_running_loop().time()
            bad = [
                asyncio.create_task(
                    timed(
                        s,
                        "POST",
                        url,
                        {"model": model, "messages": ASK, "guided_grammar": _rule_chain(3100 + i)},
                    )
                )
                for i in range(6)
            ]
            probes: list[tuple[int, float]] = []
            while not all(task.done() for task in bad):
                probes.append(await timed(s, "GET", f"{server.url}/health"))
                probes.append(await timed(s, "GET", f"{server.url}/v1/models"))
            refused = [task.result() for task in bad]
            batch_s = asyncio.get_running_loop().time() - begun
            plain = {"model": model, "messages": ASK, "max_tokens": 2}
            served, _ = await timed(s, "POST", url, plain)  # and the server serves on
            return refused, probes, batch_s, served

    bad, probes, batch_s, served = asyncio.run(run())
    assert [status for status, _ in bad] == [400] * 6
    assert served == 200
    assert probes and all(status == 200 for status, _ in probes)
    # On the loop, each probe would wait out a check: a handful of probes, each a sixth
    # of the batch. The median, not the slowest, so one scheduling hiccup on a busy
    # machine does not decide.
    median = statistics.median(seconds for _, seconds in probes)
    assert len(probes) >= 8 and median < batch_s / 8, (median, batch_s, len(probes))
