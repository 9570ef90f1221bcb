"""Overlap scheduler benchmark: decode tokens/s through the API with overlap on vs off.

Starts two servers on the same model and flags, ``--overlap-schedule on`` and ``off``,
then takes turns between them for ``--rounds`` rounds (so a drifting machine load hits
both alike): one greedy stream of ``--tokens`` tokens (decode tokens/s from its first to
its last token), then ``--concurrency`` streams at once (output tokens/s over the wall
time). Prints the medians, and the overlap server's scheduler seconds and how many of
them ran hidden behind the runner's steps (``/stats``). Run::

    python -m houchu.bench.served.overlap [--model PATH] [--tokens 128] [--concurrency 8]
        [--rounds 3] [--serve-flags "--compile off"]

By default both servers decode eagerly (``--compile off``), so that they run the same
step and differ only in scheduling; pass other ``--serve-flags`` to compare otherwise.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import shlex
import statistics
import time
from pathlib import Path

import aiohttp

from houchu.bench.served.quick import PROMPTS, _stream
from houchu.bench.servers import running_server


async def _round(url: str, n: int, conc: int) -> tuple[float, float]:
    """(single-stream decode tokens/s, ``conc``-concurrent output tokens/s)."""
    tok, _, first, last = await _stream(url, PROMPTS[0], n)
    single = (tok - 1) / max(last - first, 1e-9)
    t = time.perf_counter()
    res = await asyncio.gather(*(_stream(url, PROMPTS[i % len(PROMPTS)], n) for i in range(conc)))
    return single, sum(r[0] for r in res) / (time.perf_counter() - t)


async def _stats(ws_url: str) -> dict:
    base = ws_url.replace("ws://", "http://").removesuffix("/ws")
    async with aiohttp.ClientSession() as s, s.get(f"{base}/stats") as r:
        return await r.json()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path)
    ap.add_argument("--tokens", type=int, default=128)
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--serve-flags", default="--compile off", help="flags of both servers")
    args = ap.parse_args()
    if args.tokens < 2 or args.concurrency < 1 or args.rounds < 1:
        ap.error("--tokens must be >= 2, --concurrency and --rounds >= 1")
    from houchu.model.fetch import fetch_default_model

    model = args.model or fetch_default_model()
    flags = shlex.split(args.serve_flags)
    modes = {"on": ["--overlap-schedule", "on"], "off": ["--overlap-schedule", "off"]}
    rows: dict[str, list[tuple[float, float]]] = {m: [] for m in modes}
    with contextlib.ExitStack() as stack:
        urls = {m: stack.enter_context(running_server(model, *flags, *f)) for m, f in modes.items()}
        for url in urls.values():
            asyncio.run(_stream(url, "Warm up.", 8))
        for r in range(args.rounds):
            for m, url in urls.items():
                rows[m].append(asyncio.run(_round(url, args.tokens, args.concurrency)))
                print(
                    f"round {r + 1} overlap {m}: {rows[m][-1][0]:.1f} / {rows[m][-1][1]:.1f} tok/s"
                )
        st = asyncio.run(_stats(urls["on"]))
    med = {m: [statistics.median(x[i] for x in v) for i in (0, 1)] for m, v in rows.items()}
    print(f"\nmedian of {args.rounds} rounds, {args.tokens} tokens per stream, flags {flags}")
    print(f"{'decode tokens/s':<28}{'overlap on':>12}{'overlap off':>13}{'on / off':>10}")
    labels = ("single stream", f"{args.concurrency} concurrent (output)")
    for i, label in enumerate(labels):
        on, off = med["on"][i], med["off"][i]
        print(f"{label:<28}{on:>12.1f}{off:>13.1f}{on / off:>9.3f}x")
    print(
        f"overlap server: scheduler work {st['overlap_scheduler_s']:.2f} s, hidden "
        f"{st['overlap_hidden_s']:.2f} s ({st['overlap_hidden_fraction']:.0%}), "
        f"{st['overlap_steps_ahead']} of {st['num_steps']} steps planned ahead, "
        f"{st['overlap_discarded_tokens']} tokens discarded"
    )


if __name__ == "__main__":
    main()
