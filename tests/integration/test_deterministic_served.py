"""``houchu serve --deterministic`` through the OpenAI API: a seeded request at
temperature 1 gets the same tokens and the same logprobs, bit for bit, alone and while
requests of other lengths are batched beside it, on the default int4 path and on the
exact float32 path; startup and ``/stats`` say what the mode pins."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.client import get_json, post_json
from tests.support.server import Server, free_port, start_server, stop_server

pytestmark = pytest.mark.slow

SEEDED = {
    "prompt": "A short story about a robot who learns to paint:",
    "max_tokens": 24,
    "temperature": 1.0,
    "seed": 4321,
    "logprobs": 1,
    "ignore_eos": True,
}
# other lengths: a few tokens to a few hundred, some seeded, some greedy
NOISE = [
    {"prompt": "Hi", "max_tokens": 30, "temperature": 0.7},
    {"prompt": "The history of the printing press " * 30, "max_tokens": 20, "temperature": 1.0},
    {"prompt": "List three fruits:", "max_tokens": 28, "temperature": 0, "seed": 1},
    {"prompt": "Explain photosynthesis in simple words. " * 8, "max_tokens": 26, "seed": 7},
    {"prompt": "1, 2, 3,", "max_tokens": 16, "temperature": 1.2},
]


@pytest.fixture(scope="module", params=["int4", "exact"])
def det_server(request: pytest.FixtureRequest, real_model_path: Path) -> Iterator[Server]:
    """A ``--deterministic`` server on the default model's int4 path (SGLang's spelling
    of the flag) or its exact path."""
    flag = "--enable-deterministic-inference" if request.param == "int4" else "--deterministic"
    srv = start_server(
        real_model_path, flag, "--kv-cache-mb", "256", exact=request.param == "exact"
    )
    yield srv
    stop_server(srv)


async def complete(server: Server, body: dict) -> dict:
    """One /v1/completions answer (status 200 asserted)."""
    status, out = await post_json(f"{server.url}/v1/completions", body)
    assert status == 200, out
    return out


def choice(out: dict) -> tuple[str, list[str], list[float]]:
    """(text, tokens, token logprobs) of a completion's first choice."""
    c = out["choices"][0]
    return c["text"], c["logprobs"]["tokens"], c["logprobs"]["token_logprobs"]


async def beside(server: Server, at: int, noise: list[dict]) -> dict:
    """The seeded request sent with ``noise`` at once, at place ``at``; its answer."""
    bodies = [*noise[:at], SEEDED, *noise[at:]]
    outs = await asyncio.gather(*(complete(server, b) for b in bodies))
    return outs[at]


def test_seeded_request_is_the_same_alone_and_in_any_batch(det_server: Server) -> None:
    alone = choice(asyncio.run(complete(det_server, SEEDED)))
    assert len(alone[1]) == SEEDED["max_tokens"]
    for at, noise in ((0, NOISE), (2, NOISE[::-1]), (1, NOISE[1:3])):
        got = choice(asyncio.run(beside(det_server, at, noise)))
        assert got == alone, (at, len(noise))
    assert choice(asyncio.run(complete(det_server, {**SEEDED, "seed": 99})))[1] != alone[1]


def test_startup_and_stats_say_what_is_pinned(det_server: Server) -> None:
    assert "deterministic inference on (batch-invariant)" in det_server.output()
    status, stats = asyncio.run(get_json(f"{det_server.url}/stats"))
    assert status == 200
    assert "fixed threads" in stats["deterministic"]


def test_a_refused_combination_is_one_line_without_a_traceback(real_model_path: Path) -> None:
    """``--deterministic`` with int8 activations, or without the C++ kernels on a
    quantized model: refused while the flags are checked, before any actor starts; exit
    status 2, the reason on one line and a ``--help`` hint, no traceback."""
    import subprocess
    import sys

    cmd = [sys.executable, "-m", "houchu.cli", "serve", "--model", str(real_model_path)]
    for flags, reason in (
        (["--int4-activations", "int8"], "pins float activations: drop --int4-activations int8"),
        (["--cpu-isa", "generic"], "needs houchu's C++ CPU kernels for quantized weights"),
    ):
        args = ["--port", str(free_port()), "--deterministic", *flags]
        done = subprocess.run([*cmd, *args], capture_output=True, text=True, timeout=180)
        out = done.stdout + done.stderr
        assert done.returncode == 2, out
        first, hint = out.strip().splitlines()
        assert first.startswith("houchu serve: error: --deterministic") and reason in first
        assert "--help" in hint and "actor" not in out and "Traceback" not in out
