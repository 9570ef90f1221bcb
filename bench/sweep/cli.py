"""``houchu levers``: each lever on and off, alone and in pairs, on your workload.

Examples::

    houchu levers --levers radix-cache,chunked-prefill,int4,int8-kv --concurrency 1,4,16,64 \\
        --workload shared-prefix --num-requests 32 --output-len 64
    houchu levers --levers all --request-rates 0.5,1,2 --workload replay --replay reqs.jsonl
    houchu levers --levers int4,spec-ngram --replay-db --num-requests 200 --repeats 3
    houchu levers --levers all --concurrency 1,4,16 --max-duration 60 --dry-run
    houchu levers --levers all --concurrency 1,4,16 --max-duration 60 --resume levers.json

Starts a fresh ``houchu serve`` per configuration (baseline: every lever off; each lever
alone; the pairs), one after the other, runs the workload at each load level on it
(``--repeats`` times, round-robin), and answers per lever: the bottleneck it targets and
the one binding, what it saved and spent (the engine's own counters), its effect on
TTFT, TPOT and throughput, and its break-even load; then whether each pair's gains add,
overlap or cancel, and the fastest configuration at the target load as ``houchu serve``
flags. Prints rich tables, writes the record as JSON (``--output``) and stores it in
the database beside the benchmark runs (``--db``; skipped with ``--no-db``).

Before the first server it prints the servers and measured runs and an upper bound of
the duration (each run within ``--max-duration``, plus a start-up allowance per
server); the progress bar's ETA follows the servers measured. ``--dry-run`` prints the
plan (each configuration's flags, servers, runs, the estimate) and runs nothing. After
every server the record so far goes to the ``--output`` file, marked incomplete; Ctrl-C
or SIGTERM stops the running server, writes it and prints the command that resumes:
the same options with ``--resume FILE``, which checks the plan and the machine are the
same and measures only the missing cells.
"""

from __future__ import annotations

import argparse
import shlex
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from houchu import env as env_vars
from houchu.bench.cli import add_workload_args
from houchu.bench.sweep.levers import LEVERS

OBJECTIVES = {"throughput": "output_throughput", "ttft": "median_ttft_ms", "tpot": "median_tpot_ms"}
DEFAULT_CONCURRENCY = "1,4,16,64"


def add_levers_parser(sub: argparse._SubParsersAction) -> None:
    """Register ``houchu levers``."""
    p = sub.add_parser(
        "levers",
        help="sweep each lever on and off (and in pairs) over load levels on a workload",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
        conflict_handler="resolve",  # the workload's --concurrency becomes a list here
    )
    add_workload_args(p)
    s = p.add_argument_group("sweep")
    s.add_argument(
        "--levers",
        default="all",
        help=f"comma-separated levers, or all (levers: {', '.join(lv.name for lv in LEVERS)})",
    )
    s.add_argument(
        "--pairs",
        default="interacting",
        help="interacting (the known interacting pairs), all, none, or a+b,c+d",
    )
    s.add_argument(
        "--concurrency",
        help=f"load levels: sessions in flight, comma-separated (default {DEFAULT_CONCURRENCY})",
    )
    s.add_argument(
        "--request-rates",
        "--request-rate",
        dest="request_rates",
        help="load levels: Poisson requests per second, comma-separated",
    )
    s.add_argument(
        "--repeats",
        type=int,
        default=3,
        help="runs of each configuration and load; figures are their medians",
    )
    s.add_argument(
        "--target-load", type=float, help="load of the recommendation (default: the highest)"
    )
    s.add_argument("--objective", choices=OBJECTIVES, default="throughput")
    s.add_argument("--model", help="model to serve (default: the default model)")
    s.add_argument(
        "--serve-args", default="", help="more houchu serve arguments for every server, quoted"
    )
    s.add_argument("--draft-model", help="a draft model for the spec-draft lever")
    s.add_argument(
        "--replay-db",
        nargs="?",
        const="",
        metavar="URL",
        help=(
            "replay the newest --num-requests requests recorded in houchu's database (default "
            "database without URL): their prompt and output lengths (prompt text is not recorded)"
        ),
    )
    s.add_argument("--ws-connections", type=int, default=4)
    s.add_argument("--quality-text", type=Path, help="text for the lossy levers' accuracy")
    s.add_argument("--no-quality", action="store_true", help="do not measure accuracy")
    s.add_argument(
        "--no-defaults",
        action="store_true",
        help="do not measure houchu's defaults (no lever flags) beside the baseline",
    )
    o = p.add_argument_group("output")
    o.add_argument("--name", help="run name (default: levers-WORKLOAD-TIME)")
    o.add_argument(
        "--output",
        type=Path,
        help="JSON file, written after every server (marked incomplete until the end) "
        "(default: ~/.cache/houchu/bench/NAME.json)",
    )
    o.add_argument("--db", help="database URL to store the sweep in (default: houchu's)")
    o.add_argument("--no-db", action="store_true")
    o.add_argument("--no-progress", action="store_true")
    o.add_argument(
        "--resume",
        type=Path,
        metavar="FILE",
        help="continue the partial record FILE (a sweep interrupted) with the same options "
        "on the same machine: only its missing cells run; the record is written back to "
        "FILE (or --output)",
    )
    o.add_argument(
        "--dry-run",
        action="store_true",
        help="print the plan (configurations, flags per server, runs, the estimate); start nothing",
    )
    o.add_argument(
        "--reanalyze",
        type=Path,
        metavar="FILE",
        help="answer again from a stored JSON record (no servers run; a partial one from "
        "the cells it holds); with --output, write the new record there",
    )


def _tp_refusal(model: Path, serve_args: list[str]) -> str | None:
    """Why ``--tensor-parallel-size 2`` cannot serve ``model`` with ``serve_args``' other
    flags (the runner's start-up check), or None."""
    from houchu.options.runner_options import RunnerOptions
    from houchu.runner.tensor_parallel.ranks import check_model
    from houchu.runner.tensor_parallel.shards import TensorParallelError

    quant = "auto"
    if "--quantization" in serve_args:
        i = serve_args.index("--quantization")
        quant = serve_args[i + 1] if i + 1 < len(serve_args) else quant
    try:
        check_model(model, RunnerOptions(quantization=quant, tensor_parallel_size=2))
    except TensorParallelError as e:
        return str(e)
    return None


def _machine(
    serve_args: list[str], draft: str | None, model: Path, structured: bool = False
) -> Any:
    from houchu.bench.sweep.levers import Machine
    from houchu.cpu.isa import cpu_features
    from houchu.options.flags import GROUPS

    device = "auto"
    if "--device" in serve_args:
        i = serve_args.index("--device")
        device = serve_args[i + 1] if i + 1 < len(serve_args) else "auto"
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    flags = frozenset(f.name for g in GROUPS for f in g.flags)
    kind = "cuda" if device.startswith("cuda") else "cpu"
    refusal = _tp_refusal(model, serve_args)
    return Machine(kind, cpu_features(), flags, draft, refusal, structured)


def _replay_from_db(args: argparse.Namespace, builder: Any, workdir: Path) -> str:
    """A JSONL replay file of recorded request shapes (prompt text rebuilt to length).

    Raises:
        ValueError: no database file at a ``sqlite:///`` URL (none is made), or the
            database holds no finished request.
    """
    import json
    import random

    from houchu.storage.db import open_db, sqlite_path
    from houchu.storage.sweep_view import recorded_requests

    url = args.replay_db or None
    file = sqlite_path(url) if url else None
    if file is not None and not file.exists():
        raise ValueError(f"--replay-db: no database at {file}")
    engine = open_db(url)
    try:
        rows = recorded_requests(engine, args.num_requests)
    finally:
        engine.dispose()
    if not rows:
        raise ValueError("the database holds no finished request to replay")
    if len(rows) < args.num_requests:
        print(
            f"houchu levers: the database holds {len(rows)} finished request(s): replaying "
            f"{len(rows)}, not the {args.num_requests} of --num-requests",
            file=sys.stderr,
        )
    rng = random.Random(args.seed)
    path = workdir / "replay_db.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for r in rows:
            line = {
                "user": builder.text(rng, r["prompt_tokens"]),
                "max_tokens": max(1, r["completion_tokens"]),
            }
            f.write(json.dumps(line) + "\n")
    return str(path)


def run_levers(args: argparse.Namespace, argv: list[str] | None = None) -> int:
    """Run ``houchu levers``; returns the exit code (2: bad options or a record that
    cannot be resumed; 1: nothing measured; 128 + N: stopped by signal N). ``argv``:
    the command's arguments, for the resume hint."""
    try:
        if args.reanalyze is not None:
            if args.resume is not None or args.dry_run:
                raise ValueError("--reanalyze runs nothing: not with --resume or --dry-run")
            return _reanalyze(args)
        return _run(args, argv)
    except ValueError as exc:
        print(f"houchu levers: {exc}", file=sys.stderr)
        return 2


def _reanalyze(args: argparse.Namespace) -> int:
    """Print (and with ``--output`` write) a stored record analyzed again."""
    from rich.console import Console

    from houchu.bench.sweep.checkpoint import read_record
    from houchu.bench.sweep.reanalyze import reanalyze
    from houchu.bench.sweep.report import print_report, save_record
    from houchu.cpu import isa as cpu_isa
    from houchu.options.flags import GROUPS

    record = read_record(args.reanalyze)
    flags = frozenset(f.name for g in GROUPS for f in g.flags)
    native = cpu_isa.native_units(cpu_isa.usable()[0])
    record = reanalyze(record, flags, native, args.target_load)
    console = Console(width=None if sys.stdout.isatty() else 200)
    print_report(record, console)
    if args.output:
        console.print(f"results: {save_record(record, args.output)}")
    if args.db and not args.no_db:  # asked for: stored (another machine's, for the dashboard)
        from houchu.bench.sweep.session import store_sweep

        store_sweep(record, args.db, console)
    return 0


def _run(args: argparse.Namespace, argv: list[str] | None) -> int:
    from houchu.bench.sweep.plan import build_plan, parse_loads

    serve_args = shlex.split(args.serve_args)
    for forbidden in ("--port", "--db-url", "--model"):
        if forbidden in serve_args:
            raise ValueError(f"--serve-args must not set {forbidden} (houchu levers sets it)")
    names = [lv.name for lv in LEVERS] if args.levers == "all" else args.levers.split(",")
    rates = args.request_rates
    loads = parse_loads(args.concurrency or (None if rates else DEFAULT_CONCURRENCY), rates)
    plan = build_plan(
        [n.strip() for n in names],
        args.pairs,
        loads,
        args.repeats,
        _machine(
            serve_args,
            args.draft_model,
            _model_path(args),
            getattr(args, "structured", "none") != "none",
        ),
        defaults=not args.no_defaults,
    )
    check_serve_args(serve_args, plan)
    if args.target_load is not None and args.target_load not in [ld.value for ld in loads]:
        raise ValueError(f"--target-load {args.target_load:g} is not one of the load levels")
    workdir = Path(tempfile.mkdtemp(prefix="houchu-levers-"))
    try:
        return _prepare_and_sweep(args, plan, serve_args, workdir, argv)
    finally:
        if not env_vars.levers_keep_db():
            shutil.rmtree(workdir, ignore_errors=True)


def check_serve_args(serve_args: list[str], plan: Any) -> None:
    """Refuse ``--serve-args`` that set a swept lever's own flag: every configuration
    sets it (on or off), so the arguments would turn a lever on or off behind the
    sweep's back, and "defaults" would not be houchu's defaults.

    Raises:
        ValueError: naming the flag and the lever.
    """
    _parse_as_serve(serve_args)
    given = {a.split("=", 1)[0] for a in serve_args if a.startswith("--")}
    for lv in plan.levers:
        clash = sorted(given & lv.flag_names())
        if clash:
            raise ValueError(
                f"--serve-args must not set {', '.join(clash)}: the lever {lv.name} sets it "
                "(leave it out of --levers to fix it for every configuration)"
            )


def _parse_as_serve(serve_args: list[str]) -> None:
    """Refuse ``--serve-args`` that ``houchu serve`` would refuse (an unknown or
    shortened flag), before any server starts.

    Raises:
        ValueError: serve's own error line.
    """
    import contextlib
    import io

    from houchu.options.parser import add_serve_parser

    parser = argparse.ArgumentParser(prog="houchu")
    add_serve_parser(parser.add_subparsers(dest="command", required=True))
    said = io.StringIO()
    try:
        with contextlib.redirect_stderr(said):
            parser.parse_args(["serve", *serve_args])
    except SystemExit:
        lines = [ln for ln in said.getvalue().splitlines() if "error:" in ln]
        why = lines[-1].split("error:", 1)[1].strip() if lines else "refused"
        raise ValueError(f"--serve-args: houchu serve refuses them: {why}") from None


def _spec(args: argparse.Namespace) -> Any:
    """The workload's :class:`~houchu.bench.core.BenchSpec` (its load levels are the
    sweep's: no concurrency or rate of its own)."""
    from houchu.bench.cli import bench_spec

    return bench_spec(
        argparse.Namespace(**{**vars(args), "concurrency": None, "request_rate": None})
    )


def _prepare_and_sweep(args, plan, serve_args, workdir, argv) -> int:  # noqa: ANN001
    """Build the workload and run the sweep in ``workdir`` (``--dry-run``: print it)."""
    from houchu.bench.prompts import PromptBuilder, load_encoder
    from houchu.bench.sweep.runner import SweepInputs
    from houchu.bench.sweep.session import dry_run, run_session

    builder = PromptBuilder(load_encoder(args.tokenizer))
    if args.replay_db is not None:
        args.workload, args.replay = "replay", _replay_from_db(args, builder, workdir)
    spec = _spec(args)
    if args.dry_run:
        model = _model_path(args)
        return dry_run(args, plan, spec, model, serve_args, OBJECTIVES[args.objective])
    inputs = SweepInputs(
        _model_path(args),
        serve_args,
        spec,
        builder,
        workdir,
        fresh_per_load=spec.workload.kind == "replay",
        ws_connections=args.ws_connections,
    )
    return run_session(args, plan, inputs, OBJECTIVES[args.objective], argv)


def _model_path(args: argparse.Namespace) -> Path:
    """The swept model's path (default: the default model, fetched if needed).

    Raises:
        ValueError: no file or folder at ``--model``.
    """
    from houchu.model.fetch import fetch_default_model

    model = Path(args.model) if args.model else fetch_default_model(quiet=True)
    if not model.exists():
        raise ValueError(f"model path {model} does not exist")
    return model.resolve()
