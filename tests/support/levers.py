"""Shared data of the levers sweep's tests: the serve flags, a CPU machine, the
loads, a recorded cell run with the given figures, and a two-lever plan, its runs in
one go, and the ``houchu levers`` arguments and session that resume it."""

from __future__ import annotations

from pathlib import Path

from houchu.bench.sweep.levers import Machine
from houchu.bench.sweep.plan import Load, build_plan
from houchu.bench.sweep.records import CellRun
from houchu.options.flags import GROUPS

SERVE_FLAGS = frozenset(f.name for g in GROUPS for f in g.flags)
CPU = Machine("cpu", frozenset({"avx2", "fma"}), SERVE_FLAGS)
LOADS = [Load("concurrency", x) for x in (1, 4, 16)]


def run(config: str, load: float, tput: float, repeat: int = 0, **kw) -> CellRun:
    metrics = {
        "output_throughput": tput,
        "median_ttft_ms": kw.get("ttft", 100.0),
        "median_tpot_ms": kw.get("tpot", 10.0),
        "completed": 8,
        "failed": kw.get("failed", 0),
        "total_input_tokens": 8 * 32,
        "total_output_tokens": 8 * 16,
    }
    return CellRun(config, load, repeat, metrics, kw.get("ledger", {}))


LOADS2 = [Load("concurrency", x) for x in (1, 4)]
PLAN_ARGS = ["--levers", "radix-cache,int4", "--pairs", "all", "--concurrency", "1,4"]


def two_lever_plan(repeats: int = 2):
    # without houchu's defaults: the schedule's arithmetic below counts lever configs only
    return build_plan(["radix-cache", "int4"], "all", LOADS2, repeats, CPU, defaults=False)


def runs_in_one_go(plan) -> list:
    """Every cell of ``plan`` in the order one sweep measures them, with figures that
    differ per configuration, load and repeat."""
    speed = {"baseline": 10.0, "radix-cache": 12.0, "int4": 20.0, "int4+radix-cache": 23.0}
    return [
        run(c.name, ld.value, speed[c.name] * ld.value * (1 + 0.02 * rep), rep)
        for rep in range(plan.repeats)
        for c in plan.configs()
        for ld in plan.loads
    ]


def levers_args(tmp_path: Path, *extra: str):
    from houchu.cli.main import build_parsers

    parser, _ = build_parsers()
    argv = ["levers", *PLAN_ARGS, "--workload", "shared-prefix", "--max-duration", "20"]
    return parser.parse_args([*argv, "--model", str(tmp_path / "m.gguf"), *extra])


def start_levers_session(args, plan):
    from houchu.bench.sweep.cli import OBJECTIVES, _spec
    from houchu.bench.sweep.session import start_session

    spec = _spec(args)
    model = Path(args.model)
    return start_session(args, plan, spec, model, [], OBJECTIVES[args.objective])
