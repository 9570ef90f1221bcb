"""``houchu serve --speculative mtp`` on a tiny random DeepSeek-V3 whose safetensors hold
one MTP module (``add_mtp_layer``): the runner proposes with it (no draft actor is
started), the greedy tokens are those of the same server without speculation and
transformers' (which ignores the module), the stats count the proposals, a module built
to predict the target's own next token has every proposal accepted; the dashboard shows
the target's expert load per step; a checkpoint without the module refuses to start,
saying why."""

from __future__ import annotations

import asyncio
import time

import aiohttp
import pytest
import torch

from houchu.devtools.tiny_models import (
    add_mtp_layer,
    make_mtp_exact,
    make_tiny_model,
    write_tiny_tokenizer,
)
from tests.support.served_deepseek import FAMILIES, MLA, hf_reference, ids
from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow

CFG = {**MLA, **FAMILIES["deepseek_v3"], "num_hidden_layers": 2}
SPEC = ("--speculative", "mtp", "--num-speculative-tokens", "2", "--speculative-max-batch", "8")
SERVE = ("--page-size", "4", "--num-pages", "256", "--threads", "1")
PROMPTS = [ids(1, 12), ids(2, 5), ids(3, 9)]
NEW = 16  # tokens generated per request


async def stats(url: str) -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"{url}/stats") as r:
        return await r.json()


async def generate(ws_url: str, prompt: list[int]) -> list[int]:
    """``NEW`` greedy tokens after ``prompt`` over the WebSocket API."""
    body = {"id": "r", "prompt": prompt, "temperature": 0, "max_tokens": NEW, "ignore_eos": True}
    out: list[int] = []
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url) as ws:
        await ws.send_json(body)
        while True:
            frame = await ws.receive_json(timeout=300)
            assert frame["type"] != "error", frame
            if frame["type"] == "delta":
                out += frame["token_ids"]
            elif frame["type"] == "final":
                return out


async def generate_all(ws_url: str) -> list[list[int]]:
    """Each of ``PROMPTS`` alone, then all of them at once (a batch that verifies)."""
    alone = [await generate(ws_url, p) for p in PROMPTS]
    together = await asyncio.gather(*(generate(ws_url, p) for p in PROMPTS))
    return alone + list(together)


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


def served_tokens(path, *flags: str) -> tuple[list[list[int]], dict, str]:
    """Serve ``path`` with ``flags``: the tokens of ``generate_all``, the stats, the
    server's output."""
    srv = start_server(path, *SERVE, *flags)
    try:
        tokens = asyncio.run(generate_all(srv.ws_url))
        return tokens, asyncio.run(stats(srv.url)), srv.output()
    finally:
        stop_server(srv)


@pytest.fixture(scope="module")
def mtp_model(tmp_path_factory):
    path = make_tiny_model(tmp_path_factory.mktemp("m"), "deepseek_v3", seed=5, **CFG)
    path = add_mtp_layer(path, 5, **CFG)
    write_tiny_tokenizer(path, 128)
    return path


def test_mtp_speculation_served_equals_plain_and_transformers(mtp_model):
    from transformers import AutoModelForCausalLM

    plain, _, _ = served_tokens(mtp_model)
    srv = start_server(mtp_model, *SERVE, *SPEC)
    try:
        got = asyncio.run(generate_all(srv.ws_url))
        st = asyncio.run(stats(srv.url))
        # the target's expert load per step reaches the dashboard (one MoE layer, 8 experts)
        load = asyncio.run(expert_load(srv.url))
    finally:
        stop_server(srv)
    assert got == plain
    hf = AutoModelForCausalLM.from_pretrained(mtp_model, dtype=torch.float32).eval()
    assert got[0][:8] == hf_reference(hf, PROMPTS[0])[0]
    assert st["speculative"] == "mtp"
    assert st["spec_proposed_tokens"] > 0
    assert st["spec_accepted_tokens"] + st["spec_rejected_tokens"] == st["spec_proposed_tokens"]
    out = srv.output()
    assert "MTP layer 2" in out and "proposes in the runner" in out
    assert "houchu: runner ready" in out and "houchu: draft ready" not in out  # no draft actor
    assert (load["layers"], load["experts"]) == (1, 8) and load["steps"] > 0
    assert load["last"]["imbalance"] >= 1.0


def test_mtp_that_predicts_the_target_has_every_proposal_accepted(mtp_model, tmp_path):
    exact = make_mtp_exact(mtp_model, tmp_path / "exact")
    plain, _, _ = served_tokens(exact)
    got, st, _ = served_tokens(exact, *SPEC)
    assert got == plain
    assert st["spec_proposed_tokens"] > 0
    assert st["spec_accepted_tokens"] == st["spec_proposed_tokens"]
    assert st["spec_mean_acceptance_length"] > 2.0  # 2 proposals + the target's token


def test_checkpoint_without_mtp_refuses_to_start(tmp_path):
    path = make_tiny_model(tmp_path / "m", "deepseek_v3", seed=5, **CFG)
    write_tiny_tokenizer(path, 128)
    with pytest.raises(RuntimeError, match="model.layers.2.eh_proj.weight"):
        srv = start_server(path, *SERVE, *SPEC, timeout_s=240)
        stop_server(srv)
