"""DeepSeek-V2 / V3 served by ``houchu serve --quantization none``: tiny random models
written by transformers (``from_config``, hidden size 64, safetensors beside a
tokenizer) give transformers' greedy tokens and log-probabilities for single requests,
concurrent ones, a prefix-cache hit and chunked prefill."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_model, write_tiny_tokenizer
from tests.support.served_deepseek import FAMILIES, MLA, check, generate, ids
from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module", params=list(FAMILIES))
def served(request, tmp_path_factory):
    """(server, transformers model) for each family, chunked prefill of 8 tokens."""
    from transformers import AutoModelForCausalLM

    name = request.param
    path = make_tiny_model(tmp_path_factory.mktemp(name), name, seed=5, **MLA, **FAMILIES[name])
    write_tiny_tokenizer(path, 128)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    srv = start_server(
        path,
        *("--page-size", "4", "--num-pages", "256", "--chunked-prefill-size", "8"),
        *("--max-batch-tokens", "32", "--threads", "1"),
    )
    yield srv, hf
    stop_server(srv)


def test_single_request_equals_transformers(served):
    srv, hf = served
    prompt = ids(1, 30)  # four prefill chunks of 8
    check(asyncio.run(generate(srv.ws_url, prompt)), hf, prompt)
    assert "MLA latent KV" in srv.output()


def test_concurrent_requests_equal_transformers(served):
    srv, hf = served
    prompts = [ids(10 + i, n) for i, n in enumerate([5, 19, 33, 12])]

    async def all_of() -> list[dict[str, Any]]:
        return await asyncio.gather(*(generate(srv.ws_url, p) for p in prompts))

    for got, prompt in zip(asyncio.run(all_of()), prompts, strict=True):
        check(got, hf, prompt)


def test_prefix_cache_hit_equals_transformers(served):
    srv, hf = served
    shared = ids(40, 24)
    first = asyncio.run(generate(srv.ws_url, shared + ids(41, 3)))
    again = asyncio.run(generate(srv.ws_url, shared + ids(42, 5)))
    assert again["final"]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 24
    check(first, hf, shared + ids(41, 3))
    check(again, hf, shared + ids(42, 5))
