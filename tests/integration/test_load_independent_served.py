"""Output that does not depend on the load, on the default path (``houchu serve`` of the
default model, its defaults: no ``--deterministic``; issue 45 item 6): identical seeded
requests sent one after the other give identical tokens, the first with its prompt cold
and the others with it cached; greedy requests give the same tokens alone and beside
seven others; the start-up line says the one kernel family (and so the one int4
activation format) every row count runs."""

from __future__ import annotations

import asyncio
import re
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client import post_json
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

TOPICS = [
    "a lighthouse keeper",
    "the moon landing",
    "a cat who learns to cook",
    "volcanoes",
    "the first computer",
    "a haunted library",
    "ocean currents",
    "a chess tournament",
]


@pytest.fixture(scope="module")
def default_server(real_model_path: Path) -> Iterator[Server]:
    """The default model served with the defaults (int4 as stored, the measured route,
    the thread governor); ``--compile off`` as every test server (compile auto skips the
    compiled step where the route runs the fused layers at batch 1 anyway)."""
    srv = start_server(real_model_path, "--kv-cache-mb", "256", exact=False)
    yield srv
    stop_server(srv)


async def complete(server: Server, body: dict) -> str:
    """One /v1/completions answer's text (status 200 asserted)."""
    status, out = await post_json(f"{server.url}/v1/completions", body)
    assert status == 200, out
    return out["choices"][0]["text"]


def test_identical_seeded_requests_in_a_row_give_identical_tokens(default_server: Server):
    """Temperature 1, top-p 0.95, a seed: three in a row, the prompt new to the server
    (cold) for the first and in its prefix cache for the others (its uncached tail
    attends on the prefill kernel, as the whole prompt did)."""
    tag = uuid.uuid4().hex[:8]  # prompts this server has not seen
    for i, topic in enumerate(TOPICS):
        body = {
            "prompt": f"[{tag}-{i}] Write a story about {topic}.",
            "max_tokens": 48,
            "temperature": 1.0,
            "top_p": 0.95,
            "seed": 1234 + i,
            "ignore_eos": True,
        }
        outs = [asyncio.run(complete(default_server, body)) for _ in range(3)]
        assert outs[1] == outs[0] and outs[2] == outs[0], (i, outs)


def test_greedy_requests_are_the_same_alone_and_beside_seven_others(default_server: Server):
    tag = uuid.uuid4().hex[:8]
    bodies = [
        {"prompt": f"[{tag}-{i}] The most important fact about {t} is", "max_tokens": 32}
        | {"temperature": 0, "ignore_eos": True}
        for i, t in enumerate(TOPICS)
    ]
    alone = [asyncio.run(complete(default_server, b)) for b in bodies]

    async def together() -> list[str]:
        return list(await asyncio.gather(*(complete(default_server, b) for b in bodies)))

    assert asyncio.run(together()) == alone


def test_every_bucket_runs_one_kernel_family(default_server: Server):
    """The measured route's paths (start-up line) are of one kernel family (one int4
    activation format among them), and the line names it where several were timed."""
    from houchu.runner.autotune import FAMILY_TEXT, path_family

    line = next(ln for ln in default_server.lines if "decode paths " in ln)
    paths = re.findall(r"(?:b<=\d+|prefill) ([a-z0-9-]+)", line.split("decode paths ", 1)[1])
    assert paths and len({path_family(p) for p in paths}) == 1, paths
    if "one kernel family" in line:
        assert f"one kernel family: {FAMILY_TEXT[path_family(paths[0])]}" in line
