"""The gateway against a fake engine with a vocabulary of its own, for the request rules
(tools, structured output, token ids)."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from typing import Any

import openai
import pytest
from aiohttp.test_utils import TestClient, TestServer
from llguidance import LLMatcher, LLTokenizer
from openai import AsyncOpenAI

from houchu.api.app import make_app
from houchu.transport.limits import LimitsWatch, RunnerLimits
from tests.support.fake_api import MODEL, Api, FakeEngine

VOCAB = 1000
MESSAGES = [{"role": "user", "content": "Yes or no?"}]


@contextlib.asynccontextmanager
async def serve_vocab() -> AsyncIterator[Api]:
    """The gateway in front of the fake engine, with a runner of ``VOCAB`` tokens."""
    engine = FakeEngine()
    runner = LimitsWatch(RunnerLimits(max_context=1024, vocab_size=VOCAB))
    app = make_app(engine, model_name=MODEL, runner=runner)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield Api(client, engine)


async def chat_error(api: Api, **kw: Any) -> dict[str, Any]:
    """The 400 body the official client gets for a chat request with ``kw``."""
    client = AsyncOpenAI(base_url=str(api.client.make_url("/v1")), api_key="x", max_retries=0)
    try:
        with pytest.raises(openai.BadRequestError) as err:
            await client.chat.completions.create(model=MODEL, **kw)
    finally:
        await client.close()
    assert err.value.status_code == 400
    body = err.value.body
    assert isinstance(body, dict)
    return body


def follows(grammar: str, text: str) -> bool:
    m = LLMatcher(LLTokenizer("byte"), grammar, log_level=0)
    return m.consume_tokens(list(text.encode())) and m.is_accepting()
