"""Streaming equals non-streaming on all three paths; stop strings never leak."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.client import post_json, sse_stream, ws_generate

pytestmark = pytest.mark.slow

CHAT = [{"role": "user", "content": "用中文写两句关于春天的诗，再加一个表情符号。"}]
PROMPT = "Emoji story: 🐱 met 🐶 and"


def test_ws_deltas_concatenate_to_http_text(server):
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    ws = asyncio.run(ws_generate(server.ws_url, body))
    status, full = asyncio.run(post_json(f"{server.url}/v1/completions", body))
    assert status == 200
    assert ws["text"] == full["choices"][0]["text"]
    # Only the final flush may hold U+FFFD: the output was cut by max_tokens mid-character.
    assert all("\ufffd" not in d for d in ws["deltas"][:-1])
    assert len(ws["deltas"]) > 1


def test_completions_stream_equals_non_stream(server):
    body = {"prompt": PROMPT, "max_tokens": 40, "temperature": 0, "ignore_eos": True}
    chunks = asyncio.run(sse_stream(f"{server.url}/v1/completions", body))
    status, full = asyncio.run(post_json(f"{server.url}/v1/completions", body))
    assert status == 200
    text = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert text == full["choices"][0]["text"]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_chat_stream_equals_non_stream_multibyte(server):
    body = {"messages": CHAT, "max_tokens": 48, "temperature": 0}
    chunks = asyncio.run(sse_stream(f"{server.url}/v1/chat/completions", body))
    status, full = asyncio.run(post_json(f"{server.url}/v1/chat/completions", body))
    assert status == 200
    pieces = [c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"]]
    text = "".join(pieces)
    assert text == full["choices"][0]["message"]["content"]
    assert any(ord(ch) > 0x2E80 for ch in text), "expected CJK output"
    assert all("\ufffd" not in p for p in pieces)


def test_stop_string_spanning_tokens(server):
    body = {
        "prompt": "The history of the Roman Empire",
        "max_tokens": 48,
        "temperature": 0,
        "ignore_eos": True,
    }
    ref = asyncio.run(ws_generate(server.ws_url, body))
    # Build a stop string from the end of one delta and the start of a later one, so that
    # it spans a token boundary.
    deltas = [d for d in ref["deltas"] if len(d) >= 2]
    assert len(deltas) > 6
    i = len(deltas) // 2
    stop = deltas[i][-2:] + deltas[i + 1][:2]
    text = ref["text"]
    want = text[: text.index(stop)]
    for path in ("ws", "completions"):
        if path == "ws":
            got = asyncio.run(ws_generate(server.ws_url, {**body, "stop": [stop]}))
            out, final = got["text"], got["final"]["finish_reason"]
        else:
            chunks = asyncio.run(sse_stream(f"{server.url}/v1/completions", {**body, "stop": stop}))
            out = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
            final = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"]][-1]
        assert out == want, path
        assert stop not in out
        assert final == "stop"
    # vLLM's include_stop_str_in_output: the stop string ends the output
    kept = asyncio.run(
        ws_generate(server.ws_url, {**body, "stop": [stop], "include_stop_str_in_output": True})
    )
    assert kept["text"] == want + stop


def test_stop_token_ids_and_eos(server):
    body = {
        "messages": [{"role": "user", "content": "Say hi."}],
        "max_tokens": 64,
        "temperature": 0,
    }
    status, full = asyncio.run(post_json(f"{server.url}/v1/chat/completions", body))
    assert status == 200
    choice = full["choices"][0]
    assert choice["finish_reason"] == "stop"  # the model ends its turn with EOS
    assert "<|im_end|>" not in choice["message"]["content"]
    assert full["usage"]["completion_tokens"] < 64
