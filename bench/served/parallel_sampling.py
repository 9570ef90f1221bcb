"""Parallel sampling benchmark: one request for ``n`` choices of a long prompt, with the
prompt prefilled once (radix cache on: the choices share its pages) vs once per choice
(``--disable-radix-cache``).

One WebSocket request with ``--n`` choices (default 8) of a ~1,000-token prompt, 16
tokens each; printed: the time to the first token of any choice and of the last choice
to start, the total time, the tokens the engine computed (``/stats``:
``tokens_per_forward * forward_passes``) and the prompt tokens the choices shared
(``parallel_sampling_tokens_shared``). Servers run with ``--compile off`` (start-up in
seconds; the decode step's compilation is not what this measures).

Run::

    python -m houchu.bench.served.parallel_sampling [--model PATH] [--n 8]
"""

from __future__ import annotations

import argparse
import asyncio
import time
from pathlib import Path

import aiohttp

from houchu.bench.served.levers import SYSTEM_SENTENCE
from houchu.bench.servers import running_server


async def _stats(ws_url: str) -> dict:
    url = ws_url.replace("ws://", "http://").removesuffix("/ws") + "/stats"
    async with aiohttp.ClientSession() as s, s.get(url) as r:
        return await r.json()


def _computed(stats: dict) -> float:
    return stats["tokens_per_forward"] * stats["forward_passes"]


async def one_request(ws_url: str, n: int) -> dict[str, float]:
    """Send the request and time it; the counters' change over it."""
    body = {
        "id": "p",
        "prompt": SYSTEM_SENTENCE * 38,  # ~1,000 tokens
        "max_tokens": 16,
        "ignore_eos": True,
        "temperature": 1.0,
        "seed": 1,
        "n": n,
    }
    async with aiohttp.ClientSession() as s, s.ws_connect(ws_url, max_msg_size=0) as ws:
        await ws.send_json({"id": "w", "prompt": "warm up", "max_tokens": 2})
        while (await ws.receive_json(timeout=900))["type"] != "final":
            pass
        before = await _stats(ws_url)
        t0 = time.perf_counter()
        await ws.send_json(body)
        first: dict[int, float] = {}
        while True:
            f = await ws.receive_json(timeout=900)
            if f["type"] == "error":
                raise RuntimeError(f["error"])
            if f["type"] == "delta":
                first.setdefault(f.get("index", 0), time.perf_counter() - t0)
            if f["type"] == "final":
                total = time.perf_counter() - t0
                break
    after = await _stats(ws_url)
    return {
        "ttft_first_s": min(first.values()),
        "ttft_last_s": max(first.values()),
        "total_s": total,
        "tokens_computed": _computed(after) - _computed(before),
        "tokens_shared": after["parallel_sampling_tokens_shared"]
        - before["parallel_sampling_tokens_shared"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--n", type=int, default=8)
    args = ap.parse_args()
    from houchu.model.fetch import fetch_default_model

    model = args.model or fetch_default_model()
    rows = []
    for label, flags in [
        ("prefilled once", []),
        ("once per choice", ["--disable-radix-cache"]),
    ]:
        with running_server(model, "--compile", "off", *flags) as ws_url:
            rows.append((label, asyncio.run(one_request(ws_url, args.n))))
    print(f"\nn={args.n} choices of a ~1,000-token prompt, 16 tokens each")
    head = ("TTFT first s", "TTFT last s", "total s", "tokens computed", "tokens shared")
    print(f"{'':<17}" + "".join(f"{h:>16}" for h in head))
    for label, r in rows:
        vals = (r["ttft_first_s"], r["ttft_last_s"], r["total_s"])
        print(
            f"{label:<17}"
            + "".join(f"{v:>16.3f}" for v in vals)
            + f"{r['tokens_computed']:>16.0f}{r['tokens_shared']:>16.0f}"
        )
    once, each = rows[0][1], rows[1][1]
    print(
        f"{'per choice / once':<17}{each['ttft_first_s'] / once['ttft_first_s']:>15.2f}x"
        f"{each['ttft_last_s'] / once['ttft_last_s']:>15.2f}x"
        f"{each['total_s'] / once['total_s']:>15.2f}x"
        f"{each['tokens_computed'] / once['tokens_computed']:>15.2f}x"
    )


if __name__ == "__main__":
    main()
