"""The golden test through a tensor-parallel ``houchu serve``: greedy output equals
Hugging Face transformers' (fp32, the exact path) with the model sharded over 3 gloo
ranks of 1 thread each, prompts prefilled in chunks of 16 tokens, and a repeated prompt
served from the prefix cache.

SmolLM2-135M has 9 query and 3 KV heads: 3 is the one size > 1 that divides both (tp 2
is refused at startup, as ``test_tp2_refused_on_smollm2`` checks), so the golden run is
tp 3, beside the tp 2 logits test on a tiny model (``tests/integration/test_tensor_parallel_runner.py``).
On a machine with fewer than 3 cores the ranks share them
(``HOUCHU_TP_OVERSUBSCRIBE``).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys

import pytest

from tests.support.client import ws_generate
from tests.support.golden import KEYS, payload
from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tp_server(real_model_path, tmp_path_factory):
    db = tmp_path_factory.mktemp("tp") / "houchu.db"
    os.environ["HOUCHU_TP_OVERSUBSCRIBE"] = "1"
    try:
        srv = start_server(
            real_model_path,
            "--tensor-parallel-size",
            "3",
            "--threads",
            "1",
            "--kv-cache-mb",
            "64",
            "--chunked-prefill-size",
            "16",
            "--db-url",
            f"sqlite:///{db}",
            timeout_s=600,
        )
    finally:
        del os.environ["HOUCHU_TP_OVERSUBSCRIBE"]
    yield srv
    assert stop_server(srv) == 0


def test_golden_tokens_at_tp3(tp_server, reference):
    async def all_keys() -> list[dict]:
        return await asyncio.gather(*(ws_generate(tp_server.ws_url, payload(k)) for k in KEYS))

    for key, got in zip(KEYS, asyncio.run(all_keys()), strict=True):
        assert got["error"] is None, got["error"]
        assert got["token_ids"] == reference[key], key
    assert "tensor parallel: 3 ranks (gloo)" in tp_server.output()


def test_prefix_hit_at_tp3_keeps_golden_tokens(tp_server, reference):
    """chat2 again, after test_golden_tokens_at_tp3 (or a first run here) cached its
    prompt: the repeat reuses the cached pages and still gives transformers' tokens."""
    body = {**payload("chat2"), "max_tokens": 8}
    for _ in range(2):  # the second at the latest is a prefix hit
        got = asyncio.run(ws_generate(tp_server.ws_url, body))
        assert got["error"] is None, got["error"]
        assert got["token_ids"] == reference["chat2"][:8]
    assert got["final"]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 16
    status, stats = asyncio.run(_get_stats(tp_server.url))
    assert status == 200
    assert stats["tp_allreduce_s"] > 0 and 0 < stats["tp_allreduce_share"] < 1


async def _get_stats(url: str) -> tuple[int, dict]:
    import aiohttp

    async with aiohttp.ClientSession() as s, s.get(f"{url}/stats") as r:
        return r.status, await r.json()


def test_tp2_refused_on_smollm2(real_model_path):
    cmd = [sys.executable, "-m", "houchu.cli", "serve", "--model", str(real_model_path)]
    out = subprocess.run(
        [*cmd, "--tensor-parallel-size", "2"], capture_output=True, text=True, timeout=120
    )
    assert out.returncode == 2
    line = out.stderr.strip()
    assert line.count("\n") == 0, line
    assert "attention heads (9), KV heads (3) not divisible by 2" in line and "[3]" in line
