"""``/tokenize``, ``/detokenize`` and ``suffix`` on a real ``houchu serve``: the counts
are the engine's, the text round-trips, and ``suffix`` on the default model is a 400."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.client import post_json

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "Name three rivers."}]


def test_tokenize_counts_what_the_engine_counts(server) -> None:
    async def go() -> None:
        status, tok = await post_json(f"{server.url}/tokenize", {"messages": CHAT})
        assert status == 200, tok
        body = {"messages": CHAT, "max_tokens": 1}
        status, chat = await post_json(f"{server.url}/v1/chat/completions", body)
        assert status == 200, chat
        assert tok["count"] == chat["usage"]["prompt_tokens"] == len(tok["tokens"])
        status, info = await post_json(f"{server.url}/tokenize", {"prompt": "Hello world"})
        assert status == 200 and info["max_model_len"] > 0
        status, cmpl = await post_json(
            f"{server.url}/v1/completions", {"prompt": "Hello world", "max_tokens": 1}
        )
        assert info["count"] == cmpl["usage"]["prompt_tokens"]
        status, back = await post_json(f"{server.url}/detokenize", {"tokens": info["tokens"]})
        assert status == 200 and back == {"prompt": "Hello world"}
        status, err = await post_json(f"{server.url}/detokenize", {"tokens": [10**8]})
        assert status == 400 and err["error"]["param"] == "tokens"

    asyncio.run(go())


def test_suffix_on_a_model_without_fim_is_a_400(server) -> None:
    async def go() -> None:
        body = {"prompt": "def f(x):", "suffix": "    return y", "max_tokens": 4}
        status, err = await post_json(f"{server.url}/v1/completions", body)
        assert status == 400 and err["error"]["param"] == "suffix"
        assert "fill-in-the-middle" in err["error"]["message"]

    asyncio.run(go())
