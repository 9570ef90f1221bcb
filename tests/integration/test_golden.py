"""Greedy output over the API equals Hugging Face transformers' on the same GGUF (fp32)."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
import torch

from tests.integration.client import post_json, ws_generate

pytestmark = pytest.mark.slow

NEW_TOKENS = 32
CHATS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "user", "content": "Write a haiku about the sea."}],
    [
        {"role": "system", "content": "You are a terse assistant."},
        {"role": "user", "content": "Explain what a CPU cache is."},
    ],
    [{"role": "user", "content": "请用中文介绍一下北京。"}],
    [{"role": "user", "content": "Describe this: 🎉🐍🚀 — what do these emoji mean?"}],
]
RAW = [
    "The quick brown fox",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
]


@pytest.fixture(scope="module")
def reference(real_model_path, hf_model) -> dict[str, list[int]]:
    """HF transformers greedy continuation (32 tokens, EOS not special) per prompt,
    computed once per test process: the tensor-parallel golden test
    (``test_tensor_parallel.py``) compares against the same tokens."""
    if real_model_path not in _REFERENCE:
        _REFERENCE[real_model_path] = _greedy_reference(*hf_model)
    return _REFERENCE[real_model_path]


_REFERENCE: dict[Path, dict] = {}


def _greedy_reference(tok, model) -> dict:
    """``reference``'s tokens (and ``"_decode"``: the tokenizer) from transformers'
    tokenizer ``tok`` and float32 model ``model``."""
    prompts = {}
    for i, chat in enumerate(CHATS):
        ids = tok.apply_chat_template(chat, add_generation_prompt=True, tokenize=True)
        ids = ids["input_ids"] if not isinstance(ids, list) else ids
        prompts[f"chat{i}"] = list(ids)
    for i, text in enumerate(RAW):
        prompts[f"raw{i}"] = tok(text)["input_ids"]
    out = {}
    with torch.inference_mode():
        for key, ids in prompts.items():
            res = model(torch.tensor([ids]), use_cache=True)
            gen = []
            for _ in range(NEW_TOKENS):
                nxt = int(res.logits[0, -1].argmax())
                gen.append(nxt)
                res = model(
                    torch.tensor([[nxt]]), past_key_values=res.past_key_values, use_cache=True
                )
            out[key] = gen
    out["_decode"] = tok  # for text comparisons
    return out


def _payload(key: str) -> dict:
    base = {"max_tokens": NEW_TOKENS, "temperature": 0, "ignore_eos": True}
    if key.startswith("chat"):
        return {"messages": CHATS[int(key[4:])], **base}
    return {"prompt": RAW[int(key[3:])], **base}


KEYS = [f"chat{i}" for i in range(len(CHATS))] + [f"raw{i}" for i in range(len(RAW))]


@pytest.mark.parametrize("key", KEYS)
def test_ws_tokens_equal_reference(server, reference, key):
    got = asyncio.run(ws_generate(server.ws_url, _payload(key)))
    assert got["error"] is None, got["error"]
    assert got["token_ids"] == reference[key]
    assert got["final"]["usage"]["completion_tokens"] == NEW_TOKENS


@pytest.mark.parametrize("key", ["chat0", "chat3", "chat4", "raw1"])
def test_http_text_equals_reference(server, reference, key):
    tok = reference["_decode"]
    want = tok.decode(reference[key], skip_special_tokens=True)
    if key.startswith("chat"):
        status, body = asyncio.run(post_json(f"{server.url}/v1/chat/completions", _payload(key)))
        assert status == 200, body
        assert body["choices"][0]["message"]["content"] == want
    else:
        status, body = asyncio.run(post_json(f"{server.url}/v1/completions", _payload(key)))
        assert status == 200, body
        assert body["choices"][0]["text"] == want
