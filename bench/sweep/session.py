"""One session of ``houchu levers``: the plan and its estimate, the servers with a
progress bar, a checkpoint of the record after each server, and the final record.

Before the first server the session prints how many servers and measured runs it will
start and how long they can take (``houchu.bench.sweep.schedule.estimate``); the bar's
ETA then follows the measured server durations. After each server the record so far is
written to the output file (atomically: a temporary file, then a rename), marked
incomplete, so a sweep killed midway leaves a valid partial record. SIGINT or SIGTERM
stop the running server, write that record, say how to resume and exit with 128 plus
the signal's number. ``--resume FILE`` continues a partial record on the same plan and
machine (``houchu.bench.sweep.checkpoint.check_resumable``), measuring only the cells it
lacks; the final record holds every cell, analyzed as if measured in one go.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from rich.console import Console

from houchu.bench.sweep.checkpoint import (
    RecordContext,
    check_resumable,
    cpu_identity,
    gpu_name,
    read_record,
    resume_command,
    workload_settings,
)
from houchu.bench.sweep.plan import SweepPlan
from houchu.bench.sweep.records import SweepResult
from houchu.bench.sweep.schedule import ServerJob, estimate, measured_cells, server_jobs


def sweep_settings(
    args: argparse.Namespace, plan: SweepPlan, spec: Any, model: Path, serve_args: list[str]
) -> dict[str, Any]:
    """The record's ``settings``: the plan, the workload and the machine."""
    return {
        "backend": "houchu levers",
        "model": str(model),
        "serve_args": serve_args,
        "workload": workload_settings(spec),
        "levers": [lv.name for lv in plan.levers],
        "pairs": [f"{a}+{b}" for a, b in plan.pairs],
        "load_kind": plan.loads[0].kind,
        "loads": [ld.value for ld in plan.loads],
        "repeats": plan.repeats,
        "defaults": plan.defaults,
        "objective": args.objective,
        **cpu_identity(),
        "device": plan.machine.device,
        "gpu": gpu_name(plan.machine.device),
        "draft_model": args.draft_model,
    }


def start_session(
    args: argparse.Namespace,
    plan: SweepPlan,
    spec: Any,
    model: Path,
    serve_args: list[str],
    objective: str,
) -> tuple[RecordContext, SweepResult | None, list[ServerJob]]:
    """The record's context, an earlier session's measurements (``--resume``) and the
    servers left to start.

    Raises:
        ValueError: the record to resume cannot be read, or has another plan or machine,
            or nothing left to measure.
    """
    from houchu.cpu import isa as cpu_isa

    stamp = dt.datetime.now().strftime("%Y%m%d-%H%M%S")
    ctx = RecordContext(
        args.name or f"levers-{spec.workload.kind}-{stamp}",
        sweep_settings(args, plan, spec, model, serve_args),
        cpu_isa.native_units(cpu_isa.usable()[0]),
        args.target_load if args.target_load is not None else plan.loads[-1].value,
        objective,
        list(os.getloadavg()),
    )
    prior = None
    if args.resume is not None:
        old = read_record(args.resume)
        check_resumable(args.resume, old, ctx.settings)
        ctx.resuming(old)
        prior = SweepResult.from_record(old)
    fresh = spec.workload.kind == "replay"
    return ctx, prior, server_jobs(plan, fresh, measured_cells(prior.runs) if prior else ())


def plan_lines(
    args: argparse.Namespace,
    plan: SweepPlan,
    spec: Any,
    jobs: list[ServerJob],
    prior: SweepResult | None,
) -> list[str]:
    """What the session will do, in lines: the runs already measured (resumed), the
    servers and runs, and the estimate."""
    planned = len(plan.configs()) * len(plan.loads) * plan.repeats
    est = estimate(jobs, spec.run.max_duration_s, spec.warmup)
    lines = [
        f"houchu levers: {len(plan.configs())} configurations x {plan.repeats} repeat(s) x "
        f"{len(plan.loads)} load level(s) = {planned} measured runs"
    ]
    if prior is not None:
        lines.append(f"resuming {args.resume}: {len(prior.runs)} of {planned} runs measured")
    lines.append(f"to run: {est.text()}")
    return lines


def dry_run(
    args: argparse.Namespace,
    plan: SweepPlan,
    spec: Any,
    model: Path,
    serve_args: list[str],
    objective: str,
) -> int:
    """Print the plan (each configuration's ``houchu serve`` flags, the servers and
    runs, the estimate) and run nothing; returns 0."""
    _, prior, jobs = start_session(args, plan, spec, model, serve_args, objective)
    unit = "c" if plan.loads[0].kind == "concurrency" else "r"
    for line in plan_lines(args, plan, spec, jobs, prior):
        print(line)
    print(f"loads: {', '.join(f'{unit}={ld.value:g}' for ld in plan.loads)}")
    print("configurations (each server: houchu serve --model MODEL --port P --db-url DB ...):")
    for config in plan.configs():
        runs = sum(len(j.loads) for j in jobs if j.config == config)
        servers = sum(1 for j in jobs if j.config == config)
        flags = shlex.join([*serve_args, *plan.flags(config)])
        print(f"  {config.name}: {servers} server(s), {runs} run(s): {flags}")
    for name, why in {**plan.not_applicable, **plan.skipped_pairs}.items():
        print(f"  not measured: {name}: {why}")
    return 0


def run_session(
    args: argparse.Namespace,
    plan: SweepPlan,
    inputs: Any,
    objective: str,
    argv: list[str] | None,
) -> int:
    """Run the sweep's servers (see the module docstring); returns the exit code (0;
    1: nothing measured; 128 + the signal's number: interrupted).

    Args:
        args: the parsed options.
        plan: the sweep plan.
        inputs: the :class:`houchu.bench.sweep.runner.SweepInputs`.
        objective: the metric the recommendation is judged by.
        argv: the command's arguments (for the resume hint), when known.

    Raises:
        ValueError: a record to resume that does not fit (see :func:`start_session`).
    """
    from houchu.bench.model import limits as runner_limits
    from houchu.bench.report import results_dir
    from houchu.bench.sweep.checkpoint import interrupt_on_signals
    from houchu.bench.sweep.report import save_record
    from houchu.bench.sweep.runner import SweepRunner

    ctx, prior, jobs = start_session(
        args, plan, inputs.spec, inputs.model, inputs.serve_args, objective
    )
    output = args.output or args.resume or results_dir() / f"{ctx.name}.json"
    console = Console(width=None if sys.stdout.isatty() else 200)
    for line in plan_lines(args, plan, inputs.spec, jobs, prior):
        console.print(line, highlight=False)
    console.print(f"record: {output} (written after every server)", highlight=False)
    runner = SweepRunner(plan, inputs, lambda kind, text: None, prior)
    with interrupt_on_signals():
        try:
            lim = runner_limits.measure()
            ctx.lim = lim if ctx.lim is None else ctx.lim.best(lim)
            _run_with_bar(args, console, runner, ctx, output)
            ctx.lim = ctx.lim.best(runner_limits.measure())
            record = ctx.record(
                plan, runner.result(), _quality(args, plan, runner), True, runner.servers_done
            )
            save_record(record, output)
        except BaseException as exc:
            _interrupted(exc, ctx, plan, runner, output, argv)
            if isinstance(exc, KeyboardInterrupt):
                return 128 + int(getattr(exc, "signum", 2))
            raise
    return _finish(args, console, record, output)


def _run_with_bar(args, console, runner, ctx, output) -> None:  # noqa: ANN001
    """The runner's servers under a progress bar with an ETA; a checkpoint after each."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    from houchu.bench.sweep.report import save_record
    from houchu.bench.sweep.schedule import ServerEta

    eta = ServerEta(len(runner.jobs))
    with Progress(
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
        TextColumn("{task.fields[eta]}"),
        console=console,
        disable=args.no_progress,
        transient=False,
    ) as bar:
        task = bar.add_task("levers", total=runner.total_cells(), eta=eta.text())

        def progress(kind: str, text: str) -> None:
            if kind == "cell":
                bar.advance(task)
            bar.update(task, description=text[:90])

        def checkpoint(result: SweepResult) -> None:
            save_record(ctx.record(runner.plan, result, {}, False, runner.servers_done), output)
            eta.server_done()
            bar.update(task, eta=eta.text())

        runner.progress, runner.on_server = progress, checkpoint
        # written before the first server too: the path is writable, and a sweep killed
        # during it leaves a record (of no cell) to resume
        save_record(ctx.record(runner.plan, runner.result(), {}, False, 0), output)
        eta.start()
        runner.run()


def _quality(args, plan, runner) -> dict[str, dict[str, Any]]:  # noqa: ANN001
    """The lossy levers' accuracy against the exact path (none with --no-quality)."""
    from houchu.bench.sweep.quality import measure_quality

    if args.no_quality:
        return {}
    cases = {lv.name: lv.lossy for lv in plan.levers if lv.lossy is not None}
    base = runner.facts.get("baseline")
    dtype = base.dtype if base else "float32"
    return measure_quality(runner.inputs.model, cases, dtype, args.quality_text)


def _interrupted(exc, ctx, plan, runner, output, argv) -> None:  # noqa: ANN001
    """Stop any server left, write the partial record and say how to resume."""
    from houchu.bench.servers import stop_all
    from houchu.bench.sweep.report import save_record

    stop_all()
    result = runner.result()
    path = save_record(ctx.record(plan, result, {}, False, runner.servers_done), output)
    planned = len(plan.configs()) * len(plan.loads) * plan.repeats
    if isinstance(exc, KeyboardInterrupt):
        why = f"interrupted by {exc}" if getattr(exc, "signum", None) else "interrupted"
    else:
        why = f"failed ({type(exc).__name__}: {exc})"
    print(
        f"houchu levers: {why}: {len(result.runs)} of {planned} runs measured; "
        f"partial record: {path}\nresume with: {resume_command(argv, path)}",
        file=sys.stderr,
    )


def _finish(args, console, record, output) -> int:  # noqa: ANN001
    """Print the report, say where the record is and store it in the database."""
    from houchu.bench.sweep.report import print_report

    print_report(record, console)
    console.print(f"results: {output}")
    if not args.no_db:
        store_sweep(record, args.db, console)
    return 0 if record["runs"] else 1


def store_sweep(record: dict[str, Any], db: str | None, console: Any) -> None:
    """Store the sweep's answers in the database ``db`` (None: houchu's) beside the
    benchmark runs, for the dashboard, and say which run it became."""
    from houchu.bench.report import store

    row = store(
        {
            "name": record["name"],
            "settings": record["settings"],
            "results": {"kind": "lever_sweep", "answers": record["answers"]},
        },
        db,
    )
    console.print(f"database: run {row}" if row is not None else "database: not stored")
