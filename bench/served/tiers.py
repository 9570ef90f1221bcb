"""KV tier benchmark: where a cached prefix lives, and what that does to TTFT.

1. TTFT of a request whose ~2,000-token prefix is (a) not cached, (b) on the device,
   (c) in host memory, (d) on SSD (after a restart, from the page files).
2. Multi-turn chat whose history outgrows the device pool: conversations take turns,
   each turn resending its history; throughput and TTFT p50/p90 with tiers on vs off.

Run::

    python -m houchu.bench.served.tiers [--model PATH]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
import urllib.request
from pathlib import Path

from houchu.bench.served.levers import _one, _pct
from houchu.bench.servers import running_server

DEVICE = ["--num-pages", "160"]  # 2,560 tokens: one long prefix at a time


def _prefix(tag: str) -> str:
    return f"Record {tag}. " + " ".join(
        f"{tag}-{i} lorem ipsum dolor" for i in range(170)
    )  # ~2,000 tokens


def _stats(ws_url: str) -> dict:
    http = ws_url.replace("ws://", "http://").rsplit("/", 1)[0]
    return json.load(urllib.request.urlopen(f"{http}/stats"))


async def _ttft(url: str, tag: str) -> float:
    return (await _one(url, {"prompt": _prefix(tag), "max_tokens": 1, "temperature": 0}))[0]


async def where_it_lives(url: str) -> dict[str, float]:
    out = {"not cached": await _ttft(url, "P")}
    out["device"] = await _ttft(url, "P")
    for t in "QR":  # push P off the device into host memory
        await _ttft(url, t)
    out["host memory"] = await _ttft(url, "P")
    s = _stats(url)
    out["_host_tokens"] = s.get("tier_tokens_loaded_host", 0)
    return out


async def multi_turn(url: str, conversations: int = 6, turns: int = 4) -> dict[str, float]:
    histories = [_prefix(f"C{i}")[:2500] for i in range(conversations)]
    ttfts, tokens = [], 0
    t0 = time.perf_counter()
    for turn in range(turns):
        for i in range(conversations):
            histories[i] += f"\nUser: question {turn}?\nAssistant:"
            body = {"prompt": histories[i], "max_tokens": 16, "temperature": 0}
            ttft, _ = await _one(url, body)
            ttfts.append(ttft)
            tokens += 16
            histories[i] += " answer."
    wall = time.perf_counter() - t0
    return {"out_tok_s": tokens / wall, "ttft_p50": _pct(ttfts, 0.5), "ttft_p90": _pct(ttfts, 0.9)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    args = ap.parse_args()
    from houchu.model.fetch import fetch_default_model

    model = args.model or fetch_default_model()
    with tempfile.TemporaryDirectory(prefix="houchu-kvbench-") as d:
        tiers = [*DEVICE, "--host-kv-pages", "512", "--ssd-kv-mb", "1024", "--kv-cache-dir", d]
        with running_server(model, *tiers) as url:
            res = asyncio.run(where_it_lives(url))
        with running_server(model, *tiers) as url:  # restart: P is only on SSD now
            res["SSD"] = asyncio.run(_ttft(url, "P"))
            res["_ssd_tokens"] = _stats(url).get("tier_tokens_loaded_ssd", 0)
    print("\nTTFT of a ~2,000-token prefix, by where its KV lives")
    for k in ("not cached", "device", "host memory", "SSD"):
        print(f"  {k:<12}{res[k]:>8.3f} s   ({res['not cached'] / res[k]:.1f}x faster than cold)")
    print(f"  (tokens loaded from host: {res['_host_tokens']}, from SSD: {res['_ssd_tokens']})")

    rows = []
    with tempfile.TemporaryDirectory(prefix="houchu-kvbench-") as d:
        for label, flags in [
            (
                "tiers on",
                [*DEVICE, "--host-kv-pages", "512", "--ssd-kv-mb", "1024", "--kv-cache-dir", d],
            ),
            ("tiers off", DEVICE),
        ]:
            with running_server(model, *flags) as url:
                rows.append((label, asyncio.run(multi_turn(url))))
    print("\nMulti-turn chat, history beyond the device pool (6 conversations x 4 turns)")
    print(f"  {'':<10}{'out tok/s':>10}{'TTFT p50':>10}{'TTFT p90':>10}")
    for label, r in rows:
        print(f"  {label:<10}{r['out_tok_s']:>10.1f}{r['ttft_p50']:>10.3f}{r['ttft_p90']:>10.3f}")


if __name__ == "__main__":
    main()
