"""``houchu serve``'s options: the argument groups, their help, and their validation."""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from houchu.gpu import cpu_isa as isa
from houchu.transport.channel import MAX_MESSAGE_BYTES

#: Largest --max-request-mb: a request must fit well inside one actor message.
MAX_REQUEST_MB = MAX_MESSAGE_BYTES // 4 // 2**20


class _DefaultsFormatter(argparse.HelpFormatter):
    """Help that ends with "(default: X)" where an option has a default worth showing
    (not None, not a switch's False, not already in the text)."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        d = action.default
        if d in (None, False, argparse.SUPPRESS) or "default" in text or not action.option_strings:
            return text
        return f"{text} (default: %(default)s)"


def add_serve_parser(sub: argparse._SubParsersAction) -> None:
    """Add ``serve`` and its options to the ``houchu`` command's subparsers."""
    p = sub.add_parser(
        "serve",
        help="serve a model over HTTP (OpenAI API) and WebSocket",
        formatter_class=_DefaultsFormatter,
    )
    p.add_argument(
        "--model",
        help="a .gguf file or a Hugging Face model folder (default: fetch SmolLM2-135M-Instruct)",
    )
    p.add_argument("--host", default="127.0.0.1", help="address to listen on")
    p.add_argument("--port", type=int, default=8000, help="HTTP and WebSocket port")
    p.add_argument("--served-model-name", help="name clients use in the `model` field")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=["float32", "bfloat16", "float16"],
        help="compute dtype of weights and KV cache",
    )
    p.add_argument("--page-size", type=int, default=16, help="tokens per KV page")
    p.add_argument("--num-pages", type=int, help="KV pool size in pages (overrides --kv-cache-mb)")
    p.add_argument("--kv-cache-mb", type=int, default=1024, help="KV pool size in MiB")
    p.add_argument("--max-context", type=int, help="cap on the context window, in tokens")
    p.add_argument(
        "--max-batch-tokens",
        type=int,
        default=512,
        help="tokens computed per step (decodes plus prefill chunks)",
    )
    p.add_argument(
        "--chunked-prefill-size",
        type=int,
        default=512,
        help="most prefill tokens of one request per step; 0 disables chunking",
    )
    p.add_argument(
        "--max-running-requests", type=int, default=64, help="requests decoded together at most"
    )
    p.add_argument(
        "--disable-radix-cache",
        action="store_true",
        help="do not reuse the KV of cached prompt prefixes",
    )
    p.add_argument(
        "--overlap-schedule",
        default="auto",
        choices=["auto", "on", "off"],
        help="plan the next step while one runs, hiding the scheduler's time (auto: on a "
        "CUDA GPU, or on a CPU with 2 or more cores beyond the runner's threads)",
    )
    p.add_argument(
        "--disable-overlap-schedule",
        action="store_true",
        help="plan each step only after the previous one returned (same as --overlap-schedule off)",
    )
    _tier_options(p)
    p.add_argument(
        "--disable-telemetry",
        action="store_true",
        help="no recorder: no lifecycle events, step records or lever samples are stored",
    )
    _spec_options(p)
    _speed_options(p)
    _limit_options(p)
    p.add_argument(
        "--threads", type=int, help="torch threads of the model runner (the most, see below)"
    )
    p.add_argument(
        "--fixed-threads",
        action="store_true",
        help="keep the runner's thread count; by default a CPU runner uses fewer threads "
        "while other processes contend for the cores, and probes back up when they free",
    )
    p.add_argument(
        "--db-url",
        help="SQLAlchemy URL of the telemetry and benchmark database "
        "(default: SQLite at ~/.cache/houchu/houchu.db, or $HOUCHU_CACHE/houchu.db)",
    )
    p.add_argument(
        "--retention-requests",
        type=int,
        default=10_000,
        help="telemetry of the newest N requests is kept; 0 keeps all",
    )
    p.add_argument(
        "--retention-days",
        type=float,
        default=7.0,
        help="telemetry older than this many days is pruned; 0 keeps all",
    )
    p.add_argument(
        "--request-timeout",
        type=float,
        default=300.0,
        help="seconds without progress before a request fails",
    )
    _supervision_options(p)


def _supervision_options(p: argparse.ArgumentParser) -> None:
    """Options of the supervisor that restarts actors that die or hang."""
    g = p.add_argument_group("supervision (actors that die or hang are restarted)")
    g.add_argument(
        "--heartbeat-timeout",
        type=float,
        default=120.0,
        help="seconds an actor's event loop may go without a heartbeat before it is "
        "killed and restarted (a model step runs on a worker thread, so a long step is "
        "busy, not silent)",
    )
    g.add_argument(
        "--max-restarts",
        type=int,
        default=5,
        help="restarts of one actor allowed within --restart-window; one more death stops "
        "the server (the recorder, KV-tier manager and draft are then left off instead)",
    )
    g.add_argument("--restart-window", type=float, default=60.0, help="seconds of --max-restarts")


def _check_supervision(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    for name in ("heartbeat_timeout", "restart_window"):
        v = getattr(args, name)
        if not 0 < v < float("inf"):
            parser.error(f"--{name.replace('_', '-')} must be a positive number, got {v}")
    if args.max_restarts < 0:
        parser.error(f"--max-restarts must be >= 0, got {args.max_restarts}")


def _limit_options(p: argparse.ArgumentParser) -> None:
    """Options of overload limits, the API key and actor placement."""
    from houchu.actors.config import (
        DEFAULT_MAX_QUEUED_REQUESTS,
        DEFAULT_MAX_QUEUED_TOKENS,
        DEFAULT_MAX_REQUEST_BYTES,
        DEFAULT_STREAM_BUFFER_BYTES,
    )

    g = p.add_argument_group("limits and security")
    g.add_argument(
        "--max-queued-requests",
        type=int,
        default=DEFAULT_MAX_QUEUED_REQUESTS,
        help="requests accepted and not yet finished (queued or running); beyond it "
        "HTTP 429 with Retry-After",
    )
    g.add_argument(
        "--max-queued-tokens",
        type=int,
        default=DEFAULT_MAX_QUEUED_TOKENS,
        help="prompt tokens waiting in the scheduler's queue; beyond it HTTP 429",
    )
    g.add_argument(
        "--max-request-mb",
        type=float,
        default=DEFAULT_MAX_REQUEST_BYTES / 2**20,
        help=f"largest request body or WebSocket frame, MiB (at most {MAX_REQUEST_MB})",
    )
    g.add_argument(
        "--stream-buffer-kb",
        type=int,
        default=DEFAULT_STREAM_BUFFER_BYTES >> 10,
        help="unsent KiB a stream may leave buffered for a client that does not read "
        "before it is aborted",
    )
    g.add_argument(
        "--api-key",
        default=os.environ.get("HOUCHU_API_KEY") or None,
        help="require 'Authorization: Bearer KEY' on the API routes "
        "(default: $HOUCHU_API_KEY; prefer the variable: arguments are visible to ps)",
    )
    g.add_argument(
        "--actor-transport",
        default="ipc",
        choices=["ipc", "tcp"],
        help="actor sockets: ipc in a private directory, or tcp with ZeroMQ CURVE keys",
    )
    g.add_argument("--actor-host", default="127.0.0.1", help="address of tcp actor sockets")


def _check_limits(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    _positive(
        parser, args, "max_queued_requests", "max_queued_tokens", "max_request_mb",
        "stream_buffer_kb",
    )  # fmt: skip
    if args.max_request_mb > MAX_REQUEST_MB:
        parser.error(f"--max-request-mb must be at most {MAX_REQUEST_MB}")
    if args.api_key is not None and not args.api_key.strip():
        parser.error("--api-key must not be empty")
    if args.api_key is None and args.host not in ("127.0.0.1", "localhost", "::1"):
        print(
            f"houchu: warning: listening on {args.host} without an API key (--api-key)",
            file=sys.stderr,
        )


def _speed_options(p: argparse.ArgumentParser) -> None:
    """Options of the model runner's kernels (quantization, attention, compiled step)."""
    g = p.add_argument_group("model runner speed (quantization, kernels, compiled step)")
    g.add_argument(
        "--quantization",
        default="auto",
        choices=["auto", "none", "int4", "int8", "w8a8"],
        help="matmul weights: none (dense: the exact path), int4/int8 weight-only (a GGUF's "
        "Q4_0/Q4_1 kept as int4), w8a8 (int8 weights and activations); auto: int4 for a "
        "GGUF whose projections are Q4_0/Q4_1, else none (default: %(default)s)",
    )
    g.add_argument(
        "--quant-group-size",
        type=int,
        default=32,
        choices=[32, 64, 128],
        help="int4 input features per scale/zero group",
    )
    g.add_argument(
        "--kv-cache-dtype",
        default="auto",
        choices=["auto", "int8", "fp8"],
        help="KV cache element type (auto: the model dtype; int8/fp8 hold ~2x the tokens)",
    )
    g.add_argument(
        "--attention-backend",
        default="auto",
        choices=["auto", "torch", "cpu", "triton", "flash-attn"],
        help="attention and fused kernels (auto: flash-attn or Triton on CUDA; on the CPU, "
        "houchu's C++ kernels (cpu), built on first use, else torch)",
    )
    g.add_argument(
        "--compile",
        default="auto",
        choices=["auto", "on", "off"],
        help="torch.compile the decode step at startup: auto keeps it only if a warm-up "
        "step runs faster compiled",
    )
    g.add_argument(
        "--disable-compile",
        action="store_true",
        help="run the decode step eagerly (same as --compile off)",
    )
    g.add_argument(
        "--decode-batch-sizes",
        default="1,2,4,8,16,32",
        help="batch-size buckets the compiled / graph-captured decode step is built for",
    )
    g.add_argument(
        "--disable-fused-layers",
        action="store_true",
        help="cpu attention backend: run decode steps op by op instead of one C++ call for "
        "all the decoder layers and the LM head",
    )
    g.add_argument(
        "--decode-paths",
        default="auto",
        choices=["auto", "rules"],
        help="CPU: auto times the fused C++ layers, houchu's GEMV, torch's packed kernels "
        "and oneDNN dense copies per decode batch bucket at startup (cached) and keeps the "
        "fastest; rules: fixed row thresholds",
    )
    g.add_argument(
        "--cpu-isa",
        default="auto",
        choices=["auto", *isa.NAMES],
        help="instruction-set level of houchu's C++ CPU kernels (auto: the best this CPU "
        "runs, or $HOUCHU_CPU_ISA; generic: torch's kernels only, no C++ build)",
    )
    g.add_argument(
        "--disable-cuda-graph",
        action="store_true",
        help="do not capture decode steps as CUDA graphs (CUDA only)",
    )


def _tier_options(p: argparse.ArgumentParser) -> None:
    """Options of the host and SSD KV tiers below the device pool."""
    g = p.add_argument_group("KV tiers (host memory and SSD below the device pool)")
    g.add_argument("--host-kv-mb", type=int, default=0, help="host-memory tier, MiB (0: off)")
    g.add_argument(
        "--host-kv-pages", type=int, default=0, help="host-memory tier in pages (overrides MiB)"
    )
    g.add_argument("--ssd-kv-mb", type=int, default=0, help="SSD tier cap, MiB (0: off)")
    g.add_argument("--kv-cache-dir", default="", help="SSD tier directory (default CACHE/kv)")
    g.add_argument(
        "--kv-write-policy",
        default="write_back",
        choices=["write_back", "write_through"],
        help="copy a page down when the device evicts it, or as soon as it is cached",
    )


def _spec_options(p: argparse.ArgumentParser) -> None:
    """Options of speculative decoding (the draft actor)."""
    g = p.add_argument_group("speculative decoding (a draft proposes, the model verifies)")
    g.add_argument(
        "--speculative",
        choices=["ngram", "draft"],
        help="propose tokens by n-gram prompt lookup or with a draft model (default: off)",
    )
    g.add_argument(
        "--draft-model",
        help="draft model sharing the model's tokenizer (.gguf or HF folder); "
        "implies --speculative draft",
    )
    g.add_argument(
        "--num-speculative-tokens",
        type=int,
        default=4,
        help="most proposals verified per request per step (chosen adaptively below it)",
    )
    g.add_argument(
        "--speculative-max-batch",
        type=int,
        help="speculate only while at most N requests decode (default: the break-even "
        "batch size measured at start-up and while serving)",
    )


def _check_spec(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.draft_model is not None:
        if args.speculative == "ngram":
            parser.error("--draft-model needs --speculative draft (or no --speculative)")
        args.speculative = "draft"
        if not Path(args.draft_model).exists():
            parser.error(f"--draft-model: {args.draft_model} does not exist")
    if args.speculative == "draft" and args.draft_model is None:
        parser.error("--speculative draft needs --draft-model PATH")
    if args.num_speculative_tokens < 1:
        parser.error("--num-speculative-tokens must be >= 1")
    if args.speculative_max_batch is not None and args.speculative_max_batch < 0:
        parser.error("--speculative-max-batch must be >= 0")


def _batch_sizes(parser: argparse.ArgumentParser, text: str) -> list[int]:
    """``--decode-batch-sizes`` "1,2,4" as ascending positive ints (errors exit)."""
    try:
        sizes = sorted({int(s) for s in text.split(",") if s.strip()})
    except ValueError:
        parser.error(f"--decode-batch-sizes: not a list of integers: {text!r}")
    if not sizes or sizes[0] < 1:
        parser.error(f"--decode-batch-sizes must be positive integers, got {text!r}")
    return sizes


def _positive(parser: argparse.ArgumentParser, args: argparse.Namespace, *names: str) -> None:
    for n in names:
        v = getattr(args, n)
        if v is not None and v <= 0:
            parser.error(f"--{n.replace('_', '-')} must be positive, got {v}")


def check_serve_args(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Validate ``houchu serve``'s arguments; ``parser.error`` (exit 2 with a message) on
    the first bad one. Normalizes ``args.decode_batch_sizes`` to a list."""
    _positive(
        parser,
        args,
        "port",
        "page_size",
        "num_pages",
        "kv_cache_mb",
        "max_context",
        "max_batch_tokens",
        "max_running_requests",
        "threads",
    )
    if not 0 < args.port <= 65535:
        parser.error(f"--port must be in 1..65535, got {args.port}")
    if args.chunked_prefill_size < 0:
        parser.error("--chunked-prefill-size must be >= 0")
    for n in ("host_kv_mb", "host_kv_pages", "ssd_kv_mb"):
        if getattr(args, n) < 0:
            parser.error(f"--{n.replace('_', '-')} must be >= 0")
    if args.ssd_kv_mb and not (args.host_kv_mb or args.host_kv_pages):
        parser.error("--ssd-kv-mb needs a host tier (--host-kv-mb or --host-kv-pages)")
    if (args.host_kv_mb or args.host_kv_pages) and args.disable_radix_cache:
        parser.error("the KV tiers sit below the radix cache: drop --disable-radix-cache")
    if args.retention_requests < 0 or not args.retention_days >= 0:
        parser.error("--retention-requests and --retention-days must be >= 0 (0 keeps all)")
    _check_spec(parser, args)
    try:  # the flag, or $HOUCHU_CPU_ISA under --cpu-isa auto
        isa.choose(args.cpu_isa)
    except ValueError as e:
        parser.error(str(e))
    _check_limits(parser, args)
    _check_supervision(parser, args)
    args.decode_batch_sizes = _batch_sizes(parser, args.decode_batch_sizes)
    if args.db_url is not None:
        from houchu.storage.db import DatabaseUrlError, parse_url

        try:
            parse_url(args.db_url)
        except DatabaseUrlError as e:
            parser.error(f"--db-url: {e}")
