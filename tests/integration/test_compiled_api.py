"""Compiled decode step vs eager: identical greedy tokens through the WebSocket API from two
fresh servers side by side, with three requests decoding together (buckets 2 and 4: one
or three rows are padded, two fit; Inductor compiles each bucket, about a minute on a
cold AVX2 cache), on the exact path and on serve's defaults; and the quantized formats
serve end to end."""

from __future__ import annotations

import asyncio
import re

import pytest

from tests.support.client import post_json, ws_generate
from tests.support.server import Server, start_server, stop_server

pytestmark = pytest.mark.slow

PROMPTS = [
    "The capital of France is",
    "def fibonacci(n):\n    ",
    "Once upon a time, in a small village,",
]


async def _all(url: str) -> list[list[int]]:
    reqs = [
        ws_generate(url, {"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True})
        for p in PROMPTS
    ]
    out = await asyncio.gather(*reqs)
    assert all(o["error"] is None for o in out), out
    return [o["token_ids"] for o in out]


def _serve_tokens(model, *flags: str, **kw: bool) -> tuple[list[list[int]], str]:
    """One fresh server's greedy tokens for ``PROMPTS`` and its log."""
    srv = start_server(model, "--kv-cache-mb", "64", *flags, **kw)
    try:
        return asyncio.run(_all(srv.ws_url)), srv.output()
    finally:
        stop_server(srv)


async def _report(srv: Server, prompt: str, tokens: list[int]) -> tuple[int, list[dict]]:
    """The prompt's token count and the top-5 logprobs of each of ``tokens``' positions,
    greedy, from ``srv``: what a mismatch report shows of each server."""
    body = {"prompt": prompt, "max_tokens": len(tokens), "temperature": 0, "logprobs": 5}
    status, reply = await post_json(f"{srv.url}/v1/completions", {**body, "ignore_eos": True})
    assert status == 200, reply
    return reply["usage"]["prompt_tokens"], reply["choices"][0]["logprobs"]["top_logprobs"]


def _mismatch(servers: dict[str, Server], tokens: dict[str, list[list[int]]]) -> str:
    """Where two servers' greedy tokens part, with each one's prompt token count and top
    logprobs there (a near-tie, or one side's arithmetic or prompt)."""
    (a, ta), (b, tb) = tokens.items()
    lines = []
    for i, (x, y) in enumerate(zip(ta, tb, strict=True)):
        if x == y:
            continue
        k = next(j for j, (u, v) in enumerate(zip(x, y, strict=True)) if u != v)
        lines.append(f"prompt {i} {PROMPTS[i]!r}, token {k}: {a} {x[: k + 2]}, {b} {y[: k + 2]}")
        for name, srv in servers.items():
            n, top = asyncio.run(_report(srv, PROMPTS[i], tokens[name][i][: k + 1]))
            lines.append(f"  {name}: {n} prompt tokens; top logprobs at token {k}: {top[k]}")
    return "\n".join(lines)


def _side_by_side(model, a: tuple[str, ...], b: tuple[str, ...], **kw: bool) -> tuple[str, str]:
    """Serve the same requests from two fresh servers, one with flags ``a`` and one with
    ``b`` (on top of the same others); fails with ``_mismatch``'s report unless their
    greedy tokens are equal. Returns the two servers' logs."""
    names = [" ".join(flags) or "serve's defaults" for flags in (a, b)]
    servers = {
        names[0]: start_server(model, "--kv-cache-mb", "64", *a, **kw),
        names[1]: start_server(model, "--kv-cache-mb", "64", *b, **kw),
    }
    try:
        tokens = {name: asyncio.run(_all(srv.ws_url)) for name, srv in servers.items()}
        if tokens[names[0]] != tokens[names[1]]:
            pytest.fail(_mismatch(servers, tokens))
        return servers[names[0]].output(), servers[names[1]].output()
    finally:
        for srv in servers.values():
            stop_server(srv)


def test_compiled_equals_eager_through_api(real_model_path):
    """The exact path with the compiled decode step and without, in two fresh servers of
    otherwise the same flags: the same greedy tokens."""
    buckets = ("--decode-batch-sizes", "2,4")
    log, eager_log = _side_by_side(
        real_model_path, ("--compile", "on", *buckets), ("--compile", "off", *buckets)
    )
    assert "compiled_decode in" in log and "not faster" not in log
    assert "compiled_decode" not in eager_log


def test_serve_defaults_quantize_and_compile_only_where_it_pays(real_model_path):
    """serve's defaults: the Q4_1 GGUF's projections stay int4 (quantization auto), and
    the decode step is compiled only where the measured route does not run the fused C++
    layers at batch 1 (then it is measured, and kept where faster). Where auto compiled
    it, the tokens equal those of a server of the same route without it.

    Where auto skipped compiling, that server would run the same eager code: nothing to
    compare. The comparison sends the prompts one at a time: which kernels a step takes
    depends on its row count (the route's buckets), and some of them quantize the
    activations to int8 (``fused-a8``, ``gemv-a8``), so concurrent requests batched
    differently by the two servers would meet different arithmetic. The eager server
    reads the route from the decision cache where the first one could store it (its
    measurement was not contended); one measured anew may pick other paths, and the
    test says so rather than compare them. (How close int4 stays to the exact path is
    test_quant_quality's.)"""
    first = start_server(real_model_path, "--kv-cache-mb", "64", compile=True, exact=False)
    try:
        log = first.output()
        fused = re.search(r"decode paths b<=1 (fused|fused-a8) ", log)
        skipped = "--compile auto skipped: the decode route runs the fused" in log
        assert "weights int4-g32" in log and (skipped if fused else "compiled_decode in" in log)
        tokens = asyncio.run(_one_by_one(first.ws_url))
        assert all(len(t) == 24 for t in tokens)
        if skipped or "not faster" in log:
            return
        eager = start_server(
            real_model_path, "--kv-cache-mb", "64", "--compile", "off", exact=False
        )
        try:
            routes = [_route(srv.output()) for srv in (first, eager)]
            assert routes[0] == routes[1], f"the two servers measured different routes: {routes}"
            servers = {"serve's defaults": first, "--compile off": eager}
            got = {
                "serve's defaults": tokens,
                "--compile off": asyncio.run(_one_by_one(eager.ws_url)),
            }
            if got["serve's defaults"] != got["--compile off"]:
                pytest.fail(_mismatch(servers, got))
        finally:
            stop_server(eager)
    finally:
        stop_server(first)


async def _one_by_one(url: str) -> list[list[int]]:
    """``PROMPTS``' greedy tokens, one request at a time."""
    out = []
    for p in PROMPTS:
        body = {"prompt": p, "max_tokens": 24, "temperature": 0, "ignore_eos": True}
        got = await ws_generate(url, body)
        assert got["error"] is None, got
        out.append(got["token_ids"])
    return out


def _route(log: str) -> list[tuple[str, str]]:
    """The path each bucket and prefill took, from the runner's startup line."""
    line = re.search(r"decode paths (.*)", log)
    assert line, log
    return re.findall(r"(b<=\d+|prefill) ([\w-]+)", line.group(1))


@pytest.mark.parametrize("flags", [("--quantization", "int4", "--kv-cache-dtype", "int8")])
def test_quantized_server_answers(real_model_path, flags):
    tokens, log = _serve_tokens(real_model_path, "--dtype", "bfloat16", "--compile", "off", *flags)
    assert "weights int4-g32" in log and "KV int8" in log
    assert all(len(t) == 24 for t in tokens)
