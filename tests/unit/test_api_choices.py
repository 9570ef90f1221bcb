"""n > 1, best_of and echo at the gateway (fake engine): one engine request per choice
in one prefill group with its own seed, every choice's index in the stream, usage over
every choice, the best of best_of, the echoed prompt and its logprobs."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest

from tests.support.fake_api import (
    ANSWER,
    PIECES,
    PROMPT_TOKENS,
    Api,
    Echoing,
    FakeEngine,
    read_sse,
    serve,
)

CMPL = {"prompt": "Hello", "max_tokens": 5}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 5}


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serve() as a:
        yield a


@pytest.mark.parametrize("path", ["/v1/completions", "/v1/chat/completions"])
async def test_n_choices_are_requests_of_one_group_with_their_own_seeds(api: Api, path):
    body = {**(CMPL if "chat" not in path else CHAT), "n": 3, "seed": 2**64 - 2}
    status, out = await api.post(path, body)
    assert status == 200, out
    reqs = api.engine.requests
    assert [r.rid for r in reqs] == [f"{out['id']}-{i}" for i in range(3)]
    assert {r.prefill_group for r in reqs} == {out["id"]}
    assert [r.sampling.seed for r in reqs] == [2**64 - 2, 2**64 - 1, 0]  # wrapped to 64 bits
    assert [c["index"] for c in out["choices"]] == [0, 1, 2]
    assert out["usage"]["completion_tokens"] == 3 * len(PIECES)
    assert out["usage"]["prompt_tokens"] == PROMPT_TOKENS  # the prompt counts once


async def test_n_streams_every_choice_with_its_index(api: Api):
    body = {**CHAT, "n": 2, "stream": True, "stream_options": {"include_usage": True}}
    async with api.client.post("/v1/chat/completions", json=body) as r:
        chunks = await read_sse(r)
    for i in range(2):
        mine = [c["choices"][0] for c in chunks if c["choices"] and c["choices"][0]["index"] == i]
        assert mine[0]["delta"] == {"role": "assistant", "content": ""}
        assert "".join(c["delta"].get("content", "") for c in mine) == ANSWER
        assert mine[-1]["finish_reason"] == "length"
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["completion_tokens"] == 10


async def test_best_of_returns_n_and_counts_all():
    class Ranked(FakeEngine):
        def _delta(self, req, i, last):  # choice 2 is the most likely
            d = super()._delta(req, i, last)
            if d.logprobs and req.rid.endswith("-2"):
                d.logprobs[0].logprob = -0.01
            return d

    async with serve(Ranked()) as api:
        status, out = await api.post("/v1/completions", {**CMPL, "best_of": 3, "seed": 1})
    assert status == 200, out
    assert len(api.engine.requests) == 3
    assert all(r.sampling.logprobs for r in api.engine.requests)  # ranked by logprobs
    (choice,) = out["choices"]
    assert choice["index"] == 0 and choice["logprobs"] is None  # not asked for
    assert out["usage"]["completion_tokens"] == 3 * len(PIECES)


async def test_echo_with_logprobs_puts_the_prompt_first():
    async with serve(Echoing()) as api:
        body = {**CMPL, "echo": True, "logprobs": 1, "n": 2}
        status, out = await api.post("/v1/completions", body)
        assert status == 200, out
        reqs = api.engine.requests
        assert reqs[0].sampling.prompt_logprobs == 1 and reqs[1].sampling.prompt_logprobs is None
        for choice in out["choices"]:
            assert choice["text"] == "Hello" + ANSWER
            lp = choice["logprobs"]
            assert lp["tokens"][:2] == ["Hel", "lo"] and len(lp["tokens"]) == 2 + len(PIECES)
            assert lp["token_logprobs"][:2] == [None, -1.5]
            assert lp["top_logprobs"][:2] == [None, {"p": -0.5, "lo": -1.5}]  # top 1 + the token
            assert lp["text_offset"][:3] == [0, 3, 5]
            assert "prompt_logprobs" not in choice
        async with api.client.post("/v1/completions", json={**body, "stream": True}) as r:
            chunks = await read_sse(r)
        first = [c["choices"][0] for c in chunks if c["choices"][0]["index"] == 1][0]
        assert first["text"] == "Hello" and first["logprobs"]["token_logprobs"] == [None, -1.5]


async def test_vllm_prompt_logprobs_field():
    async with serve(Echoing()) as api:
        status, out = await api.post("/v1/completions", {**CMPL, "prompt_logprobs": 1})
        assert status == 200, out
        want = [
            None,
            {
                "9": {"logprob": -0.5, "rank": 1, "decoded_token": "p"},
                "6": {"logprob": -1.5, "rank": 2, "decoded_token": "lo"},
            },
        ]
        assert out["choices"][0]["prompt_logprobs"] == want
        assert out["choices"][0]["text"] == ANSWER  # no echo
        status, out = await api.post("/v1/chat/completions", {**CHAT, "prompt_logprobs": 1})
        assert status == 200 and out["prompt_logprobs"] == want


@pytest.mark.parametrize("stream", [False, True])
async def test_echo_with_prompt_logprobs_0_has_no_alternatives(stream: bool):
    """``echo`` + ``logprobs: 2`` + vLLM's ``prompt_logprobs: 0``: the prompt's logprobs
    are computed as vLLM computes them, with the client's ``prompt_logprobs`` (0: each
    prompt token's own logprob, no alternative), not with ``logprobs``' 2: the
    ``prompt_logprobs`` entries hold the token alone, and so do the echoed prompt
    tokens' ``top_logprobs``; the completion's tokens keep their alternatives."""
    body = {**CMPL, "echo": True, "logprobs": 2, "prompt_logprobs": 0, "stream": stream}
    async with serve(Echoing()) as api:
        if stream:
            async with api.client.post("/v1/completions", json=body) as r:
                choice = (await read_sse(r))[0]["choices"][0]
        else:
            status, out = await api.post("/v1/completions", body)
            assert status == 200, out
            choice = out["choices"][0]
        (req,) = api.engine.requests
    assert req.sampling.prompt_logprobs == 0 and req.sampling.top_logprobs == 2
    assert choice["prompt_logprobs"] == [
        None,
        {"6": {"logprob": -1.5, "rank": 2, "decoded_token": "lo"}},
    ]
    lp = choice["logprobs"]
    assert lp["top_logprobs"][:2] == [None, {"lo": -1.5}]


async def test_echo_with_logprobs_computes_that_many_prompt_alternatives():
    """Without ``prompt_logprobs``, ``echo`` + ``logprobs: 1`` computes the prompt's
    logprobs with 1 alternative (vLLM: ``prompt_logprobs`` defaults to ``logprobs``
    with ``echo``), and the response has no ``prompt_logprobs`` (not asked for)."""
    body = {**CMPL, "echo": True, "logprobs": 1}
    async with serve(Echoing()) as api:
        status, out = await api.post("/v1/completions", body)
        assert status == 200, out
        (req,) = api.engine.requests
        status, none = await api.post("/v1/completions", {**CMPL, "echo": True})
        assert status == 200 and api.engine.requests[1].sampling.prompt_logprobs is None
    assert req.sampling.prompt_logprobs == 1
    choice = out["choices"][0]
    assert "prompt_logprobs" not in choice
    assert choice["logprobs"]["top_logprobs"][:2] == [None, {"p": -0.5, "lo": -1.5}]
