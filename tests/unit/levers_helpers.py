"""Shared data of the levers sweep's unit tests: the serve flags, a CPU machine, the
loads, and a recorded cell run with the given figures."""

from __future__ import annotations

from houchu.bench.sweep.levers import Machine
from houchu.bench.sweep.plan import Load
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
