"""Data-parallel benchmark: the shared-prefix workload of ``houchu bench`` against
``houchu serve --data-parallel-size 2`` behind smg with ``cache_aware`` and with
``round_robin``, and against one engine with all the cores.

Each setting gets a fresh server (cold caches) on the same ``--threads`` and the same
request sequence (``--seed``); prints per setting the prefix hit rate (prompt tokens
reported as ``cached_tokens`` / prompt tokens), TTFT p50/p90 and output tokens/s.

Run::

    python -m houchu.bench.served.replicas [--model PATH] [--threads 2] [--num-requests 48]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from houchu.bench.servers import running_server
from houchu.model.fetch import fetch_default_model

SETTINGS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("dp=2 cache_aware", ("--data-parallel-size", "2", "--router-policy", "cache_aware")),
    ("dp=2 round_robin", ("--data-parallel-size", "2", "--router-policy", "round_robin")),
    ("dp=1 (one engine)", ()),
)


def run_workload(base_url: str, args: argparse.Namespace) -> dict[str, Any]:
    """``houchu bench`` shared-prefix against ``base_url``; its ``results``."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "run.json"
        cmd = [
            sys.executable, "-m", "houchu.cli", "bench",
            "--backend", "openai", "--base-url", f"{base_url}/v1", "--api", "chat",
            "--workload", "shared-prefix",
            "--num-prefixes", str(args.num_prefixes), "--prefix-len", str(args.prefix_len),
            "--input-len", "32", "--output-len", str(args.output_len),
            "--num-requests", str(args.num_requests), "--concurrency", str(args.concurrency),
            "--seed", "1", "--output", str(out), "--no-db", "--no-progress",
        ]  # fmt: skip
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        return json.loads(out.read_text())["results"]


def row(name: str, r: dict[str, Any]) -> str:
    hit = r["cached_tokens"] / max(1, r["total_input_tokens"])
    return (
        f"| {name} | {r['completed']}/{r['completed'] + r['failed']} | {100 * hit:.1f} % | "
        f"{r['median_ttft_ms']:.0f} | {r['p90_ttft_ms']:.0f} | {r['output_throughput']:.1f} |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=None, help="default: the default model")
    p.add_argument("--threads", type=int, default=os.cpu_count() or 2)
    p.add_argument("--num-requests", type=int, default=48)
    p.add_argument("--concurrency", type=int, default=4)
    p.add_argument("--num-prefixes", type=int, default=4)
    p.add_argument("--prefix-len", type=int, default=384)
    p.add_argument("--output-len", type=int, default=16)
    p.add_argument("--kv-cache-mb", default="256", help="each engine's KV pool, MiB")
    p.add_argument("--no-single", action="store_true", help="skip the one-engine run")
    args = p.parse_args(argv)
    model = args.model or str(fetch_default_model())
    flags = (
        "--threads",
        str(args.threads),
        "--kv-cache-mb",
        args.kv_cache_mb,
        "--disable-telemetry",
    )
    print(
        f"shared-prefix: {args.num_prefixes} system prompts x {args.prefix_len} tokens, "
        f"{args.num_requests} requests, concurrency {args.concurrency}, "
        f"{args.output_len} output tokens, --threads {args.threads} in all, "
        f"--kv-cache-mb {args.kv_cache_mb} per engine"
    )
    print("| setting | ok | prefix hit rate | TTFT p50 ms | TTFT p90 ms | output tok/s |")
    print("|---|---|---|---|---|---|")
    for name, extra in SETTINGS[:2] if args.no_single else SETTINGS:
        with running_server(model, *flags, *extra) as ws_url:
            base = ws_url.removeprefix("ws://").removesuffix("/ws")
            print(row(name, run_workload(f"http://{base}", args)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
