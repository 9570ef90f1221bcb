"""``echo`` on WebSocket prompt frames (fake engine): the prompt's text and its tokens'
logprobs (the first null), top_logprobs and text_offset, with the meaning
``POST /v1/completions`` gives them, in the WebSocket API's frame shapes."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import pytest

from houchu.transport.messages import GenerateRequest, TextDelta
from tests.support.fake_api import ANSWER, PIECES, Echoing, collect, serve, text_of

ECHO = {"prompt": "Hello", "max_tokens": 5, "echo": True}
#: The echo frame's logprobs of the fake engine's prompt ("Hel" has no logprob).
PROMPT_ENTRIES = [
    {
        "token": "Hel",
        "token_id": 5,
        "logprob": None,
        "bytes": list(b"Hel"),
        "top_logprobs": None,
        "text_offset": 0,
    },
    {
        "token": "lo",
        "token_id": 6,
        "logprob": -1.5,
        "bytes": list(b"lo"),
        "top_logprobs": [{"token": "p", "token_id": 9, "logprob": -0.5}],
        "text_offset": 3,
    },
]


class SlowFirstChoice(Echoing):
    """Choice 0 (which carries the prompt) answers after the others have begun."""

    async def generate(
        self, req: GenerateRequest, record: dict | None = None
    ) -> AsyncIterator[TextDelta]:
        if req.rid.endswith("-0"):
            await asyncio.sleep(0.05)
        async for delta in super().generate(req, record):
            yield delta


async def _frames(frame: dict[str, Any], engine: Echoing | None = None) -> tuple[list, Any]:
    async with serve(engine or Echoing()) as api:
        async with api.client.ws_connect("/ws") as ws:
            await ws.send_json({"id": "e", **frame})
            frames = (await collect(ws, {"e"}))["e"]
        return frames, api


async def test_echo_with_logprobs_sends_the_prompt_first() -> None:
    frames, api = await _frames({**ECHO, "logprobs": 1})
    echo, *deltas, final = frames
    assert echo == {
        "id": "e",
        "type": "delta",
        "text": "Hello",
        "token_ids": [],
        "echo": True,
        "logprobs": PROMPT_ENTRIES,
    }
    assert text_of(frames) == "Hello" + ANSWER  # the completions API's echoed text
    offsets = [e["text_offset"] for d in deltas for e in d["logprobs"]]
    assert offsets == [5 + len("".join(PIECES[:k])) for k in range(len(PIECES))]
    assert all("echo" not in d for d in deltas) and final["type"] == "final"
    (req,) = api.engine.requests
    assert req.sampling.echo and req.sampling.prompt_logprobs == 1  # as completions ask


async def test_echo_means_what_it_means_on_completions() -> None:
    """The same request over HTTP: the WebSocket entries' tokens, logprobs, top
    alternatives and text offsets are the legacy body's."""
    frames, _ = await _frames({**ECHO, "logprobs": 1})
    async with serve(Echoing()) as api:
        status, out = await api.post("/v1/completions", {**ECHO, "logprobs": 1})
    assert status == 200, out
    lp = out["choices"][0]["logprobs"]
    entries = [e for f in frames if f["type"] == "delta" for e in f["logprobs"]]
    assert [e["token"] for e in entries] == lp["tokens"]
    assert [e["logprob"] for e in entries] == lp["token_logprobs"]
    assert [e["text_offset"] for e in entries] == lp["text_offset"]
    for e, top in zip(entries, lp["top_logprobs"], strict=True):
        if top is None:
            assert e["top_logprobs"] is None
        else:  # the legacy body adds the token itself to its alternatives
            assert {t["token"]: t["logprob"] for t in e["top_logprobs"]}.items() <= top.items()
    assert out["choices"][0]["text"] == text_of(frames)


async def test_echo_without_logprobs_is_the_text_alone() -> None:
    frames, api = await _frames(ECHO)
    assert frames[0] == {"id": "e", "type": "delta", "text": "Hello", "token_ids": [], "echo": True}
    assert all("logprobs" not in f for f in frames)
    assert text_of(frames) == "Hello" + ANSWER
    (req,) = api.engine.requests
    assert req.sampling.echo and req.sampling.prompt_logprobs is None


async def test_every_choice_starts_with_the_prompt() -> None:
    """``n: 2``: choice 1's deltas wait for choice 0's first (it carries the prompt), and
    each choice's first frame is its echo, with its index; vLLM's ``prompt_logprobs``
    come once, on the first frame."""
    body = {**ECHO, "logprobs": 1, "n": 2, "prompt_logprobs": 1}
    frames, _ = await _frames(body, SlowFirstChoice())
    deltas = [f for f in frames if f["type"] == "delta"]
    assert deltas[0]["echo"] and deltas[0]["index"] == 0 and "prompt_logprobs" in deltas[0]
    assert sum("prompt_logprobs" in f for f in frames) == 1
    for i in (0, 1):
        mine = [f for f in deltas if f["index"] == i]
        assert mine[0]["echo"] and mine[0]["logprobs"] == PROMPT_ENTRIES
        assert "".join(f["text"] for f in mine) == "Hello" + ANSWER
        assert [e["text_offset"] for e in mine[1]["logprobs"]] == [5]


async def test_max_tokens_0_with_echo_is_served() -> None:
    frames, api = await _frames({**ECHO, "max_tokens": 0, "logprobs": 0})
    assert frames[0]["echo"]
    (req,) = api.engine.requests
    assert req.sampling.max_tokens == 0 and req.sampling.prompt_logprobs == 0


@pytest.mark.parametrize(
    ("frame", "param", "says"),
    [
        ({"prompt": "Hi", "max_tokens": 0}, "max_tokens", "0 is served with 'echo'"),
        (
            {"messages": [{"role": "user", "content": "Hi"}], "echo": True},
            "echo",
            "'echo' is served on prompt frames only",
        ),
        ({"prompt": "Hi", "echo": "yes"}, "echo", "must be a boolean"),
    ],
)
async def test_echo_refusals(frame: dict[str, Any], param: str, says: str) -> None:
    frames, api = await _frames(frame)
    (err,) = frames
    assert err["type"] == "error" and err["status"] == 400
    assert err["error"]["param"] == param and says in err["error"]["message"]
    assert api.engine.requests == []


async def test_prompt_logprobs_0_beside_echo_has_no_alternatives() -> None:
    """A prompt frame with ``echo``, ``logprobs: 2`` and ``prompt_logprobs: 0``: as on
    ``POST /v1/completions``, the prompt's logprobs are computed with the client's 0
    alternatives, so the echo frame's prompt entries and vLLM's ``prompt_logprobs``
    carry the token's own logprob alone."""
    frames, api = await _frames({**ECHO, "logprobs": 2, "prompt_logprobs": 0})
    echo = frames[0]
    assert echo["echo"] and [e["top_logprobs"] for e in echo["logprobs"]] == [None, []]
    assert echo["prompt_logprobs"] == [
        None,
        {"6": {"logprob": -1.5, "rank": 2, "decoded_token": "lo"}},
    ]
    (req,) = api.engine.requests
    assert req.sampling.prompt_logprobs == 0 and req.sampling.top_logprobs == 2
