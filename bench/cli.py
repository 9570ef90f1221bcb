"""``houchu bench``: the load generator's command line.

Examples::

    houchu bench --backend houchu-ws --url ws://127.0.0.1:8000/ws \\
        --workload random --num-requests 64 --concurrency 16 --input-len 128 --output-len 128
    houchu bench --backend openai --base-url http://127.0.0.1:8080/v1 --api chat \\
        --workload shared-prefix --num-prefixes 4 --prefix-len 512 --request-rate 2
    houchu bench --workload replay --replay prompts.jsonl --goodput ttft:500 tpot:100

Prints a summary table, writes the full record as JSON (``--output``) and stores it in
the database (``--db``; skipped with ``--no-db``).
"""

from __future__ import annotations

import argparse
import asyncio
import datetime as dt
import sys
from pathlib import Path
from typing import Any

from houchu.bench.backends.base import BACKENDS
from houchu.bench.workloads import WORKLOADS


def add_workload_args(p: argparse.ArgumentParser) -> None:
    """Options that define the workload, arrival and request settings."""
    w = p.add_argument_group("workload")
    w.add_argument("--workload", choices=WORKLOADS, default="random")
    w.add_argument(
        "--num-requests", type=int, default=32, help="requests measured (turns count one each)"
    )
    w.add_argument(
        "--input-len", default="128", help="tokens: N, uniform:LO:HI, normal:MEAN:STD or exp:MEAN"
    )
    w.add_argument("--output-len", default="128", help="output tokens asked for, same forms")
    w.add_argument("--num-prefixes", type=int, default=4, help="shared-prefix: system prompts")
    w.add_argument(
        "--prefix-len", type=int, default=512, help="shared-prefix: system prompt tokens"
    )
    w.add_argument("--turns", type=int, default=4, help="multi-turn: turns per conversation")
    w.add_argument("--long-len", type=int, default=1024, help="long-prompt: long prompt tokens")
    w.add_argument(
        "--long-every", type=int, default=8, help="long-prompt: every K-th request is long"
    )
    w.add_argument(
        "--long-output", type=int, default=16, help="long-prompt: output tokens of long ones"
    )
    w.add_argument("--replay", help="replay: JSONL file of requests")
    w.add_argument(
        "--tokenizer",
        help="tokenizer for exact prompt lengths: .gguf, HF folder or 'none' (default: the default model's, if fetched)",
    )
    a = p.add_argument_group("arrival and limits")
    a.add_argument(
        "--concurrency",
        type=int,
        help="most sessions in flight (default 1; no cap with --request-rate)",
    )
    a.add_argument("--request-rate", type=float, help="Poisson arrivals, sessions per second")
    a.add_argument(
        "--max-duration", type=float, help="seconds; then stop and cancel what is in flight"
    )
    a.add_argument("--request-timeout", type=float, default=300.0, help="seconds per request")
    a.add_argument("--warmup", type=int, default=1, help="warm-up requests, not measured")
    a.add_argument("--seed", type=int, default=0)
    r = p.add_argument_group("requests")
    r.add_argument("--api", choices=("completions", "chat"), default="completions")
    r.add_argument("--temperature", type=float, default=0.0)
    r.add_argument("--no-ignore-eos", action="store_true", help="let requests end at EOS")
    r.add_argument(
        "--structured",
        choices=("none", "json-schema"),
        default="none",
        help="json-schema: every request's output follows a JSON schema (an array of "
        "records: the grammar stays active for the whole output), as response_format",
    )
    r.add_argument(
        "--goodput",
        nargs="+",
        default=[],
        metavar="METRIC:MS",
        help="objectives, e.g. ttft:500 tpot:50",
    )


def add_bench_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``houchu bench``."""
    p = sub.add_parser(
        "bench",
        help="load-generate against houchu or an OpenAI-compatible server",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    t = p.add_argument_group("target")
    t.add_argument("--backend", choices=BACKENDS, default="houchu-ws")
    t.add_argument("--url", default="ws://127.0.0.1:8000/ws", help="houchu-ws: socket URL")
    t.add_argument(
        "--ws-connections", type=int, default=4, help="houchu-ws: sockets to spread requests over"
    )
    t.add_argument("--base-url", default="http://127.0.0.1:8000/v1", help="openai: API root")
    t.add_argument("--model", help="openai: the model field (default: first of /v1/models)")
    t.add_argument("--api-key", help="openai: bearer token")
    t.add_argument(
        "--no-usage", action="store_true", help="openai: do not ask for stream usage; count chunks"
    )
    t.add_argument("--hf-model", help="hf: .gguf or model folder (default: the default model)")
    t.add_argument("--hf-max-batch", type=int, default=16, help="hf: most requests per generate()")
    t.add_argument("--threads", type=int, help="hf: torch threads")
    add_workload_args(p)
    o = p.add_argument_group("output")
    o.add_argument("--name", help="run name (default: backend-workload-time)")
    o.add_argument(
        "--output", type=Path, help="JSON file (default: ~/.cache/houchu/bench/NAME.json)"
    )
    o.add_argument("--db", help="database URL (default: houchu's database)")
    o.add_argument("--no-db", action="store_true", help="do not store the run in the database")
    o.add_argument("--no-progress", action="store_true")


def bench_spec(args: argparse.Namespace, model_name: str | None = None) -> Any:
    """The :class:`~houchu.bench.core.BenchSpec` the options describe (``model_name``:
    the ``model`` field for OpenAI-compatible servers).

    Raises:
        ValueError: an option has a bad value.
    """
    from houchu.bench.backends.base import GenParams
    from houchu.bench.core import BenchSpec
    from houchu.bench.dist import parse_dist
    from houchu.bench.driver import RunConfig
    from houchu.bench.metrics import parse_slo
    from houchu.bench.workloads import WorkloadConfig

    for name in ("num_requests", "concurrency", "request_rate", "max_duration", "request_timeout"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive, got {v}")
    if args.warmup < 0:
        raise ValueError("--warmup must be >= 0")
    workload = WorkloadConfig(
        kind=args.workload,
        num_requests=args.num_requests,
        input_len=parse_dist(args.input_len),
        output_len=parse_dist(args.output_len),
        num_prefixes=args.num_prefixes,
        prefix_len=args.prefix_len,
        turns=args.turns,
        long_len=args.long_len,
        long_every=args.long_every,
        long_output=args.long_output,
        replay_path=args.replay,
    )
    conc = args.concurrency if args.concurrency or args.request_rate else 1
    run = RunConfig(conc, args.request_rate, args.max_duration, args.seed, not args.no_progress)
    api = "chat" if args.workload == "multi-turn" else args.api
    params = GenParams(
        api,
        args.temperature,
        not args.no_ignore_eos,
        args.request_timeout,
        model_name,
        structured_fields(getattr(args, "structured", "none")),
    )
    return BenchSpec(workload, run, params, args.warmup, parse_slo(args.goodput) or None)


#: The schema of ``--structured json-schema``: records until the output length is spent
#: (``minItems``: 1,024 records of at least ~15 tokens each, more than any context holds,
#: so the grammar never lets the array close and every request runs to ``max_tokens``).
BENCH_MIN_RECORDS = 1024
BENCH_SCHEMA: dict[str, Any] = {
    "type": "array",
    "minItems": BENCH_MIN_RECORDS,
    "items": {
        "type": "object",
        "properties": {
            "id": {"type": "integer"},
            "name": {"type": "string", "maxLength": 16},
            "active": {"type": "boolean"},
            "tags": {"type": "array", "items": {"enum": ["a", "b", "c"]}, "maxItems": 3},
        },
        "required": ["id", "name", "active", "tags"],
        "additionalProperties": False,
    },
}


def structured_fields(kind: str) -> dict[str, Any]:
    """The request fields of ``--structured KIND`` ({} for none)."""
    if kind == "json-schema":
        spec = {"name": "records", "schema": BENCH_SCHEMA}
        return {"response_format": {"type": "json_schema", "json_schema": spec}}
    return {}


def make_backend(args: argparse.Namespace, params: Any) -> Any:
    """The target the options name."""
    if args.backend == "houchu-ws":
        from houchu.bench.backends.ws import HouchuWsBackend

        return HouchuWsBackend(args.url, params, args.ws_connections)
    if args.backend == "openai":
        from houchu.bench.backends.openai import OpenAIBackend

        return OpenAIBackend(args.base_url, params, args.api_key, include_usage=not args.no_usage)
    from houchu.bench.backends.hf import HFBackend
    from houchu.model.fetch import fetch_default_model

    path = Path(args.hf_model) if args.hf_model else fetch_default_model()
    return HFBackend(path, params, args.hf_max_batch, args.threads)


def run_bench(args: argparse.Namespace) -> int:
    """Run ``houchu bench``; returns the exit code (1 when every request failed)."""
    from houchu.bench.core import benchmark
    from houchu.bench.prompts import PromptBuilder, load_encoder
    from houchu.bench.report import results_dir, save_json, store, summary_table

    try:
        spec = bench_spec(args, args.model)
    except ValueError as exc:
        print(f"houchu bench: {exc}", file=sys.stderr)
        return 2
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = args.name or f"{args.backend}-{args.workload}-{stamp}"
    builder = PromptBuilder(load_encoder(args.tokenizer))
    try:
        record = asyncio.run(benchmark(make_backend(args, spec.params), spec, builder, name))
    except (ValueError, OSError) as exc:
        print(f"houchu bench: {exc}", file=sys.stderr)
        return 2
    print(summary_table(record))
    path = save_json(record, args.output or results_dir() / f"{name}.json")
    print(f"results: {path}")
    if not args.no_db:
        row = store(record, args.db)
        print(
            f"database: run {row}"
            if row is not None
            else "database: storage not available; JSON only"
        )
    return 0 if record["results"]["completed"] else 1
