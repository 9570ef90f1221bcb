"""``houchu serve --device cuda --tensor-parallel-size 2`` (NCCL, rank r on cuda:r) on a
tiny random Llama: transformers' greedy tokens and log-probabilities through chunked
prefill, concurrent requests and a prefix-cache hit, and each step's all-reduce time in
the dashboard's steps. Needs 2 or more CUDA GPUs; skipped elsewhere (the gloo variant,
``test_tensor_parallel_served.py``, runs everywhere)."""

from __future__ import annotations

import asyncio
import time

import pytest
import torch

from tests.support.served_deepseek import check, generate, ids
from tests.support.tp_server import get_json_ok, serve_tiny_tp2

pytestmark = [
    pytest.mark.slow,
    pytest.mark.multi_gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available() or torch.cuda.device_count() < 2,
        reason="NCCL tensor parallel needs 2 or more CUDA GPUs",
    ),
]


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve_tiny_tp2(
        tmp_path_factory, "tp_nccl", "--device", "cuda", "--attention-backend", "torch"
    )


def test_tp2_over_nccl_equals_transformers(served):
    srv, hf = served
    prompts = [ids(1, 30), ids(2, 11), ids(3, 7)]

    async def all_of() -> list[dict]:
        return await asyncio.gather(*(generate(srv.ws_url, p) for p in prompts))

    for got, prompt in zip(asyncio.run(all_of()), prompts, strict=True):
        check(got, hf, prompt)
    shared = ids(40, 24)
    asyncio.run(generate(srv.ws_url, shared + ids(41, 3)))
    again = asyncio.run(generate(srv.ws_url, shared + ids(42, 5)))
    assert again["final"]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 24
    check(again, hf, shared + ids(42, 5))
    assert "tensor parallel: 2 ranks (NCCL)" in srv.output()
    deadline = time.monotonic() + 30
    while not [
        s
        for s in asyncio.run(get_json_ok(f"{srv.url}/dashboard/api/live"))["steps"]
        if s["allreduce_ms"]
    ]:
        assert time.monotonic() < deadline, "no step with its all-reduce time recorded"
        time.sleep(0.5)
