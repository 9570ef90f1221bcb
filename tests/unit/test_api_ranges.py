"""Every value the OpenAI API documents as valid is accepted with OpenAI's meaning, and
values just outside each documented range are refused with a 400 naming the field (the
parsers of ``houchu.api.requests.parse``, edge by edge)."""

from __future__ import annotations

import sys
from typing import Any

import pytest

from tests.support.fake_api import MAX_CONTEXT, MODEL

#: (field, values at the edges of OpenAI's documented range, values just outside), for
#: both completions and chat completions unless the field is one API's own.
OPENAI_RANGES: list[tuple[str, list[Any], list[Any]]] = [
    ("temperature", [0, 0.0, 2, 2.0, 1e-9], [-0.001, 2.001, "1"]),
    ("top_p", [0, 0.0, 1, 1.0, 1e-9], [-0.001, 1.001]),
    ("presence_penalty", [-2, -2.0, 0, 2, 2.0], [-2.001, 2.001]),
    ("frequency_penalty", [-2, -2.0, 0, 2, 2.0], [-2.001, 2.001]),
    ("n", [1, 128], [0, -1, 129, 1.5]),
    ("seed", [-(2**63), -1, 0, 2**63 - 1], [-(2**63) - 1, 2**64, 1.5, 1.0]),
    ("stop", ["x", [], ["a", "b", "c", "d"]], [["a", "b", "c", "d", "e"], 5, "", [""]]),
    # vLLM's extension: any finite value above 0
    ("repetition_penalty", [1e-9, 1, 2.5, 3, 1e300, sys.float_info.max], [0, -1, "2"]),
    (
        "logit_bias",
        [{"0": -100}, {"1": 100}, {"2": -100.0, "3": 100.0}, {}],
        [
            {"0": -100.001},
            {"0": 100.001},
            {"-1": 1},
            {"x": 1},
        ],
    ),
    ("user", ["", "user-1"], [5]),
    ("max_tokens", [1, MAX_CONTEXT], [0, -1, MAX_CONTEXT + 1, 2.0]),
]
COMPLETION_RANGES: list[tuple[str, list[Any], list[Any]]] = [
    ("logprobs", [0, 5], [-1, 6]),
    ("best_of", [1, 128], [0, 129]),
]
CHAT_RANGES: list[tuple[str, list[Any], list[Any]]] = [
    ("top_logprobs", [0, 20], [-1, 21]),
    ("max_completion_tokens", [1, MAX_CONTEXT], [0, MAX_CONTEXT + 1]),
]


def _cases(ranges, accepted: bool):
    return [(field, v) for field, ok, bad in ranges for v in (ok if accepted else bad)]


def _parse(api_name: str, field: str, value: Any):
    from houchu.api.requests.parse import parse_chat, parse_completion

    if api_name == "completions":
        body = {"prompt": "hi", field: value}
        return parse_completion(body, model_name=MODEL, max_context=MAX_CONTEXT, vocab_size=50)
    body = {"messages": [{"role": "user", "content": "hi"}], field: value}
    if field == "top_logprobs":
        body["logprobs"] = True
    return parse_chat(body, model_name=MODEL, max_context=MAX_CONTEXT, vocab_size=50)


@pytest.mark.parametrize("api_name", ["completions", "chat"])
@pytest.mark.parametrize("field,value", _cases(OPENAI_RANGES, True))
def test_openai_edge_values_are_accepted(api_name: str, field: str, value: Any) -> None:
    assert _parse(api_name, field, value).sampling is not None


@pytest.mark.parametrize("api_name", ["completions", "chat"])
@pytest.mark.parametrize("field,value", _cases(OPENAI_RANGES, False))
def test_values_just_outside_are_refused(api_name: str, field: str, value: Any) -> None:
    from houchu.api.errors import ApiError

    with pytest.raises(ApiError) as e:
        _parse(api_name, field, value)
    assert e.value.status == 400 and e.value.param is not None
    assert e.value.param.startswith(field), e.value.param


@pytest.mark.parametrize(
    "api_name,ranges", [("completions", COMPLETION_RANGES), ("chat", CHAT_RANGES)]
)
def test_each_apis_own_fields_at_their_edges(api_name: str, ranges) -> None:
    from houchu.api.errors import ApiError

    for field, value in _cases(ranges, True):
        _parse(api_name, field, value)
    for field, value in _cases(ranges, False):
        with pytest.raises(ApiError) as e:
            _parse(api_name, field, value)
        assert e.value.param is not None and e.value.param.startswith(field), (field, value)


def test_edge_values_keep_openais_meaning() -> None:
    s = _parse("chat", "top_p", 0).sampling  # only the most likely token
    assert (s.top_k, s.top_p) == (1, 1.0)
    assert _parse("chat", "top_p", 1).sampling.top_k == 0  # no filter
    assert _parse("chat", "temperature", 0).sampling.temperature == 0.0  # greedy
    assert _parse("chat", "logit_bias", {"1": 100}).sampling.logit_bias == {1: 100.0}
    assert _parse("chat", "seed", -(2**63)).sampling.seed == -(2**63)
    assert _parse("chat", "stop", "x").sampling.stop == ["x"]
    assert _parse("chat", "repetition_penalty", 3).sampling.repetition_penalty == 3.0


def test_a_repetition_penalty_at_or_below_zero_says_it_must_be_above_zero() -> None:
    from houchu.api.errors import ApiError

    with pytest.raises(ApiError) as e:
        _parse("chat", "repetition_penalty", 0)
    assert e.value.message == (
        "'repetition_penalty' must be a finite number greater than 0.0, got 0"
    )


@pytest.mark.parametrize(
    "extra,kind",
    [
        ({"response_format": {"type": "json_object"}}, "json_object"),
        ({"structured_outputs": {"regex": "[0-9]+"}}, "regex"),
        ({"guided_choice": ["yes", "no"]}, "choice"),
        ({}, None),
    ],
)
def test_the_dashboards_params_name_the_grammar_kind(extra: dict, kind: str | None) -> None:
    from houchu.api.observe import request_params
    from houchu.api.requests.parse import parse_chat

    body = {"messages": [{"role": "user", "content": "hi"}], **extra}
    req = parse_chat(body, model_name=MODEL, max_context=MAX_CONTEXT).to_generate("r")
    assert request_params(req).get("grammar") == kind


def test_logit_bias_banning_every_token_is_refused() -> None:
    """-100 on every token of the vocabulary leaves nothing to sample: a 400, not a
    reply as if nothing were banned; banning all but one is served."""
    from houchu.api.errors import ApiError

    every = {str(t): -100 for t in range(50)}
    with pytest.raises(ApiError) as e:
        _parse("completions", "logit_bias", every)
    assert e.value.status == 400 and e.value.param == "logit_bias"
    del every["7"]
    assert len(_parse("chat", "logit_bias", every).sampling.logit_bias) == 49


@pytest.mark.parametrize("prompt", [[50], [[1, 2, 50]], [999999]])
def test_token_id_prompts_outside_the_vocabulary_are_refused(prompt: list) -> None:
    """A token-id prompt names tokens of the vocabulary (ids below 50 here): outside it,
    a 400 naming ``prompt``, over HTTP completions and the WebSocket API alike."""
    from houchu.api.errors import ApiError
    from houchu.api.requests.parse import parse_completion, parse_ws_generate

    for parse in (parse_completion, parse_ws_generate):
        with pytest.raises(ApiError) as e:
            parse({"prompt": prompt}, model_name=MODEL, max_context=MAX_CONTEXT, vocab_size=50)
        assert (e.value.status, e.value.param, e.value.code) == (400, "prompt", "invalid_value")
        ok = parse({"prompt": [0, 49]}, model_name=MODEL, max_context=MAX_CONTEXT, vocab_size=50)
        assert ok.prompt_ids == [0, 49]
