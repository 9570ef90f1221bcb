"""The official openai client against a running server."""

from __future__ import annotations

import pytest
from openai import OpenAI

pytestmark = pytest.mark.slow


def test_openai_client_streams_chat(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    models = client.models.list()
    name = models.data[0].id
    stream = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Name a fruit."}],
        max_tokens=16,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    )
    text, usage = "", None
    for chunk in stream:
        if chunk.choices:
            text += chunk.choices[0].delta.content or ""
        if chunk.usage is not None:
            usage = chunk.usage
    assert text.strip()
    assert usage is not None and 0 < usage.completion_tokens <= 16
    full = client.chat.completions.create(
        model=name,
        messages=[{"role": "user", "content": "Name a fruit."}],
        max_tokens=16,
        temperature=0,
    )
    assert full.choices[0].message.content == text


def test_openai_client_completion_logprobs(server):
    client = OpenAI(base_url=f"{server.url}/v1", api_key="unused")
    out = client.completions.create(
        model=client.models.list().data[0].id,
        prompt="1, 2, 3,",
        max_tokens=5,
        temperature=0,
        logprobs=3,
    )
    lp = out.choices[0].logprobs
    assert len(lp.tokens) == 5 == len(lp.token_logprobs)
    assert all(v <= 0 for v in lp.token_logprobs)
    assert all(len(t) == 3 for t in lp.top_logprobs)
    chat = client.chat.completions.create(
        model=client.models.list().data[0].id,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=4,
        temperature=0,
        logprobs=True,
        top_logprobs=2,
    )
    content = chat.choices[0].logprobs.content
    assert len(content) == chat.usage.completion_tokens or len(content) >= 1
    assert all(len(c.top_logprobs) == 2 for c in content)
