"""The radix prefix cache, chunked prefill and preemption never change greedy output."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Iterator

import aiohttp
import pytest

from tests.support.client import get_json, ws_collect, ws_generate
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

SYSTEM = (
    "You are a meticulous assistant for a museum of natural history. You answer questions "
    "about fossils, minerals, and the history of life on Earth, citing the relevant era. "
) * 3
QUESTIONS = ["What is a trilobite?", "How old is the oldest mineral?", "What is amber?"]
GREEDY = {"temperature": 0, "max_tokens": 12, "ignore_eos": True}
#: The stop-string test's system prompt: no other request of the session starts like it
#: (its first page differs from every other prompt's).
STOP_SYSTEM = (
    "Botanical garden guide: you answer visitors' questions about trees, ferns and "
    "flowering plants, naming the family each belongs to and where it grows wild. "
) * 3


def _chat(q: str) -> list[dict]:
    return [{"role": "system", "content": SYSTEM}, {"role": "user", "content": q}]


def _requests(exact_pages_ids: list[int]) -> list[dict]:
    """The prompt set, in order: shared-prefix chats, an exactly-page-aligned token prompt
    sent twice (the second is fully cached), and a two-turn conversation."""
    reqs = [{"messages": _chat(q), **GREEDY} for q in QUESTIONS]
    reqs += [{"prompt": exact_pages_ids, **GREEDY}, {"prompt": exact_pages_ids, **GREEDY}]
    reqs.append({"messages": _chat("Tell me about mammoths."), **GREEDY})
    return reqs


async def _run_all(ws_url: str, reqs: list[dict]) -> list[list[int]]:
    out = []
    for r in reqs:
        got = await ws_generate(ws_url, r)
        assert got["error"] is None, got["error"]
        out.append(got["token_ids"])
    # the second turn extends the first with its answer
    first = await ws_generate(ws_url, {"messages": _chat("Tell me about mammoths."), **GREEDY})
    turn2 = _chat("Tell me about mammoths.") + [
        {"role": "assistant", "content": first["text"]},
        {"role": "user", "content": "And mastodons?"},
    ]
    second = await ws_generate(ws_url, {"messages": turn2, **GREEDY})
    out.append(second["token_ids"])
    return out


CONFIGS = {
    "plain": ["--disable-radix-cache", "--chunked-prefill-size", "0", "--max-batch-tokens", "4096"],
    "radix": [],
    "radix-chunk-1-page": ["--chunked-prefill-size", "16", "--max-batch-tokens", "32"],
    "no-radix-chunk-3-pages": ["--disable-radix-cache", "--chunked-prefill-size", "48"],
}


def _run_prompt_set(srv: Server) -> tuple[list[list[int]], dict]:
    """The prompt set's tokens on ``srv``, and its ``/stats`` right after."""
    ids = [(i * 37) % 30000 + 1000 for i in range(64)]  # exactly 4 pages of 16 tokens
    toks = asyncio.run(_run_all(srv.ws_url, _requests(ids)))
    _, stats = asyncio.run(get_json(f"{srv.url}/stats"))
    return toks, stats


@pytest.fixture(scope="module")
def radix_server(real_model_path) -> Iterator[Server]:
    """The ``radix`` configuration's server, kept for the module: after the prompt set
    (``outputs``) the stop-string test uses it too (the flags it needs)."""
    srv = start_server(real_model_path, "--kv-cache-mb", "64", *CONFIGS["radix"])
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def outputs(real_model_path, radix_server) -> dict[str, tuple[list[list[int]], dict]]:
    """Each configuration's tokens and stats on a server that has served nothing before."""
    results = {}
    for name, flags in CONFIGS.items():
        if name == "radix":
            results[name] = _run_prompt_set(radix_server)
            continue
        srv = start_server(real_model_path, "--kv-cache-mb", "64", *flags)
        try:
            results[name] = _run_prompt_set(srv)
        finally:
            stop_server(srv)
    return results


@pytest.mark.parametrize("name", [n for n in CONFIGS if n != "plain"])
def test_same_greedy_tokens_as_plain(outputs, name):
    assert outputs[name][0] == outputs["plain"][0]


def test_radix_cache_reused_prefixes(outputs):
    stats = outputs["radix"][1]
    assert stats["prefix_tokens_reused"] > 3 * len(SYSTEM) // 8  # the shared system prompt
    assert stats["prefix_flops_saved"] > 0
    assert outputs["plain"][1]["prefix_tokens_reused"] == 0


def _cached(got: dict) -> int:
    return got["final"]["usage"]["prompt_tokens_details"]["cached_tokens"]


@pytest.mark.usefixtures("outputs")  # the radix server's stats are taken before this test
def test_stop_string_leaves_a_correct_cache(radix_server, server):
    """The shared server answers the reference (its first sight of this prompt: nothing
    cached, as the assertion checks), then the module's radix server (after the prompt
    set; this prompt shares no page with it, so nothing of it is cached there either, as
    checked) stops a request mid-way, and its repeat reuses the cache it left and gives
    the reference's tokens."""
    messages = [
        {"role": "system", "content": STOP_SYSTEM},
        {"role": "user", "content": "What is a cycad?"},
    ]
    body = {"messages": messages, "temperature": 0, "max_tokens": 24, "ignore_eos": True}
    want = asyncio.run(ws_generate(server.ws_url, body))
    assert _cached(want) == 0
    words = want["text"].split()
    stop = words[len(words) // 2]
    stopped = asyncio.run(ws_generate(radix_server.ws_url, {**body, "stop": [stop]}))
    assert stopped["final"]["finish_reason"] == "stop"
    assert _cached(stopped) == 0
    again = asyncio.run(ws_generate(radix_server.ws_url, body))
    assert _cached(again) > 0
    assert again["token_ids"] == want["token_ids"]


def test_preemption_with_tiny_pool_gives_same_tokens(real_model_path, server):
    """The shared server (pages enough for all six) answers the reference."""
    prompts = [f"Write a list of {n} animals that live in the ocean:" for n in range(3, 9)]
    bodies = [
        {"prompt": p, "temperature": 0, "max_tokens": 40, "ignore_eos": True} for p in prompts
    ]

    async def concurrent(url):
        return await asyncio.gather(*(ws_generate(url, b) for b in bodies))

    want = [r["token_ids"] for r in asyncio.run(concurrent(server.ws_url))]
    # 6 requests x ~55 tokens need ~24 pages; 12 pages force preemption.
    tiny = start_server(real_model_path, "--num-pages", "12", "--disable-radix-cache")
    try:
        got = [r["token_ids"] for r in asyncio.run(concurrent(tiny.ws_url))]
        _, stats = asyncio.run(get_json(f"{tiny.url}/stats"))
    finally:
        stop_server(tiny)
    assert stats["num_preemptions"] > 0
    assert got == want


def test_many_requests_with_aborts_leak_no_pages(real_model_path):
    """300 requests from a few shared prefixes, random lengths, random client aborts:
    every request gets exactly one final answer, and no page leaks."""
    rng = random.Random(7)
    prefixes = [SYSTEM[: 80 * (i + 1)] for i in range(4)]
    srv = start_server(real_model_path, "--num-pages", "96", "--max-running-requests", "16")

    async def one(session, i):
        body = {
            "id": str(i),
            "prompt": rng.choice(prefixes) + f" Question {rng.randrange(50)}:",
            "max_tokens": rng.randint(1, 8),
            "temperature": rng.choice([0, 0.7]),
        }
        abort = rng.random() < 0.2
        async with session.ws_connect(srv.ws_url) as ws:
            await ws.send_json(body)
            if abort:
                await asyncio.sleep(rng.random() * 0.3)
                return "aborted"
            got = await ws_collect(ws, str(i))
            assert (got["final"] is None) != (got["error"] is None)
            return "final" if got["final"] else "error"

    async def go():
        sem = asyncio.Semaphore(24)
        async with aiohttp.ClientSession() as s:

            async def bounded(i):
                async with sem:
                    return await one(s, i)

            return await asyncio.gather(*(bounded(i) for i in range(300)))

    try:
        results = asyncio.run(go())
        for _ in range(100):
            _, stats = asyncio.run(get_json(f"{srv.url}/stats"))
            if stats["num_running"] == 0 and stats["num_waiting"] == 0:
                break
            asyncio.run(asyncio.sleep(0.2))
    finally:
        stop_server(srv)
    assert results.count("error") == 0
    assert results.count("final") + results.count("aborted") == 300
    assert stats["num_running"] == 0 and stats["num_waiting"] == 0
    assert stats["num_pages_free"] + stats["num_pages_cached"] == stats["num_pages_total"]
    assert stats["prefix_tokens_reused"] > 0
