"""Scheduler lever benchmark: radix prefix cache on/off, chunked prefill on/off.

Two experiments, each run against fresh servers started here, one after the other:

1. Shared prefix: ``--requests`` requests (default 32) sharing a ~1,000-token system
   prompt, each with its own question, sent at once; TTFT p50/p90 and total time with the
   radix cache on vs off.
2. Long prompt arrival: 8 streams decoding; a ~2,000-token prompt arrives; the longest
   inter-token gap of the 8 streams, chunked prefill on (512-token chunks) vs off.

Run::

    python -m houchu.bench.served.levers [--model PATH] [--requests 32]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import aiohttp

from houchu.bench.servers import running_server

SYSTEM_SENTENCE = (
    "The museum's archive holds letters, maps, photographs and field notes collected by "
    "explorers over two centuries, each catalogued by date, place and author. "
)


async def _one(url: str, body: dict, stamps: list[float] | None = None) -> tuple[float, float]:
    """Run one request over the WebSocket; returns (TTFT s, E2E s). Appends each delta's
    arrival time (perf_counter seconds) to ``stamps`` when given."""
    async with aiohttp.ClientSession() as s, s.ws_connect(url, max_msg_size=0) as ws:
        t0 = time.perf_counter()
        await ws.send_json({"id": "x", **body})
        ttft = None
        while True:
            f = await ws.receive_json(timeout=900)
            now = time.perf_counter()
            if f["type"] == "error":
                raise RuntimeError(f["error"])
            if f["type"] == "delta":
                ttft = ttft if ttft is not None else now - t0
                if stamps is not None:
                    stamps.append(now)
            if f["type"] == "final":
                return (ttft if ttft is not None else now - t0), now - t0


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))]


async def shared_prefix(url: str, n: int) -> dict[str, float]:
    system = SYSTEM_SENTENCE * 38  # ~1,000 tokens
    bodies = [
        {
            "messages": [
                {"role": "system", "content": system},
                {"role": "user", "content": f"Question {i}: what is item {i * 7} about?"},
            ],
            "max_tokens": 8,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(n)
    ]
    await _one(url, {"prompt": "warm up", "max_tokens": 2})
    t = time.perf_counter()
    res = await asyncio.gather(*(_one(url, b) for b in bodies))
    total = time.perf_counter() - t
    ttfts = [r[0] for r in res]
    return {"ttft_p50": _pct(ttfts, 0.5), "ttft_p90": _pct(ttfts, 0.9), "total_s": total}


async def long_prompt_arrival(url: str) -> dict[str, float]:
    streams = [
        {
            "prompt": f"Story {i}: once upon a time",
            "max_tokens": 120,
            "temperature": 0,
            "ignore_eos": True,
        }
        for i in range(8)
    ]
    long_body = {"prompt": SYSTEM_SENTENCE * 75, "max_tokens": 4, "temperature": 0}
    stamps: list[list[float]] = [[] for _ in streams]
    tasks = [asyncio.create_task(_one(url, b, stamps[i])) for i, b in enumerate(streams)]
    while min(len(s) for s in stamps) < 10:  # all 8 streams decoding
        await asyncio.sleep(0.05)
    arrive = time.perf_counter()
    ttft_long, _ = await _one(url, long_body)
    await asyncio.gather(*tasks)
    gaps = [b - a for s in stamps for a, b in zip(s, s[1:], strict=False) if b >= arrive]
    return {"max_itl_s": max(gaps), "long_prompt_ttft_s": ttft_long}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--requests", type=int, default=32)
    args = ap.parse_args()
    from houchu.model.fetch import fetch_default_model

    model = args.model or fetch_default_model()
    rows = []
    for label, flags in [("radix cache on", []), ("radix cache off", ["--disable-radix-cache"])]:
        with running_server(model, *flags) as ws_url:
            r = asyncio.run(shared_prefix(ws_url, args.requests))
        rows.append((label, r))
    print(f"\nShared prefix: {args.requests} requests, ~1,000-token system prompt")
    print(f"{'':<18}{'TTFT p50 s':>12}{'TTFT p90 s':>12}{'total s':>10}")
    for label, r in rows:
        print(f"{label:<18}{r['ttft_p50']:>12.3f}{r['ttft_p90']:>12.3f}{r['total_s']:>10.2f}")
    on, off = rows[0][1], rows[1][1]
    print(
        f"{'off / on':<18}{off['ttft_p50'] / on['ttft_p50']:>11.2f}x"
        f"{off['ttft_p90'] / on['ttft_p90']:>11.2f}x{off['total_s'] / on['total_s']:>9.2f}x"
    )

    rows = []
    for label, flags in [
        ("chunked 512", ["--chunked-prefill-size", "512", "--max-batch-tokens", "512"]),
        ("not chunked", ["--chunked-prefill-size", "0", "--max-batch-tokens", "4096"]),
    ]:
        with running_server(model, "--disable-radix-cache", *flags) as ws_url:
            r = asyncio.run(long_prompt_arrival(ws_url))
        rows.append((label, r))
    print("\nLong prompt (~2,000 tokens) arriving among 8 decoding streams")
    print(f"{'':<18}{'max ITL s':>12}{'long TTFT s':>12}")
    for label, r in rows:
        print(f"{label:<18}{r['max_itl_s']:>12.3f}{r['long_prompt_ttft_s']:>12.3f}")
    print(f"{'off / on':<18}{rows[1][1]['max_itl_s'] / rows[0][1]['max_itl_s']:>11.2f}x")


if __name__ == "__main__":
    main()
