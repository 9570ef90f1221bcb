"""``houchu serve --tensor-parallel-size 2`` (gloo, 2 ranks of 1 thread) on a tiny random
Llama (hidden 64, 4 heads, 2 KV heads, vocabulary 128) with n-gram speculation:
transformers' greedy tokens and log-probabilities (float32 tolerance) through chunked
prefill, concurrent requests and a prefix-cache hit; a killed rank restarts the runner."""

from __future__ import annotations

import asyncio
import time

import pytest

from tests.support.served_deepseek import check, generate, ids
from tests.support.tp_server import get_json_ok, serve_tiny_tp2

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    yield from serve_tiny_tp2(
        tmp_path_factory,
        "tp_served",
        *("--threads", "1", "--speculative", "ngram"),
        *("--speculative-max-batch", "8"),  # speculate whatever it costs (a loaded machine)
    )


def test_tp2_requests_equal_transformers(served):
    srv, hf = served
    loop = [5, 9, 13, 17, 21, 25]  # repeated: the n-gram proposer has matches
    prompts = [ids(1, 30), loop * 4, ids(3, 7) + loop * 3]

    async def all_of() -> list[dict]:
        return await asyncio.gather(*(generate(srv.ws_url, p) for p in prompts))

    for got, prompt in zip(asyncio.run(all_of()), prompts, strict=True):
        check(got, hf, prompt)
    shared = ids(40, 24)
    first = asyncio.run(generate(srv.ws_url, shared + ids(41, 3)))
    again = asyncio.run(generate(srv.ws_url, shared + ids(42, 5)))
    assert again["final"]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 24
    check(first, hf, shared + ids(41, 3))
    check(again, hf, shared + ids(42, 5))
    stats = asyncio.run(_stats(srv.url))
    assert stats["tp_allreduce_s"] > 0 and stats["num_steps"] > 0
    assert stats["spec_proposed_tokens"] > 0, stats  # verify steps ran at tp 2
    assert "tensor parallel: 2 ranks (gloo)" in srv.output()


def test_each_steps_allreduce_reaches_the_dashboard(served):
    """The runner's step records carry the all-reduce seconds into the database: the
    dashboard's last steps and rates show them (after the recorder's flush)."""
    srv, _ = served
    asyncio.run(generate(srv.ws_url, ids(60, 12)))
    deadline = time.monotonic() + 30
    while True:
        live = asyncio.run(get_json_ok(f"{srv.url}/dashboard/api/live"))
        tp = [s for s in live["steps"] if s["allreduce_ms"] is not None]
        if tp:
            break
        assert time.monotonic() < deadline, live["steps"]
        time.sleep(0.5)
    assert all(0 < s["allreduce_ms"] < s["step_ms"] for s in tp), tp


def test_a_dead_rank_restarts_the_runner(served):
    """Rank 1 killed while the server is idle: the runner notices within seconds, with
    no request to find it (``RunnerActor._watch_ranks``), exits, and the supervisor
    restarts it with fresh ranks; requests succeed again within a bounded time, and any
    that met the restart were told so plainly (no gloo internals). A rank lost during a
    step: tests/integration/test_tp_timeouts.py."""
    import psutil

    srv, hf = served
    ranks = [
        p
        for p in psutil.Process(srv.proc.pid).children(recursive=True)
        if "houchu.runner.tensor_parallel.worker" in " ".join(p.cmdline())
    ]
    assert len(ranks) == 1
    ranks[0].kill()
    noticed_by = time.monotonic() + 20
    while "tensor-parallel rank 1 exited" not in srv.output():
        assert time.monotonic() < noticed_by, "the idle runner did not notice the dead rank"
        time.sleep(0.2)
    prompt = ids(50, 9)
    deadline = time.monotonic() + 120
    failures: list[str] = []
    while True:  # a request during the restart may fail cleanly (503), never hang
        got = asyncio.run(_generate_or_error(srv.ws_url, prompt, failures))
        if got is not None:
            break
        assert time.monotonic() < deadline, "no answer within 120 s of the rank's death"
        time.sleep(1)
    check(got, hf, prompt)
    assert "restarting runner" in srv.output()
    assert not any("gloo" in f or ".cc:" in f for f in failures), failures


async def _generate_or_error(ws_url: str, prompt: list[int], failures: list[str]) -> dict | None:
    """The answer, or None when the request failed cleanly: an error frame, or the final
    frame of a request the engine failed after taking it (``finish_reason: "error"``);
    what the client was told is appended to ``failures``."""
    try:
        got = await asyncio.wait_for(generate(ws_url, prompt), 60)
    except AssertionError as e:  # an error frame (in the message)
        failures.append(str(e))
        return None
    if got["final"]["finish_reason"] == "error":
        failures.append(str(got["final"]))
        return None
    return got


async def _stats(url: str) -> dict:
    return await get_json_ok(f"{url}/stats")
