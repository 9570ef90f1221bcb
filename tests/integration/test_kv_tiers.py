"""KV tiers end to end: prefixes pushed to host memory and SSD come back with the same
greedy tokens; the SSD tier survives a restart; corrupt files and a dead tier manager
only cost a recompute."""

from __future__ import annotations

import asyncio
import os
import re
import signal

import pytest

from tests.support.client import get_json, ws_generate
from tests.support.server import start_server, stop_server

pytestmark = pytest.mark.slow

SSD_MB = 64


def _prompt(tag: str) -> str:
    return f"Document {tag}: " + " ".join(f"{tag}{i} alpha beta gamma" for i in range(60))


def _flags(cache_dir) -> list[str]:
    # 40 device pages (640 tokens) hold one ~350-token prompt at a time; 64 host pages
    # hold about three; the rest spills to SSD.
    return [
        "--num-pages",
        "40",
        "--host-kv-pages",
        "64",
        "--ssd-kv-mb",
        str(SSD_MB),
        "--kv-cache-dir",
        str(cache_dir),
    ]


def _ask(srv, tag: str) -> dict:
    body = {"prompt": _prompt(tag), "max_tokens": 8, "temperature": 0, "ignore_eos": True}
    got = asyncio.run(asyncio.wait_for(ws_generate(srv.ws_url, body), 120))
    assert got["error"] is None, got["error"]
    return got


def _stats(srv) -> dict:
    return asyncio.run(get_json(f"{srv.url}/stats"))[1]


@pytest.fixture(scope="module")
def cold(server) -> dict[str, list[int]]:
    """Greedy tokens of each prompt on the shared server (no tiers), each computed
    afresh: the prompts share no page, and the server had not seen them (checked)."""
    out = {}
    for t in "ABCDE":
        got = _ask(server, t)
        assert got["final"]["usage"]["prompt_tokens_details"]["cached_tokens"] == 0, t
        out[t] = got["token_ids"]
    return out


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    return tmp_path_factory.mktemp("kv")


def test_prefix_pushed_to_host_and_ssd_reloads(real_model_path, cold, cache):
    srv = start_server(real_model_path, *_flags(cache))
    try:
        for t in "ABCD":
            assert _ask(srv, t)["token_ids"] == cold[t]
        again = _ask(srv, "A")  # A was pushed off the device by B, C, D
        assert again["token_ids"] == cold["A"]
        assert again["final"]["usage"]["prompt_tokens_details"]["cached_tokens"] >= 320
        s = _stats(srv)
        assert s["tier_tokens_loaded_host"] > 0 and s["tier_tokens_loaded_ssd"] > 0, s
        assert s["host_pages_stored"] <= s["host_pages_total"]
        assert s["ssd_bytes"] <= SSD_MB << 20
    finally:
        assert stop_server(srv) == 0  # the host tier is flushed to SSD on the way out
    files = list(cache.rglob("*.page"))
    assert files and sum(f.stat().st_size for f in files) <= SSD_MB << 20


def test_ssd_tier_survives_a_restart(real_model_path, cold, cache):
    srv = start_server(real_model_path, *_flags(cache))  # same cache directory
    try:
        got = _ask(srv, "C")
        assert got["token_ids"] == cold["C"]
        s = _stats(srv)
        assert s["tier_tokens_loaded_ssd"] >= 320 and s["ssd_hits"] > 0, s
    finally:
        stop_server(srv)


def test_corrupt_files_and_a_dead_tier_manager_only_cost_a_recompute(real_model_path, cold, cache):
    for i, f in enumerate(sorted(cache.rglob("*.page"))):  # damage every page file
        data = bytearray(f.read_bytes())
        if i % 2:
            f.write_bytes(data[: len(data) // 2])
        else:
            data[-1] ^= 0xFF
            f.write_bytes(data)
    srv = start_server(real_model_path, *_flags(cache))
    try:
        assert _ask(srv, "B")["token_ids"] == cold["B"]
        s = _stats(srv)
        assert s["ssd_corrupt"] > 0 and s["tier_tokens_loaded_ssd"] == 0, s
        # the tier manager dies: requests recompute (after the lookup timeout), never hang
        pid = int(re.search(r"kv_tiers ready \(pid (\d+)\)", srv.output()).group(1))
        os.kill(pid, signal.SIGKILL)
        for t in "DAE":
            assert _ask(srv, t)["token_ids"] == cold[t]
        assert "kv_tiers died" in srv.output()
    finally:
        stop_server(srv)
