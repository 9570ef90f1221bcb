"""Token constraints that together leave nothing to sample are a 400 before any work
(``houchu.text.token_conflicts``): at the gateway (``allowed_token_ids`` beside
``logit_bias``, HTTP and WebSocket alike) and, with the encoded ``bad_words`` and the
stop ids beside ``min_tokens``, in the tokenizer actor."""

from __future__ import annotations

from typing import Any

import pytest

from houchu.text.token_conflicts import no_token_left
from tests.support.fake_api import collect
from tests.support.vocab_api import MESSAGES, VOCAB, serve_vocab

#: (request fields, the parameter the 400 names, words its message holds)
GATEWAY_CONFLICTS = [
    (
        {"allowed_token_ids": [9], "logit_bias": {"9": -100}},
        "allowed_token_ids",
        ["'allowed_token_ids'", "'logit_bias' (-100)"],
    ),
    (
        {"allowed_token_ids": [9, 10], "logit_bias": {"9": -100, "10": -100, "11": 5}},
        "allowed_token_ids",
        ["'allowed_token_ids'", "no token is left"],
    ),
    (
        {"allowed_token_ids": [9], "logit_bias": {"10": 100}},
        "logit_bias",
        ["forces (100) only tokens outside 'allowed_token_ids'"],
    ),
    (
        {"logit_bias": {str(t): -100 for t in range(VOCAB)}},
        "logit_bias",
        ["all tokens of the vocabulary", "'logit_bias' (-100)"],
    ),
]


@pytest.mark.parametrize(("fields", "param", "says"), GATEWAY_CONFLICTS)
async def test_constraints_that_leave_no_token_are_refused(
    fields: dict[str, Any], param: str, says: list[str]
) -> None:
    """Completions, chat and WebSocket frames: a 400 naming the parameter, nothing sent
    to the engine (before, the sampler dropped every constraint of such a row)."""
    async with serve_vocab() as api:
        errors = []
        for path, body in (
            ("/v1/completions", {"prompt": "The capital of France is"}),
            ("/v1/chat/completions", {"messages": MESSAGES}),
        ):
            status, out = await api.post(path, {**body, **fields, "max_tokens": 4})
            assert status == 400
            errors.append(out["error"])
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "t", "prompt": "Hi", **fields})
            (frame,) = (await collect(ws, {"t"}))["t"]
            assert frame["type"] == "error" and frame["status"] == 400
            errors.append(frame["error"])
    for error in errors:
        assert error["param"] == param and error["code"] == "invalid_value"
        assert all(s in error["message"] for s in says), error["message"]
    assert api.engine.requests == []


async def test_constraints_that_leave_a_token_are_served() -> None:
    async with serve_vocab() as api:
        fields = {"allowed_token_ids": [9, 10], "logit_bias": {"9": -100, "10": 100}}
        status, _ = await api.post("/v1/completions", {"prompt": "Hi", **fields})
    assert status == 200 and api.engine.requests[0].sampling.allowed_token_ids == [9, 10]


@pytest.mark.parametrize(
    ("kw", "param", "says"),
    [
        ({"allowed": [7], "bad_words_ids": [[7]]}, "allowed_token_ids", "'bad_words'"),
        (
            {"allowed": [7, 8], "bad_words_ids": [[7]], "logit_bias": {8: -100.0}},
            "allowed_token_ids",
            "'logit_bias' (-100) and 'bad_words'",
        ),
        ({"logit_bias": {7: 100.0}, "bad_words_ids": [[7], [8, 9]]}, "logit_bias", "forces"),
        (
            {"allowed": [2, 7], "bad_words_ids": [[7]], "min_tokens": 1, "stop_ids": [2]},
            "min_tokens",
            "stop tokens",
        ),
        ({"allowed": [2], "min_tokens": 3, "stop_ids": [2, 0]}, "min_tokens", "'min_tokens' (3)"),
    ],
)
def test_bad_words_and_min_tokens_against_the_allowed_tokens(
    kw: dict[str, Any], param: str, says: str
) -> None:
    """What the tokenizer actor checks once ``bad_words`` are encoded."""
    failure = no_token_left(VOCAB, **kw)
    assert failure is not None and failure.status == 400
    assert failure.param == param and says in failure.message, failure.message


@pytest.mark.parametrize(
    "kw",
    [
        {"allowed": [7, 8], "bad_words_ids": [[7], [8, 9]]},  # "8 9" bans 9 only after 8
        {"allowed": [2, 7], "min_tokens": 0, "stop_ids": [2], "bad_words_ids": [[7]]},
        {"allowed": [2, 7], "min_tokens": 4, "stop_ids": [2]},
        {"logit_bias": {t: -100.0 for t in range(VOCAB - 1)}},
        {"allowed": [7], "bad_words_ids": [[7]], "logit_bias": {7: 50.0}} | {"allowed": [8]},
    ],
)
def test_constraints_that_leave_a_token_pass(kw: dict[str, Any]) -> None:
    assert no_token_left(VOCAB, **kw) is None
    assert no_token_left(0, allowed=[1], bad_words_ids=[[1]]) is None  # vocabulary unknown
