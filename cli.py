"""The ``houchu`` command: ``houchu serve``, ``houchu fetch`` and ``houchu bench``."""

from __future__ import annotations

import argparse
import asyncio
import sys
from pathlib import Path

from houchu.bench.cli import add_bench_parser, run_bench
from houchu.fetch import FetchError, fetch_default_model
from houchu.serve_options import add_serve_parser, check_serve_args


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("houchu")
    except PackageNotFoundError:
        return "unknown"


def build_parser() -> argparse.ArgumentParser:
    """The ``houchu`` argument parser (defaults that come from the environment, such as
    ``HOUCHU_API_KEY``, are read now)."""
    parser = argparse.ArgumentParser(prog="houchu", description="houchu LLM serving engine")
    parser.add_argument("--version", action="version", version=f"houchu {_version()}")
    sub = parser.add_subparsers(dest="command", required=True)
    add_serve_parser(sub)
    sub.add_parser("fetch", help="download the default model into the cache")
    add_bench_parser(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Entry point of the ``houchu`` console command; returns the exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)

    if args.command == "bench":
        return run_bench(args)

    if args.command == "fetch":
        try:
            print(fetch_default_model())
        except FetchError as e:
            print(f"houchu: {e}", file=sys.stderr)
            return 1
        return 0
    check_serve_args(parser, args)
    return _serve(args)


def _serve(args: argparse.Namespace) -> int:

    from houchu.actors.config import ServeConfig
    from houchu.actors.launcher import Launcher
    from houchu.actors.runtime import install_uvloop
    from houchu.transport.endpoints import Endpoints

    if args.model is None:
        try:
            model = str(fetch_default_model())
        except FetchError as e:
            print(f"houchu: {e}", file=sys.stderr)
            return 1
    else:
        model = args.model
        if not Path(model).exists():
            print(f"houchu: model path {model} does not exist", file=sys.stderr)
            return 2
    config = ServeConfig(
        model_path=str(Path(model).resolve()),
        endpoints=Endpoints.ipc("/tmp"),  # replaced by the launcher's run directory
        host=args.host,
        port=args.port,
        served_model_name=args.served_model_name,
        dtype=args.dtype,
        page_size=args.page_size,
        num_pages=args.num_pages,
        kv_cache_memory_bytes=args.kv_cache_mb << 20,
        max_context=args.max_context,
        max_batch_tokens=args.max_batch_tokens,
        chunk_size=args.chunked_prefill_size,
        max_running=args.max_running_requests,
        radix_cache=not args.disable_radix_cache,
        overlap_schedule="off" if args.disable_overlap_schedule else args.overlap_schedule,
        telemetry=not args.disable_telemetry,
        host_kv_pages=args.host_kv_pages,
        host_kv_bytes=args.host_kv_mb << 20,
        ssd_kv_bytes=args.ssd_kv_mb << 20,
        kv_cache_dir=args.kv_cache_dir,
        kv_write_policy=args.kv_write_policy,
        speculative=args.speculative,
        draft_model_path=str(Path(args.draft_model).resolve()) if args.draft_model else None,
        num_speculative_tokens=args.num_speculative_tokens,
        speculative_max_batch=args.speculative_max_batch,
        num_threads=args.threads,
        quantization=args.quantization,
        quant_group_size=args.quant_group_size,
        kv_cache_dtype=args.kv_cache_dtype,
        attention_backend=args.attention_backend,
        compile="off" if args.disable_compile else args.compile,
        decode_batch_sizes=args.decode_batch_sizes,
        cuda_graph=not args.disable_cuda_graph,
        fused_layers=not args.disable_fused_layers,
        cpu_isa=args.cpu_isa,
        decode_paths=args.decode_paths,
        adapt_threads=not args.fixed_threads,
        request_timeout_s=args.request_timeout,
        heartbeat_timeout_s=args.heartbeat_timeout,
        max_restarts=args.max_restarts,
        restart_window_s=args.restart_window,
        db_url=args.db_url,
        retention_requests=args.retention_requests or None,
        retention_days=args.retention_days or None,
        max_queued_requests=args.max_queued_requests,
        max_queued_tokens=args.max_queued_tokens,
        max_request_bytes=int(args.max_request_mb * 2**20),
        stream_buffer_bytes=args.stream_buffer_kb << 10,
        api_key=args.api_key.strip() if args.api_key else None,
        actor_transport=args.actor_transport,
        actor_host=args.actor_host,
    )
    install_uvloop()
    return asyncio.run(Launcher(config).serve())


if __name__ == "__main__":
    sys.exit(main())
