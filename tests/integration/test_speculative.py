"""Speculative decoding over the API on the real model: greedy output equals the plain
server's with n-gram proposals and with the model as its own draft (which must accept
everything); stops that fall inside an accepted run; an abort frees pages in both the
scheduler and the draft actor."""

from __future__ import annotations

import asyncio
import time
from concurrent.futures import ThreadPoolExecutor

import aiohttp
import pytest

from tests.support.client import post_json, ws_generate
from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow

REPEAT = (
    "Copy the list exactly, twice.\nList: red, green, blue, yellow, purple, orange, "
    "black, white.\nCopy 1: red, green, blue, yellow, purple, orange, black, white.\nCopy 2:"
)
CHAT = [{"role": "user", "content": "Explain what a CPU cache is, in two sentences."}]
FORCE = ("--speculative-max-batch", "8", "--compile", "off")  # speculate whatever it costs


@pytest.fixture(scope="module")
def spec_servers(real_model_path):
    """(n-gram server, self-draft server), started side by side."""
    args = [
        ("--speculative", "ngram", *FORCE),
        ("--draft-model", str(real_model_path), *FORCE),
    ]
    with ThreadPoolExecutor(2) as pool:
        futs = [
            pool.submit(start_server, real_model_path, "--kv-cache-mb", "128", *a) for a in args
        ]
        servers = [f.result() for f in futs]
    yield servers
    for s in servers:
        stop_server(s)


async def stats(server) -> dict:
    async with aiohttp.ClientSession() as s, s.get(f"{server.url}/stats") as r:
        return await r.json()


def generate(server, **payload) -> dict:
    got = asyncio.run(ws_generate(server.ws_url, {"temperature": 0, **payload}))
    assert got["error"] is None, got["error"]
    return got


def test_greedy_output_is_the_plain_servers(server, spec_servers):
    ngram, draft = spec_servers
    want = generate(server, prompt=REPEAT, max_tokens=32, ignore_eos=True)["token_ids"]
    for s in (ngram, draft):
        assert generate(s, prompt=REPEAT, max_tokens=32, ignore_eos=True)["token_ids"] == want
    want = generate(server, messages=CHAT, max_tokens=24, ignore_eos=True)["token_ids"]
    assert generate(ngram, messages=CHAT, max_tokens=24, ignore_eos=True)["token_ids"] == want
    st = asyncio.run(stats(draft))
    # forced speculation proposes k >= 1 tokens every step (k follows measured costs)
    assert st["speculative"] == "draft" and st["spec_proposed_tokens"] >= 10
    assert st["spec_acceptance_rate"] == 1.0  # the model as its own draft
    assert st["spec_forward_passes_saved"] > 0
    st = asyncio.run(stats(ngram))
    print("n-gram:", {k: v for k, v in st.items() if k.startswith("spec_")})
    # the copy repeats the prompt: most proposals are right (how many tokens each step
    # proposes follows the measured step times, so the count of accepted ones varies)
    assert st["spec_accepted_tokens"] >= 5
    assert st["spec_acceptance_rate"] >= 0.5


@pytest.mark.parametrize("kind", ["stop_string", "stop_token_id", "max_tokens"])
def test_stops_inside_accepted_runs_match_the_plain_server(server, spec_servers, kind):
    """On the self-draft server every step accepts a run, so each stop falls inside one."""
    payload = {"prompt": REPEAT, "max_tokens": 20, "temperature": 0}
    if kind == "stop_string":
        payload["stop"] = [" blue, yellow"]
    elif kind == "stop_token_id":  # a token in the middle of the copy
        ids = generate(server, prompt=REPEAT, max_tokens=8, ignore_eos=True)["token_ids"]
        payload["stop_token_ids"] = [ids[6]]
    else:
        payload["max_tokens"] = 7
    status, want = asyncio.run(post_json(f"{server.url}/v1/completions", payload))
    assert status == 200, want
    status, got = asyncio.run(post_json(f"{spec_servers[1].url}/v1/completions", payload))
    assert status == 200, got
    assert got["choices"][0]["text"] == want["choices"][0]["text"]
    assert got["choices"][0]["finish_reason"] == want["choices"][0]["finish_reason"]
    assert got["usage"] == want["usage"]


def test_abort_during_verification_frees_pages_in_both_actors(spec_servers):
    _, draft = spec_servers

    async def start_then_leave() -> None:
        async with aiohttp.ClientSession() as s, s.ws_connect(draft.ws_url) as ws:
            await ws.send_json(
                {
                    "id": "x",
                    "prompt": REPEAT,
                    "max_tokens": 300,
                    "temperature": 0,
                    "ignore_eos": True,
                }
            )
            for _ in range(3):  # a few verified runs, then the client goes away
                await ws.receive_json(timeout=120)

    asyncio.run(start_then_leave())
    deadline = time.monotonic() + 60
    while True:
        st = asyncio.run(stats(draft))
        idle = st["num_running"] == 0 and st["draft_num_seqs"] == 0
        if idle and st["draft_pages_used"] == 0 or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert st["num_running"] == 0 and st["num_aborted"] >= 1
    assert st["num_pages_used"] == st["num_pages_cached"]  # only the prefix cache holds pages
    assert st["draft_num_seqs"] == 0 and st["draft_pages_used"] == 0
