"""``houchu serve --speculative mtp`` on a tiny random DeepSeek-V3 whose safetensors hold
one MTP module (``add_mtp_layer``): the draft actor proposes with it, the greedy tokens
are transformers' (which ignores the module), and the stats count the proposals; the
dashboard shows the target's expert load per step; a checkpoint without the module
refuses to start, saying why."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import torch

from houchu.model.testing import add_mtp_layer, make_tiny_model, write_tiny_tokenizer
from tests.integration.conftest import start_server, stop_server
from tests.integration.test_deepseek_served import FAMILIES, MLA, generate, hf_reference, ids

pytestmark = pytest.mark.slow

CFG = {**MLA, **FAMILIES["deepseek_v3"], "num_hidden_layers": 2}
SPEC = ("--speculative", "mtp", "--num-speculative-tokens", "2", "--speculative-max-batch", "8")
SERVE = ("--page-size", "4", "--num-pages", "256", "--threads", "1")


async def stats(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/stats") as r:
        return await r.json()


async def expert_load(url: str, timeout_s: float = 20.0) -> dict:
    """The dashboard's expert load, once the recorder has written a step's."""
    deadline = time.monotonic() + timeout_s
    async with aiohttp.ClientSession() as s:
        while True:
            async with s.get(f"{url}/dashboard/api/live") as r:
                load = (await r.json())["expert_load"]
            if load is not None or time.monotonic() > deadline:
                return load
            await asyncio.sleep(0.5)


def test_mtp_speculation_served_equals_transformers(tmp_path):
    from transformers import AutoModelForCausalLM

    path = add_mtp_layer(make_tiny_model(tmp_path / "m", "deepseek_v3", seed=5, **CFG), 5, **CFG)
    write_tiny_tokenizer(path, 128)
    hf = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    srv = start_server(path, *SERVE, *SPEC)
    try:
        for seed, n in ((1, 12), (2, 5)):
            prompt = ids(seed, n)
            got = asyncio.run(generate(srv.ws_url, prompt))
            assert got["token_ids"] == hf_reference(hf, prompt)[0]
        st = asyncio.run(stats(srv.url))
        assert st["speculative"] == "mtp"
        assert st["spec_proposed_tokens"] > 0
        assert st["spec_accepted_tokens"] + st["spec_rejected_tokens"] == st["spec_proposed_tokens"]
        assert "MTP layer 2" in srv.output()
        # the target's expert load per step reaches the dashboard (one MoE layer, 8 experts)
        load = asyncio.run(expert_load(srv.url))
        assert (load["layers"], load["experts"]) == (1, 8) and load["steps"] > 0
        assert load["last"]["imbalance"] >= 1.0
    finally:
        stop_server(srv)


def test_checkpoint_without_mtp_refuses_to_start(tmp_path):
    path = make_tiny_model(tmp_path / "m", "deepseek_v3", seed=5, **CFG)
    write_tiny_tokenizer(path, 128)
    with pytest.raises(RuntimeError, match="model.layers.2.eh_proj.weight"):
        srv = start_server(path, *SERVE, *SPEC, timeout_s=240)
        stop_server(srv)
