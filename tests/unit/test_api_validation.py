"""Bad input is a 400 with an OpenAI error body naming the parameter, and the server keeps
serving; good input reaches the engine as the right ``GenerateRequest``."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import pytest

from houchu.api.requests.parse import DEFAULT_CHAT_MAX_TOKENS
from houchu.transport.messages import ChatMessage, SamplingParams
from tests.support.fake_api import MAX_CONTEXT, MODEL, Api, assert_openai_error, collect, serve

CMPL = {"prompt": "Hello", "max_tokens": 4}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}

# Parameters shared by both endpoints: (extra fields, parameter named in the error).
WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}},
            "required": ["city"],
        },
    },
}
COMMON_BAD: list[tuple[dict[str, Any], str]] = [
    ({"temperature": "hot"}, "temperature"),
    ({"temperature": -1}, "temperature"),
    ({"temperature": 2.5}, "temperature"),
    ({"temperature": True}, "temperature"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -2}, "top_k"),
    ({"top_k": 1.5}, "top_k"),
    ({"top_k": True}, "top_k"),
    ({"min_p": 1.5}, "min_p"),
    ({"repetition_penalty": 0}, "repetition_penalty"),
    ({"repetition_penalty": -0.5}, "repetition_penalty"),
    ({"frequency_penalty": 3}, "frequency_penalty"),
    ({"presence_penalty": 9}, "presence_penalty"),
    ({"presence_penalty": -2.5}, "presence_penalty"),
    ({"seed": "x"}, "seed"),
    ({"seed": 1.5}, "seed"),
    ({"seed": True}, "seed"),
    ({"seed": 2**70}, "seed"),
    ({"stop": ""}, "stop"),
    ({"stop": [""]}, "stop"),
    ({"stop": ["a", "b", "c", "d", "e"]}, "stop"),
    ({"stop": ["x" * 1025]}, "stop"),
    ({"stop": 5}, "stop"),
    ({"stop": [1]}, "stop"),
    ({"stop_token_ids": [-1]}, "stop_token_ids"),
    ({"stop_token_ids": "x"}, "stop_token_ids"),
    ({"stop_token_ids": [1.5]}, "stop_token_ids"),
    ({"ignore_eos": "yes"}, "ignore_eos"),
    ({"n": 129}, "n"),
    ({"n": 0}, "n"),
    ({"n": "1"}, "n"),
    ({"max_tokens": -1}, "max_tokens"),
    ({"max_tokens": 0}, "max_tokens"),
    ({"max_tokens": 1.5}, "max_tokens"),
    ({"max_tokens": True}, "max_tokens"),
    ({"max_tokens": "5"}, "max_tokens"),
    ({"max_tokens": 100_000}, "max_tokens"),
    ({"model": "no-such-model"}, "model"),
    ({"model": 5}, "model"),
    ({"stream": "yes"}, "stream"),
    ({"stream_options": {"include_usage": True}}, "stream_options"),
    ({"stream": True, "stream_options": 5}, "stream_options"),
    ({"stream": True, "stream_options": {"include_usage": "yes"}}, "stream_options.include_usage"),
    ({"response_format": {"type": "xml"}}, "response_format.type"),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": []}}},
        "response_format.json_schema.schema",
    ),
    (
        {"response_format": {"type": "json_schema", "json_schema": {"schema": {"type": "a"}}}},
        "response_format.json_schema.name",
    ),
    (
        {
            "response_format": {
                "type": "json_schema",
                "json_schema": {"name": "x", "schema": {"type": "a"}},
            }
        },
        "response_format",
    ),
    ({"regex": "[a-"}, "regex"),
    ({"guided_regex": "(unclosed"}, "guided_regex"),
    ({"guided_choice": []}, "guided_choice"),
    ({"guided_grammar": "start: undefined_rule"}, "guided_grammar"),
    ({"ebnf": "root ::= missing"}, "ebnf"),
    ({"structured_outputs": {"grammar": "start: x"}}, "structured_outputs.grammar"),
    ({"structured_outputs": {"unknown": 1}}, "structured_outputs"),
    ({"guided_json": "not json"}, "guided_json"),
    ({"regex": "a", "guided_choice": ["b"]}, "regex"),
    ({"logit_bias": {"1": 101}}, "logit_bias"),
    ({"logit_bias": {"1": -100.5}}, "logit_bias"),
    ({"logit_bias": {"x": 5}}, "logit_bias"),
    ({"logit_bias": {"-1": 5}}, "logit_bias"),
    ({"logit_bias": [1, 5]}, "logit_bias"),
    ({"allowed_token_ids": []}, "allowed_token_ids"),
    ({"allowed_token_ids": [-1]}, "allowed_token_ids"),
    ({"bad_words": [""]}, "bad_words"),
    ({"bad_words": "x"}, "bad_words"),
    ({"min_tokens": -1}, "min_tokens"),
    ({"min_tokens": 5, "max_tokens": 4}, "min_tokens"),
    ({"prompt_logprobs": 21}, "prompt_logprobs"),
    ({"prompt_logprobs": -1}, "prompt_logprobs"),
    ({"guided_grammar": "root ::= ("}, "guided_grammar"),
    ({"guided_grammar": 'start: "a'}, "guided_grammar"),
    ({"structured_outputs": {"grammar": "root ::= ["}}, "structured_outputs.grammar"),
    ({"include_stop_str_in_output": "yes"}, "include_stop_str_in_output"),
    ({"use_beam_search": True}, "use_beam_search"),
]

CMPL_BAD: list[tuple[dict[str, Any], str]] = [
    ({"prompt": None}, "prompt"),
    ({"prompt": ""}, "prompt"),
    ({"prompt": []}, "prompt"),
    ({"prompt": [""]}, "prompt"),
    ({"prompt": 42}, "prompt"),
    ({"prompt": {"text": "hi"}}, "prompt"),
    ({"prompt": ["a", "b"]}, "prompt"),
    ({"prompt": [1, -2]}, "prompt"),
    ({"prompt": [1, True]}, "prompt"),
    ({"tools": [WEATHER]}, "tools"),
    ({"logprobs": 6}, "logprobs"),
    ({"logprobs": -1}, "logprobs"),
    ({"logprobs": True}, "logprobs"),
    ({"logprobs": "3"}, "logprobs"),
    ({"echo": "no"}, "echo"),
    ({"best_of": 0}, "best_of"),
    ({"best_of": 129}, "best_of"),
    ({"n": 3, "best_of": 2}, "best_of"),
    ({"n": 2, "best_of": 3, "stream": True}, "best_of"),
    ({"suffix": 5}, "suffix"),
    ({"suffix": "x", "echo": True}, "echo"),
]

CHAT_BAD: list[tuple[dict[str, Any], str]] = [
    ({"tools": [{"type": "function"}]}, "tools[0].function"),
    ({"tools": [{"type": "function", "function": {"name": "a b"}}]}, "tools[0].function.name"),
    ({"tools": [WEATHER, WEATHER]}, "tools[1].function.name"),
    (
        {"tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": 1}}}]},
        "tools[0].function.parameters",
    ),
    ({"tools": [WEATHER], "tool_choice": "sometimes"}, "tool_choice"),
    (
        {"tools": [WEATHER], "tool_choice": {"type": "function", "function": {"name": "nope"}}},
        "tool_choice",
    ),
    ({"tool_choice": "required"}, "tool_choice"),
    # tool_choice without tools: OpenAI's and vLLM's 400 ("none" alone is accepted)
    ({"tool_choice": "auto"}, "tool_choice"),
    ({"tool_choice": {"type": "function", "function": {"name": "f"}}}, "tool_choice"),
    ({"tools": []}, "tools"),  # OpenAI refuses an empty array
    ({"tools": [WEATHER], "tool_choice": "required", "regex": "a"}, "tool_choice"),
    ({"messages": [{"role": "assistant", "content": None}]}, "messages[0].content"),
    (
        {"messages": [{"role": "tool", "tool_call_id": 5, "content": "1"}]},
        "messages[0].tool_call_id",
    ),
    ({"messages": None}, "messages"),
    ({"messages": []}, "messages"),
    ({"messages": "hello"}, "messages"),
    ({"messages": ["hello"]}, "messages[0]"),
    ({"messages": [{"role": "wizard", "content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"content": "hi"}]}, "messages[0].role"),
    ({"messages": [{"role": "user", "content": 5}]}, "messages[0].content"),
    ({"messages": [{"role": "user"}]}, "messages[0].content"),
    (
        {"messages": [{"role": "user", "content": "a"}, {"role": "user", "content": [5]}]},
        "messages[1].content[0]",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
        "messages[0].content[0].type",
    ),
    (
        {"messages": [{"role": "user", "content": [{"type": "text", "text": 5}]}]},
        "messages[0].content[0].text",
    ),
    ({"max_completion_tokens": 0}, "max_completion_tokens"),
    ({"max_completion_tokens": "many"}, "max_completion_tokens"),
    ({"logprobs": "yes"}, "logprobs"),
    ({"logprobs": 3}, "logprobs"),
    ({"logprobs": True, "top_logprobs": 50}, "top_logprobs"),
    ({"logprobs": True, "top_logprobs": -1}, "top_logprobs"),
    ({"top_logprobs": 2}, "top_logprobs"),
    # the completions API's own fields are refused, not ignored
    ({"suffix": "x"}, "suffix"),
    ({"echo": True}, "echo"),
    ({"best_of": 2}, "best_of"),
]


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serve() as a:
        yield a


def _ids(cases: list[tuple[dict[str, Any], str]]) -> list[str]:
    return [f"{param}={list(extra.values())[-1]!r}"[:60] for extra, param in cases]


async def _bad_then_good(api: Api, path: str, good: dict[str, Any], extra: dict, param: str):
    status, body = await api.post(path, {**good, **extra})
    unknown_model = param == "model" and isinstance(extra["model"], str)
    assert status == (404 if unknown_model else 400), body  # 404: as OpenAI and vLLM
    err = assert_openai_error(body, param)
    assert err["type"] == "invalid_request_error"
    assert err["code"], err  # every 400 says what kind of error it is
    if unknown_model:
        assert err["code"] == "model_not_found"
    status, body = await api.post(path, good)
    assert status == 200, body
    assert api.engine.aborted == []


@pytest.mark.parametrize(("extra", "param"), COMMON_BAD + CMPL_BAD, ids=_ids(COMMON_BAD + CMPL_BAD))
async def test_bad_completion_is_400(api: Api, extra: dict, param: str) -> None:
    await _bad_then_good(api, "/v1/completions", CMPL, extra, param)
    assert len(api.engine.requests) == 1  # the bad one never reached the engine


@pytest.mark.parametrize(("extra", "param"), COMMON_BAD + CHAT_BAD, ids=_ids(COMMON_BAD + CHAT_BAD))
async def test_bad_chat_is_400(api: Api, extra: dict, param: str) -> None:
    await _bad_then_good(api, "/v1/chat/completions", CHAT, extra, param)
    assert len(api.engine.requests) == 1


async def test_tool_choice_none_without_tools_is_accepted_as_vllm_accepts_it(api: Api) -> None:
    """vLLM accepts ``tool_choice: "none"`` without ``tools`` (and refuses the others,
    as OpenAI does): the reply is plain content; over the WebSocket too."""
    status, body = await api.post("/v1/chat/completions", {**CHAT, "tool_choice": "none"})
    assert status == 200 and body["choices"][0]["message"]["content"], body
    async with api.client.ws_connect("/ws") as ws:
        await ws.send_json({"id": "n", **CHAT, "tool_choice": "none"})
        await ws.send_json({"id": "a", **CHAT, "tool_choice": "auto"})
        frames = await collect(ws, {"n", "a"})
    assert frames["n"][-1]["type"] == "final" and "tool_calls" not in frames["n"][-1]
    err = frames["a"][-1]
    assert (err["type"], err["error"]["param"]) == ("error", "tool_choice"), err
    assert "only allowed when 'tools' are specified" in err["error"]["message"]


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions", "/ws"])
async def test_a_model_not_served_is_a_404_as_openai_answers(api: Api, path: str) -> None:
    """OpenAI and vLLM answer 404 ``model_not_found`` (type ``invalid_request_error``);
    on the WebSocket the error frame's ``status`` is the same."""
    good = CHAT if "chat" in path else CMPL
    if path == "/ws":
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": 1, **good, "model": "gpt-4o"})
            frame = await ws.receive_json(timeout=5)
        assert (frame["type"], frame["status"]) == ("error", 404), frame
        body = {"error": frame["error"]}
    else:
        status, body = await api.post(path, {**good, "model": "gpt-4o"})
        assert status == 404, body
    err = assert_openai_error(body, "model")
    assert (err["type"], err["code"]) == ("invalid_request_error", "model_not_found")
    assert err["message"].startswith("The model `gpt-4o` does not exist")
    assert api.engine.requests == []


async def test_missing_prompt_and_messages(api: Api) -> None:
    status, body = await api.post("/v1/completions", {"max_tokens": 4})
    assert status == 400
    assert assert_openai_error(body, "prompt")["code"] == "missing_required_parameter"
    status, body = await api.post("/v1/chat/completions", {"max_tokens": 4})
    assert status == 400
    assert_openai_error(body, "messages")


@pytest.mark.parametrize(
    "raw", [b"{not json", b"[1, 2]", b"", b'"text"', b"null", b"NaN", b"{'a': 1}"]
)
@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_invalid_json_is_400(api: Api, path: str, raw: bytes) -> None:
    headers = {"Content-Type": "application/json"}
    async with api.client.post(path, data=raw, headers=headers) as r:
        assert r.status == 400
        err = assert_openai_error(await r.json())
        assert err["code"] in ("invalid_json", "invalid_type")
    status, body = await api.post("/v1/completions", CMPL)
    assert status == 200, body


async def test_completion_parameters_reach_the_engine(api: Api) -> None:
    body = {
        "model": MODEL,
        "prompt": ["Once upon"],
        "max_tokens": 9,
        "temperature": 0,
        "top_p": 0.9,
        "top_k": -1,
        "min_p": 0.05,
        "repetition_penalty": 1.1,
        "frequency_penalty": 0.5,
        "presence_penalty": -0.5,
        "seed": 1234,
        "stop": "\n",
        "stop_token_ids": [2, 3],
        "ignore_eos": True,
        "logprobs": 2,
        "user": "ignored",
        "n": 1,
        "echo": False,
    }
    status, _ = await api.post("/v1/completions", body)
    assert status == 200
    (req,) = api.engine.requests
    assert req.prompt == "Once upon" and req.prompt_ids is None and req.messages is None
    assert req.rid.startswith("cmpl-") and req.arrival_time > 0
    assert req.sampling == SamplingParams(
        temperature=0.0,
        top_p=0.9,
        top_k=0,
        min_p=0.05,
        repetition_penalty=1.1,
        frequency_penalty=0.5,
        presence_penalty=-0.5,
        seed=1234,
        max_tokens=9,
        stop=["\n"],
        stop_token_ids=[2, 3],
        ignore_eos=True,
        logprobs=True,
        top_logprobs=2,
    )


@pytest.mark.parametrize("prompt", [[1, 2, 3], [[1, 2, 3]]])
async def test_token_id_prompt(api: Api, prompt: list) -> None:
    status, _ = await api.post("/v1/completions", {"prompt": prompt})
    assert status == 200
    (req,) = api.engine.requests
    assert req.prompt is None and req.prompt_ids == [1, 2, 3]
    assert req.sampling.max_tokens == 16  # the OpenAI completions default


async def test_chat_messages_and_defaults(api: Api) -> None:
    messages = [
        {"role": "developer", "content": "Be brief."},
        {"role": "user", "content": [{"type": "text", "text": "a"}, {"type": "text", "text": "b"}]},
        {"role": "assistant", "content": "ok", "name": "bot"},
        {"role": "user", "content": ""},
    ]
    status, _ = await api.post("/v1/chat/completions", {"messages": messages, "top_k": 5})
    assert status == 200
    (req,) = api.engine.requests
    assert req.rid.startswith("chatcmpl-") and req.prompt is None
    assert req.messages == [
        ChatMessage("system", "Be brief."),
        ChatMessage("user", "a\nb"),
        ChatMessage("assistant", "ok", name="bot"),
        ChatMessage("user", ""),
    ]
    assert req.sampling.max_tokens == DEFAULT_CHAT_MAX_TOKENS and req.sampling.top_k == 5
    assert not req.sampling.logprobs


async def test_chat_max_completion_tokens_and_logprobs(api: Api) -> None:
    body = {**CHAT, "max_completion_tokens": 7, "logprobs": True, "top_logprobs": 3}
    status, _ = await api.post("/v1/chat/completions", body)
    assert status == 200
    s = api.engine.requests[0].sampling
    assert (s.max_tokens, s.logprobs, s.top_logprobs) == (7, True, 3)


async def test_null_means_default(api: Api) -> None:
    nulls = dict.fromkeys(["temperature", "top_p", "stop", "seed", "logprobs", "stream"])
    status, _ = await api.post("/v1/completions", {**CMPL, **nulls, "stream_options": None})
    assert status == 200
    assert api.engine.requests[0].sampling == SamplingParams(max_tokens=4)


async def test_default_max_tokens_is_capped_by_the_context() -> None:
    async with serve(max_context=100) as api:
        status, _ = await api.post("/v1/chat/completions", {"messages": CHAT["messages"]})
        assert status == 200
        assert api.engine.requests[0].sampling.max_tokens == 100
        status, body = await api.post("/v1/chat/completions", {**CHAT, "max_tokens": 101})
        assert status == 400
        assert "100" in assert_openai_error(body, "max_tokens")["message"]
    assert MAX_CONTEXT > DEFAULT_CHAT_MAX_TOKENS
