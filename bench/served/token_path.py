"""Where one generated token's time goes, on a served model: the step, the actor hops,
sampling, detokenization and the write, per component (``houchu.api.token_path``).

Starts ``houchu serve`` (the default model, or ``--model``; ``--url`` measures a server
that is already up instead), sends one warm-up request, then ``--num-requests`` greedy
requests one at a time over the WebSocket API (``--output-len`` tokens each,
``ignore_eos``), and prints the server's breakdown of those requests' tokens (``/stats``
``token_path``, the samples after the warm-up's): mean, p50 and p90 milliseconds per
component and its share of the mean inter-token latency, beside what the client measured
(ITL between frames, TPOT, decode tokens/s). Run::

    python -m houchu.bench.served.token_path [--model PATH] [--num-requests 8] [--output-len 128]
        [--serve-flags "--overlap-schedule on"] [--serve-flags ...] [--rounds 1]

Each ``--serve-flags`` starts one server; with several, the rounds take turns between
them (so that a drifting machine load hits each alike) and each gets its own table, then
one line per server with its client-side decode speed.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import shlex
import statistics
import time
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp

from houchu.api.token_path import format_table

#: The prompt of every measured request (a chat turn; its length does not matter here).
STORY_PROMPT = "Write a long story about a lighthouse keeper and the ships she watched."


@dataclass
class ClientTimes:
    """What the client measured, in seconds: the gaps between consecutive frames that
    carry tokens (``itl``), each request's ``(E2E - TTFT) / (tokens - 1)`` (``tpot``)."""

    itl: list[float] = field(default_factory=list)
    tpot: list[float] = field(default_factory=list)
    tokens: int = 0
    decode_s: float = 0.0  # first token to last, summed over requests

    def add(self, stamps: list[float], tokens: int) -> None:
        """One request's frame arrival times (``time.perf_counter()``) and tokens."""
        self.itl += [b - a for a, b in zip(stamps, stamps[1:], strict=False)]
        if tokens > 1 and len(stamps) > 1:
            self.tpot.append((stamps[-1] - stamps[0]) / (tokens - 1))
            self.tokens += tokens - 1
            self.decode_s += stamps[-1] - stamps[0]

    def merge(self, other: ClientTimes) -> None:
        """Add ``other``'s timings to these."""
        self.itl += other.itl
        self.tpot += other.tpot
        self.tokens += other.tokens
        self.decode_s += other.decode_s

    def line(self) -> str:
        """Mean and median ITL and TPOT (ms), and decode tokens/s."""
        if not self.itl or not self.tpot:
            return "client: no tokens"
        ms = 1e3
        return (
            f"client: ITL mean {statistics.fmean(self.itl) * ms:.3f} ms, "
            f"p50 {statistics.median(self.itl) * ms:.3f} ms; TPOT mean "
            f"{statistics.fmean(self.tpot) * ms:.3f} ms, p50 {statistics.median(self.tpot) * ms:.3f}"
            f" ms; decode {self.tokens / self.decode_s:.1f} tokens/s"
        )


async def stream_one(url: str, tokens: int, times: ClientTimes | None) -> None:
    """One greedy request of ``tokens`` tokens over the WebSocket API at ``url``; each
    frame that carries tokens is timed into ``times`` (None: not timed)."""
    msg = {
        "id": "t",
        "messages": [{"role": "user", "content": STORY_PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
        "ignore_eos": True,
    }
    stamps: list[float] = []
    async with aiohttp.ClientSession() as s, s.ws_connect(url) as ws:
        await ws.send_json(msg)
        while True:
            f = await ws.receive_json(timeout=600)
            if f["type"] == "error":
                raise RuntimeError(f["error"])
            if f["type"] == "delta" and f.get("token_ids"):
                stamps.append(time.perf_counter())
            if f["type"] == "final":
                if times is not None:
                    times.add(stamps, f["usage"]["completion_tokens"])
                return


def stats(ws_url: str, since: int = 0) -> dict:
    """The server's ``/stats``, its ``token_path`` over the samples after ``since``."""
    base = ws_url.replace("ws://", "http://").removesuffix("/ws")
    with urllib.request.urlopen(f"{base}/stats?token_path_since={since}", timeout=30) as r:
        return json.load(r)


def measure(url: str, num_requests: int, tokens: int, times: ClientTimes) -> dict:
    """``num_requests`` requests, one at a time, on the server at ``url``; their
    ``token_path`` (``/stats``), the client's timings added to ``times``."""
    since = stats(url)["token_path"]["last_sample"]
    for _ in range(num_requests):
        asyncio.run(stream_one(url, tokens, times))
    return stats(url, since)["token_path"]


def _merge(parts: list[dict]) -> dict:
    """Several rounds' ``token_path`` sections as one: each component's mean weighted
    by its round's samples, p50 / p90 the samples-weighted mean of the rounds'."""
    total = sum(p["samples"] for p in parts)
    if len(parts) == 1 or not total:
        return parts[0]
    comps: dict[str, dict[str, float]] = {}
    for name in parts[0]["components"]:
        comps[name] = {
            k: sum(p["components"][name][k] * p["samples"] for p in parts) / total
            for k in ("mean_ms", "p50_ms", "p90_ms", "share")
        }
    return {"samples": total, "components": comps}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", type=Path, help="GGUF file or model folder (default model)")
    ap.add_argument("--url", help="measure the server at this ws:// URL instead of starting one")
    ap.add_argument("--num-requests", type=int, default=8)
    ap.add_argument("--output-len", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1, help="turns per server")
    ap.add_argument(
        "--serve-flags",
        action="append",
        help="flags of one server to start (repeatable: one server each)",
    )
    args = ap.parse_args()
    if args.output_len < 2 or args.num_requests < 1 or args.rounds < 1:
        ap.error("--output-len must be >= 2, --num-requests and --rounds >= 1")
    if args.url and args.serve_flags:
        ap.error("--url measures one running server: no --serve-flags")
    variants = args.serve_flags or [""]
    with contextlib.ExitStack() as stack:
        if args.url:
            urls = {"(running server)": args.url}
        else:
            from houchu.bench.servers import running_server
            from houchu.model.fetch import fetch_default_model

            model = args.model or fetch_default_model()
            urls = {
                v: stack.enter_context(running_server(model, *shlex.split(v))) for v in variants
            }
        for url in urls.values():
            asyncio.run(stream_one(url, 16, None))  # warm-up, not measured
        parts: dict[str, list[dict]] = {v: [] for v in urls}
        times = {v: ClientTimes() for v in urls}
        for r in range(args.rounds):
            for v, url in urls.items():
                this = ClientTimes()
                parts[v].append(measure(url, args.num_requests, args.output_len, this))
                times[v].merge(this)
                print(f"round {r + 1} [{v or 'defaults'}]: {this.line()}", flush=True)
    for v in urls:
        tp = _merge(parts[v])
        print(
            f"\n== {v or 'defaults'}: {tp['samples']} tokens, {args.rounds} x "
            f"{args.num_requests} requests of {args.output_len} tokens, one at a time"
        )
        print(format_table(tp["components"]))
        print(f"all rounds, {times[v].line()}")


if __name__ == "__main__":
    main()
