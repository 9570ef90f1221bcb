"""``houchu levers``: each lever on and off, alone and in pairs, on your workload.

Examples::

    houchu levers --levers radix-cache,chunked-prefill,int4,int8-kv --concurrency 1,4,16,64 \\
        --workload shared-prefix --num-requests 32 --output-len 64
    houchu levers --levers all --request-rates 0.5,1,2 --workload replay --replay reqs.jsonl
    houchu levers --levers int4,spec-ngram --replay-db --num-requests 200 --repeats 3

Starts a fresh ``houchu serve`` per configuration (baseline: every lever off; each lever
alone; the pairs), one after the other, runs the workload at each load level on it
(``--repeats`` times, round-robin), and answers per lever: the bottleneck it targets and
the one binding, what it saved and spent (the engine's own counters), its effect on
TTFT, TPOT and throughput, and its break-even load; then whether each pair's gains add,
overlap or cancel, and the fastest configuration at the target load as ``houchu serve``
flags. Prints rich tables, writes the record as JSON (``--output``) and stores it in
the database beside the benchmark runs (``--db``; skipped with ``--no-db``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import shutil
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path
from typing import Any

from houchu.bench.cli import add_workload_args
from houchu.bench.lever_table import LEVERS

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
    o = p.add_argument_group("output")
    o.add_argument("--name", help="run name (default: levers-WORKLOAD-TIME)")
    o.add_argument(
        "--output", type=Path, help="JSON file (default: ~/.cache/houchu/bench/NAME.json)"
    )
    o.add_argument("--db", help="database URL to store the sweep in (default: houchu's)")
    o.add_argument("--no-db", action="store_true")
    o.add_argument("--no-progress", action="store_true")
    o.add_argument(
        "--reanalyze",
        type=Path,
        metavar="FILE",
        help="answer again from a stored JSON record (no servers run); with --output, "
        "write the new record there",
    )


def _tp_refusal(model: Path, serve_args: list[str]) -> str | None:
    """Why ``--tensor-parallel-size 2`` cannot serve ``model`` with ``serve_args``' other
    flags (the runner's start-up check), or None."""
    from houchu.model.tensor_parallel import TensorParallelError
    from houchu.model.tp_worker import check_model
    from houchu.options.runner_options import RunnerOptions

    quant = "auto"
    if "--quantization" in serve_args:
        i = serve_args.index("--quantization")
        quant = serve_args[i + 1] if i + 1 < len(serve_args) else quant
    try:
        check_model(model, RunnerOptions(quantization=quant, tensor_parallel_size=2))
    except TensorParallelError as e:
        return str(e)
    return None


def _machine(serve_args: list[str], draft: str | None, model: Path) -> Any:
    from houchu.bench.lever_table import Machine
    from houchu.model.cpu_isa import cpu_features
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
    return Machine(kind, cpu_features(), flags, draft, _tp_refusal(model, serve_args))


def _replay_from_db(args: argparse.Namespace, builder: Any, workdir: Path) -> str:
    """A JSONL replay file of recorded request shapes (prompt text rebuilt to length).

    Raises:
        ValueError: the database holds no finished request.
    """
    import json
    import random

    from houchu.storage.db import open_db
    from houchu.storage.sweep_view import recorded_requests

    engine = open_db(args.replay_db or None)
    try:
        rows = recorded_requests(engine, args.num_requests)
    finally:
        engine.dispose()
    if not rows:
        raise ValueError("the database holds no finished request to replay")
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


def run_levers(args: argparse.Namespace) -> int:
    """Run ``houchu levers``; returns the exit code (2: bad options; 1: nothing measured)."""
    try:
        if args.reanalyze is not None:
            return _reanalyze(args)
        return _run(args)
    except ValueError as exc:
        print(f"houchu levers: {exc}", file=sys.stderr)
        return 2


def _reanalyze(args: argparse.Namespace) -> int:
    """Print (and with ``--output`` write) a stored record analyzed again."""
    import json

    from rich.console import Console

    from houchu.bench.sweep_reanalyze import reanalyze
    from houchu.bench.sweep_report import print_report, save_record
    from houchu.model import cpu_isa
    from houchu.options.flags import GROUPS

    try:
        record = json.loads(args.reanalyze.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"cannot read {args.reanalyze}: {exc}") from None
    flags = frozenset(f.name for g in GROUPS for f in g.flags)
    record = reanalyze(record, flags, cpu_isa.native_units(cpu_isa.usable()[0]))
    console = Console(width=None if sys.stdout.isatty() else 200)
    print_report(record, console)
    if args.output:
        console.print(f"results: {save_record(record, args.output)}")
    return 0


def _run(args: argparse.Namespace) -> int:
    from houchu.bench.sweep_plan import build_plan, parse_loads

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
        _machine(serve_args, args.draft_model, _model_path(args)),
    )
    if args.target_load is not None and args.target_load not in [ld.value for ld in loads]:
        raise ValueError(f"--target-load {args.target_load:g} is not one of the load levels")
    workdir = Path(tempfile.mkdtemp(prefix="houchu-levers-"))
    try:
        return _prepare_and_sweep(args, plan, loads, serve_args, workdir)
    finally:
        if not os.environ.get("HOUCHU_LEVERS_KEEP_DB"):
            shutil.rmtree(workdir, ignore_errors=True)


def _prepare_and_sweep(args, plan, loads, serve_args, workdir) -> int:  # noqa: ANN001
    """Build the workload and run the sweep in ``workdir``."""
    from houchu.bench.cli import bench_spec
    from houchu.bench.prompts import PromptBuilder, load_encoder

    builder = PromptBuilder(load_encoder(args.tokenizer))
    if args.replay_db is not None:
        args.workload, args.replay = "replay", _replay_from_db(args, builder, workdir)
    spec = bench_spec(
        argparse.Namespace(**{**vars(args), "concurrency": None, "request_rate": None})
    )
    return _sweep(args, plan, spec, builder, _model_path(args), serve_args, workdir)


def _model_path(args: argparse.Namespace) -> Path:
    """The swept model's path (default: the default model, fetched if needed).

    Raises:
        ValueError: no file or folder at ``--model``.
    """
    from houchu.cli.fetch import fetch_default_model

    model = Path(args.model) if args.model else fetch_default_model(quiet=True)
    if not model.exists():
        raise ValueError(f"model path {model} does not exist")
    return model.resolve()


def _sweep(args, plan, spec, builder, model, serve_args, workdir) -> int:  # noqa: ANN001
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from houchu.bench import runner_limits
    from houchu.bench.report import results_dir, store
    from houchu.bench.sweep_answers import analyze
    from houchu.bench.sweep_quality import measure_quality
    from houchu.bench.sweep_report import print_report, save_record
    from houchu.bench.sweep_runner import SweepInputs, SweepRunner
    from houchu.model import cpu_isa

    console = Console(width=None if sys.stdout.isatty() else 200)
    load_start = os.getloadavg()
    lim = runner_limits.measure()
    inputs = SweepInputs(
        model,
        serve_args,
        spec,
        builder,
        workdir,
        fresh_per_load=spec.workload.kind == "replay",
        ws_connections=args.ws_connections,
    )
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        console=console,
        disable=args.no_progress,
        transient=False,
    ) as bar:
        runner = SweepRunner(plan, inputs, lambda kind, text: None)
        task = bar.add_task("levers", total=runner.total_cells())

        def progress(kind: str, text: str) -> None:
            if kind == "cell":
                bar.advance(task)
            bar.update(task, description=text[:90])

        runner.progress = progress
        result = runner.run()
    lim = lim.best(runner_limits.measure())
    native = cpu_isa.native_units(cpu_isa.usable()[0])
    cases = {lv.name: lv.lossy for lv in plan.levers if lv.lossy is not None}
    base = result.facts.get("baseline")
    quality = (
        {}
        if args.no_quality
        else measure_quality(model, cases, base.dtype if base else "float32", args.quality_text)
    )
    target = args.target_load if args.target_load is not None else plan.loads[-1].value
    answers = analyze(
        plan, result.runs, result.facts, lim, native, quality, target, OBJECTIVES[args.objective]
    )
    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    name = args.name or f"levers-{spec.workload.kind}-{stamp}"
    record = {
        "name": name,
        "date": dt.datetime.now(dt.timezone.utc).isoformat(timespec="seconds"),
        "settings": {
            "backend": "houchu levers",
            "model": str(model),
            "serve_args": serve_args,
            "workload": {
                **spec.workload.settings(),
                **{
                    k: v
                    for k, v in spec.settings().items()
                    if k in ("api", "warmup", "temperature", "ignore_eos")
                },
            },
            "levers": [lv.name for lv in plan.levers],
            "pairs": [f"{a}+{b}" for a, b in plan.pairs],
            "load_kind": plan.loads[0].kind,
            "loads": [ld.value for ld in plan.loads],
            "repeats": plan.repeats,
            "objective": args.objective,
            "cpu_flags": " ".join(sorted(cpu_isa.isa_flags())),
            "cpu_count": os.cpu_count(),
            "draft_model": args.draft_model,
        },
        "limits": lim.line(native),
        "limits_values": asdict(lim),
        "load_average": {"start": list(load_start), "end": list(os.getloadavg())},
        "seconds": result.seconds,
        "facts": {k: v.__dict__ for k, v in result.facts.items()},
        "failures": result.failures,
        "answers": answers,
        "runs": [r.to_json() for r in result.runs],
    }
    print_report(record, console)
    path = save_record(record, args.output or results_dir() / f"{name}.json")
    console.print(f"results: {path}")
    if not args.no_db:
        row = store(
            {
                "name": name,
                "settings": record["settings"],
                "results": {"kind": "lever_sweep", "answers": answers},
            },
            args.db,
        )
        console.print(f"database: run {row}" if row is not None else "database: not stored")
    return 0 if result.runs else 1
