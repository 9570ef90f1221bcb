"""Greedy output over the API equals Hugging Face transformers' on the same GGUF (fp32)."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.client import post_json, ws_generate
from tests.support.golden import KEYS, NEW_TOKENS, payload

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("key", KEYS)
def test_ws_tokens_equal_reference(server, reference, key):
    got = asyncio.run(ws_generate(server.ws_url, payload(key)))
    assert got["error"] is None, got["error"]
    assert got["token_ids"] == reference[key]
    assert got["final"]["usage"]["completion_tokens"] == NEW_TOKENS


@pytest.mark.parametrize("key", ["chat0", "chat3", "chat4", "raw1"])
def test_http_text_equals_reference(server, reference, key):
    tok = reference["_decode"]
    want = tok.decode(reference[key], skip_special_tokens=True)
    if key.startswith("chat"):
        status, body = asyncio.run(post_json(f"{server.url}/v1/chat/completions", payload(key)))
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == want
    else:
        status, body = asyncio.run(post_json(f"{server.url}/v1/completions", payload(key)))
        assert status == 200, body
        assert body["choices"][0]["text"] == want
