"""The device check (issue 18): on a fresh GPU machine, one command installs houchu,
runs its CUDA tests and golden check, serves the default model and benchmarks it, and says
whether the goals are met.

    python -m houchu.devtools.gpu_check OUTDIR [--wheels DIR] [--model PATH] [--dry-run]
        [--skip-install] [--steps NAME,...] [--timeout SECONDS] [--work DIR]

On a machine where houchu is not installed yet, run the same file by its path from the
repository root (it makes ``houchu`` importable first): ``python devtools/gpu_check.py OUTDIR
--wheels DIR``.

Steps, in order, each with a timeout of its own within ``--timeout`` (default 360 s, so
the whole ends inside 6 minutes and a 15-minute device lease holds a rerun; a step that
would start with under 15 s left is skipped): ``install`` (``houchu.devtools.gpu.install``), ``machine``, ``model``,
``gpu_tests``, ``golden``, ``serve_bench`` and ``runner_bench``
(``houchu.devtools.gpu.steps``). A failing step is recorded and the next one runs.

Output: ``OUTDIR/gpu_check.log`` (each command and its output) and ``OUTDIR/gpu_check.json``
(the machine's facts, the model, each step's status "ok" / "failed" / "skipped" with the
reason, its seconds, commands and numbers, and the goals: ``houchu.devtools.gpu.goals``),
rewritten after every step. Scratch files (the stand-in model, the bench records) go to
``--work`` (default: the system's temporary folder), not OUTDIR.

``--dry-run`` runs it all on the CPU (CUDA hidden from the children): the install is
checked, not made; the CUDA tests and the golden test are collected, not run; the serve
bench runs one stream of three short requests on the CPU; the runner benchmark one small
CPU table; each step that needs the GPU is marked skipped with the reason.

Exit status: 0 when no step failed, 1 otherwise, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # imported for real after _bootstrap
    from houchu.devtools.gpu.run import Context, Step

REPO = Path(__file__).resolve().parent.parent
#: Correctness first (the CUDA tests, then the golden check), then the speed goals.
STEPS = ("install", "machine", "model", "gpu_tests", "golden", "serve_bench", "runner_bench")
#: Seconds each step may take at most (less when less of ``--timeout`` is left). Their
#: sum is above the budget: a step rarely uses its whole cap, and the budget bounds all.
STEP_CAPS = {
    "install": 60,
    "machine": 30,
    "model": 60,
    "gpu_tests": 150,  # about 60 tests, 40-60 Triton kernels compiled from cold
    "serve_bench": 120,
    "runner_bench": 90,
    "golden": 90,
}
#: A dry run's caps where they differ: serving on a small CPU machine may first build
#: houchu's C++ CPU kernels (about 2 minutes on 2 cores, once per source version).
DRY_STEP_CAPS = {"serve_bench": 360, "runner_bench": 240}
#: The whole check on a GPU machine: 6 minutes, so that one lease of 15 minutes of device
#: time (machine starts of 1-2 minutes each included) holds the check and one rerun.
DEFAULT_TIMEOUT_S = 360.0
DRY_TIMEOUT_S = 900.0  # a dry run on a small CPU machine (2 cores: serving is slow)
MIN_STEP_S = 15.0  # a step with less time than this left is skipped


def _bootstrap() -> None:
    """Run by path (``python devtools/gpu_check.py``): make ``houchu`` importable from this
    repository through a link in the temporary folder, and drop ``devtools/`` from the
    import path (its modules are not top-level ones)."""
    if __package__:
        return
    import hashlib

    tag = hashlib.sha256(str(REPO).encode()).hexdigest()[:12]  # one link per checkout
    pkg = Path(tempfile.gettempdir()) / f"houchu-gpu-check-pkg-{tag}"
    pkg.mkdir(exist_ok=True)
    link = pkg / "houchu"
    if link.is_symlink() and link.resolve() != REPO:
        link.unlink()
    if not link.exists():
        link.symlink_to(REPO, target_is_directory=True)
    if sys.path and Path(sys.path[0]).resolve() == REPO / "devtools":
        sys.path.pop(0)
    sys.path.insert(0, str(pkg))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m houchu.devtools.gpu_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("outdir", type=Path, help="where gpu_check.log and gpu_check.json go")
    p.add_argument(
        "--wheels", type=Path, help="the wheels folder (python -m houchu.devtools.gpu.wheels)"
    )
    p.add_argument(
        "--model", help="a .gguf or HF folder (default: the default model, or its stand-in)"
    )
    p.add_argument("--dry-run", action="store_true", help="on the CPU, GPU steps skipped")
    p.add_argument(
        "--skip-install", action="store_true", help="check the packages, install nothing"
    )
    p.add_argument(
        "--steps", help=f"comma-separated steps to run (default: all of {','.join(STEPS)})"
    )
    p.add_argument(
        "--timeout", type=float, help="seconds for the whole check (default 360; dry run 900)"
    )
    p.add_argument("--work", type=Path, help="scratch folder (default: TMP/houchu-gpu-check)")
    args = p.parse_args(argv)
    chosen = args.steps.split(",") if args.steps else list(STEPS)
    unknown = sorted(set(chosen) - set(STEPS))
    if unknown:
        p.error(f"--steps: unknown {', '.join(unknown)} (steps: {', '.join(STEPS)})")
    args.steps = set(chosen)
    if args.wheels is not None and not args.wheels.is_dir():
        p.error(f"--wheels {args.wheels}: not a folder")
    if args.timeout is None:
        args.timeout = DRY_TIMEOUT_S if args.dry_run else DEFAULT_TIMEOUT_S
    if args.timeout <= 0:
        p.error("--timeout must be positive")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the check; returns the exit status."""
    args = parse_args(argv)
    from houchu.devtools.gpu.run import Context, Step

    ctx = Context(args.outdir.resolve(), args.timeout, REPO)
    ctx.dry_run = args.dry_run
    ctx.wheels = args.wheels.resolve() if args.wheels else None
    ctx.work = (args.work or Path(tempfile.gettempdir()) / "houchu-gpu-check").resolve()
    ctx.work.mkdir(parents=True, exist_ok=True)
    if args.dry_run:
        ctx.env["CUDA_VISIBLE_DEVICES"] = ""  # the children compute on the CPU
    started = dt.datetime.now(dt.timezone.utc)
    ctx.log(f"[gpu_check] {started:%Y-%m-%d %H:%M:%S} UTC: {' '.join(sys.argv)}")
    ctx.log(f"[gpu_check] repo {REPO}, python {sys.executable}, budget {args.timeout:.0f} s")
    steps: list[Step] = []
    try:
        for name in STEPS:
            step = Step(name)
            steps.append(step)
            t0 = time.monotonic()
            ctx.log(f"\n[gpu_check] ==== {name} ({ctx.remaining():.0f} s left)")
            try:
                run_step(ctx, step, args)
            except Exception as exc:  # noqa: BLE001 (a step's failure must not stop the others)
                ctx.log(traceback.format_exc())
                step.fail(f"{type(exc).__name__}: {exc}")
            step.duration_s = time.monotonic() - t0
            ctx.log(f"[gpu_check] {name}: {step.status} {step.reason}".rstrip())
            write_json(ctx, steps, started, args, final=False)
        record = write_json(ctx, steps, started, args, final=True)
        from houchu.devtools.gpu.goals import summary_lines

        for line in summary_lines(record["steps"], record["goals"], ctx.facts, ctx.model):
            ctx.log(line)
        ctx.log(
            f"[gpu_check] log: {ctx.log_path}\n[gpu_check] json: {ctx.outdir / 'gpu_check.json'}"
        )
    finally:
        ctx.close()
    return 1 if any(s.status == "failed" for s in steps) else 0


def run_step(ctx: Context, step: Step, args: argparse.Namespace) -> None:
    """Run step ``step.name`` within what is left of the budget, or skip it."""
    from houchu.devtools.gpu import steps
    from houchu.devtools.gpu.install import install_step

    if step.name not in args.steps:
        step.skip("not selected (--steps)")
        return
    caps = {**STEP_CAPS, **DRY_STEP_CAPS} if args.dry_run else STEP_CAPS
    timeout_s = min(caps[step.name], ctx.remaining() - 5)
    if timeout_s < MIN_STEP_S:
        step.skip(f"out of time: {ctx.remaining():.0f} s left of --timeout {args.timeout:.0f}")
        return
    if step.name == "install":
        check_only = args.dry_run or args.skip_install
        step.results["mode"] = "check only" if check_only else "install"
        install_step(ctx, step, install=not check_only)
    elif step.name == "machine":
        steps.machine_step(ctx, step, timeout_s)
    elif step.name == "model":
        steps.model_step(ctx, step, args.model)
    elif step.name == "gpu_tests":
        steps.gpu_tests_step(ctx, step, timeout_s)
    elif step.name == "serve_bench":
        steps.serve_bench_step(ctx, step, timeout_s)
    elif step.name == "runner_bench":
        steps.runner_bench_step(ctx, step, timeout_s)
    elif step.name == "golden":
        steps.golden_step(ctx, step, timeout_s)
    if ctx.dry_run and step.name == "serve_bench" and step.status == "ok":
        step.results["mode"] = "reduced (dry run, CPU)"


def write_json(
    ctx: Context, steps: list[Step], started: dt.datetime, args: argparse.Namespace, final: bool
) -> dict[str, Any]:
    """Write ``OUTDIR/gpu_check.json`` (see the module docstring); returns the record.
    The goals are evaluated on the serve bench's and the runner benchmark's numbers when
    they ran on a GPU."""
    from houchu.devtools.gpu.goals import evaluate_goals

    by_name = {s.name: s for s in steps}
    serve = by_name.get("serve_bench")
    runner = by_name.get("runner_bench")
    bench = serve.results.get("bench", {}) if serve else {}
    rows = runner.results.get("rows", []) if runner else []
    on_gpu = ctx.cuda() and any(
        s is not None and s.results.get("device") == "cuda" for s in (serve, runner)
    )
    note = ctx.model.get("note", "") if ctx.model.get("kind") == "stand-in" else ""
    record = {
        "version": 1,
        "started": started.isoformat(),
        "duration_s": round(time.monotonic() - ctx.t0, 1),
        "finished": final,
        "dry_run": ctx.dry_run,
        "argv": sys.argv,
        "repo": str(ctx.repo),
        "machine": ctx.facts,
        "model": ctx.model,
        "steps": [s.record() for s in steps],
        "goals": evaluate_goals(bench, rows, on_gpu, note),
    }
    path = ctx.outdir / "gpu_check.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=2, default=str))
    tmp.replace(path)
    return record


if __name__ == "__main__":
    _bootstrap()
    raise SystemExit(main())
