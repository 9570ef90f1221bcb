"""DeepSeek-V2 / V3 served by ``houchu serve --quantization none``: tiny random models
written by transformers (``from_config``, hidden size 64, safetensors beside a
tokenizer) give transformers' greedy tokens and log-probabilities for single requests,
concurrent ones, a prefix-cache hit and chunked prefill."""

from __future__ import annotations

import asyncio
import math
import random
from typing import Any

import aiohttp
import pytest
import torch

from houchu.devtools.tiny_models import TINY_MLA, make_tiny_model, write_tiny_tokenizer
from tests.integration.conftest import start_server, stop_server

pytestmark = pytest.mark.slow

MLA = {**TINY_MLA, "n_group": 2, "topk_group": 1}
FAMILIES = {
    "deepseek_v2": {"topk_method": "group_limited_greedy"},
    "deepseek_v3": {"routed_scaling_factor": 2.5, "norm_topk_prob": True},
}
NEW = 8  # tokens generated per request
ATOL = 1e-4


def ids(seed: int, n: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(3, 128) for _ in range(n)]


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


def hf_reference(hf, prompt: list[int]) -> tuple[list[int], list[torch.Tensor]]:
    """Greedy tokens and the log-softmax ``[V]`` each was drawn from."""
    with torch.no_grad():
        out = hf.generate(
            torch.tensor([prompt]),
            max_new_tokens=NEW,
            do_sample=False,
            eos_token_id=None,
            output_logits=True,
            return_dict_in_generate=True,
        )
    tokens = out.sequences[0, len(prompt) :].tolist()
    return tokens, [lg[0].float().log_softmax(-1) for lg in out.logits]


async def generate(ws_url: str, prompt: list[int]) -> dict[str, Any]:
    """One greedy request over the WebSocket API: token ids, logprobs, usage."""
    body = {"id": "r", "prompt": prompt, "temperature": 0, "max_tokens": NEW}
    body |= {"ignore_eos": True, "logprobs": 3}
    got: dict[str, Any] = {"token_ids": [], "logprobs": [], "final": None}
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url) as ws:
        await ws.send_json(body)
        while got["final"] is None:
            frame = await ws.receive_json(timeout=300)
            assert frame["type"] != "error", frame
            if frame["type"] == "delta":
                got["token_ids"] += frame["token_ids"]
                got["logprobs"] += frame.get("logprobs", [])
            elif frame["type"] == "final":
                got["final"] = frame
    return got


def check(got: dict[str, Any], hf, prompt: list[int]) -> None:
    """The served tokens equal transformers'; each logprob and its top alternatives
    equal transformers' log-softmax within float32 tolerance."""
    tokens, logps = hf_reference(hf, prompt)
    assert got["token_ids"] == tokens
    for lp, ref in zip(got["logprobs"], logps, strict=True):
        assert math.isclose(lp["logprob"], float(ref[lp["token_id"]]), abs_tol=ATOL)
        for alt in lp["top_logprobs"]:
            assert math.isclose(alt["logprob"], float(ref[alt["token_id"]]), abs_tol=ATOL)


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
