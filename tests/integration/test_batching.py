"""Batch invariance: the same answers alone and in a busy batch."""

from __future__ import annotations

import asyncio

import pytest

from tests.support.client import get_json, ws_generate

pytestmark = pytest.mark.slow

PROMPTS = [
    "The three primary colors are",
    "In mathematics, a prime number is",
    "Paris is famous for",
    "The best way to learn programming is",
    "北京是",
    "Water boils at",
]


async def _all(server, bodies):
    return await asyncio.gather(*(ws_generate(server.ws_url, b) for b in bodies))


def test_concurrent_greedy_equals_sequential(server):
    bodies = [
        {"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True} for p in PROMPTS
    ]
    alone = [asyncio.run(ws_generate(server.ws_url, b))["token_ids"] for b in bodies]
    together = [r["token_ids"] for r in asyncio.run(_all(server, bodies))]
    assert together == alone


def test_seeded_sample_is_batch_invariant(server):
    seeded = {
        "prompt": "A short story about a robot:",
        "max_tokens": 24,
        "temperature": 1.0,
        "top_p": 0.9,
        "seed": 1234,
        "ignore_eos": True,
    }
    alone = asyncio.run(ws_generate(server.ws_url, seeded))["text"]
    noise = [
        {"prompt": p, "max_tokens": 24, "temperature": 0.8, "ignore_eos": True} for p in PROMPTS
    ]
    results = asyncio.run(_all(server, [*noise[:3], seeded, *noise[3:]]))
    assert results[3]["text"] == alone
    other_seed = asyncio.run(ws_generate(server.ws_url, {**seeded, "seed": 99}))["text"]
    assert other_seed != alone


def test_pages_return_after_requests(server):
    asyncio.run(_all(server, [{"prompt": p, "max_tokens": 8} for p in PROMPTS]))
    status, stats = asyncio.run(get_json(f"{server.url}/stats"))
    assert status == 200
    assert stats["num_pages_free"] + stats["num_pages_cached"] == stats["num_pages_total"]
    assert stats["num_running"] == 0
