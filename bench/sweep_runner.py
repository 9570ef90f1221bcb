"""Running a lever sweep: fresh servers, one after another, each load level on each.

For each repeat, every configuration of the plan gets a fresh ``houchu serve`` (its
flags: the user's serve arguments, then each swept lever's on or off flags) with a
database of its own, so its ledger and step records are its alone. Configurations run
round-robin within a repeat, so a drift of the machine's speed during the sweep touches
every configuration alike. On one server each load level runs in turn: warm-up requests
first, then the measured run. The ledger counts of a measured run are the samples its
server reported between the run's start and end; since the runner reports its counters
once a second at a step, an idle second and one tiny request before the start and after
the end flush them into the right run.

A workload whose prompts do not change with the seed (a replay) would hit the prefix
cache on its second load level; it gets a fresh server per (configuration, load).
"""

from __future__ import annotations

import asyncio
import json
import os
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from houchu.bench.backend_ws import HouchuWsBackend
from houchu.bench.core import WARMUP_SEED_OFFSET, BenchSpec, benchmark
from houchu.bench.driver import RunConfig, run_sessions
from houchu.bench.prompts import PromptBuilder
from houchu.bench.servers import ManagedServer, ServerError, houchu_serve
from houchu.bench.sweep_plan import Config, Load, SweepPlan
from houchu.bench.sweep_records import METRICS, CellRun, ServerFacts, StepTotals, parse_runner_line
from houchu.bench.workloads import RequestSpec, Session

#: Seconds of quiet before a flush request (the runner reports its counters each second).
FLUSH_WAIT_S = 1.1
#: Seeds of the load levels and repeats differ by these strides (the same for every
#: configuration, so each configuration gets the same requests).
SEED_STRIDE_LOAD, SEED_STRIDE_REPEAT = 1_009, 100_003


@dataclass(frozen=True)
class SweepInputs:
    """What every server and run of a sweep shares.

    Attributes:
        model: the model file or folder.
        serve_args: ``houchu serve`` arguments given by the user, before the levers'.
        spec: the workload, request settings and warm-up (its arrival is replaced per
            load level).
        builder: the prompt builder.
        workdir: where each server's database goes.
        fresh_per_load: a fresh server per load level (replays).
        ws_connections: WebSocket connections the load generator spreads requests over.
        start_timeout_s: seconds a server may take to start.
    """

    model: Path
    serve_args: list[str]
    spec: BenchSpec
    builder: PromptBuilder
    workdir: Path
    fresh_per_load: bool = False
    ws_connections: int = 4
    start_timeout_s: float = 600.0


#: Progress events: ("server", text) when a server starts, ("fail", why) when a
#: configuration fails, ("cell", text) once per planned run, measured or not.
Progress = Callable[[str, str], None]


@dataclass
class SweepResult:
    """Everything measured.

    Attributes:
        runs: one per (configuration, load, repeat) measured.
        facts: ``{configuration: ServerFacts}`` of its first server.
        failures: ``{configuration: why}`` for configurations whose server or run failed.
        seconds: the sweep's wall time.
    """

    runs: list[CellRun]
    facts: dict[str, ServerFacts]
    failures: dict[str, str]
    seconds: float


def load_spec(spec: BenchSpec, load: Load, seed: int) -> BenchSpec:
    """``spec`` at one load level with ``seed`` (closed loop at a concurrency, or Poisson
    arrivals at a rate with no cap); no progress bar of its own."""
    if load.kind == "concurrency":
        run = RunConfig(int(load.value), None, spec.run.max_duration_s, seed, progress=False)
    else:
        run = RunConfig(None, load.value, spec.run.max_duration_s, seed, progress=False)
    return replace(spec, run=run)


def warmup_spec(spec: BenchSpec) -> BenchSpec:
    """``spec.warmup`` requests of the workload with other prompts (another seed; a
    replay's warm-up is random prompts, so that it does not cache the replayed ones)."""
    kind = "random" if spec.workload.kind == "replay" else spec.workload.kind
    workload = replace(spec.workload, kind=kind, num_requests=spec.warmup)
    run = replace(spec.run, seed=spec.run.seed + WARMUP_SEED_OFFSET)
    return replace(spec, workload=workload, run=run, warmup=0)


def _get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=30) as r:
        return json.loads(r.read())


class SweepRunner:
    """Runs a plan's cells on fresh servers (see the module docstring)."""

    def __init__(self, plan: SweepPlan, inputs: SweepInputs, progress: Progress) -> None:
        self.plan = plan
        self.inputs = inputs
        self.progress = progress
        self.runs: list[CellRun] = []
        self.facts: dict[str, ServerFacts] = {}
        self.failures: dict[str, str] = {}
        self._n_db = 0

    def total_cells(self) -> int:
        """Measured runs the plan asks for."""
        return len(self.plan.configs()) * len(self.plan.loads) * self.plan.repeats

    def run(self) -> SweepResult:
        """Every cell of the plan, in order; a configuration whose server fails to start
        is recorded in ``failures`` (its cells are not measured) and the sweep goes on."""
        t0 = time.perf_counter()
        self.inputs.workdir.mkdir(parents=True, exist_ok=True)
        for repeat in range(self.plan.repeats):
            for config in self.plan.configs():
                if config.name in self.failures:
                    for _ in self.plan.loads:
                        self.progress("cell", f"{config.name}: not measured (failed before)")
                    continue
                groups = (
                    [[i] for i in range(len(self.plan.loads))]
                    if self.inputs.fresh_per_load
                    else [list(range(len(self.plan.loads)))]
                )
                for idx in groups:
                    self._on_server(config, repeat, idx)
        return SweepResult(self.runs, self.facts, self.failures, time.perf_counter() - t0)

    def _on_server(self, config: Config, repeat: int, load_idx: list[int]) -> None:
        self._n_db += 1
        db = self.inputs.workdir / f"server{self._n_db}.db"
        db_url = f"sqlite:///{db}"
        flags = [*self.inputs.serve_args, *self.plan.flags(config), "--db-url", db_url]
        server = houchu_serve(self.inputs.model, flags, keep_prefix="houchu runner:")
        self.progress("server", f"{config.name} (repeat {repeat + 1}): {' '.join(flags)}")
        t = time.perf_counter()
        try:
            server.start(self.inputs.start_timeout_s)
        except ServerError as exc:
            tail = "\n".join(str(exc).strip().splitlines()[-4:])
            self.failures[config.name] = f"server did not start: {tail}"
            self.progress("fail", f"{config.name}: server did not start")
            for _ in load_idx:
                self.progress("cell", f"{config.name}: not measured")
            return
        facts = parse_runner_line(server.kept[0] if server.kept else "", time.perf_counter() - t)
        self.facts.setdefault(config.name, facts)
        windows: list[tuple[int, float, float, int]] = []
        try:
            for i in load_idx:
                windows.append(asyncio.run(self._cell(server, config, repeat, i)))
        except Exception as exc:  # noqa: BLE001 - a failed run is recorded, the sweep goes on
            self.failures[config.name] = f"run failed: {type(exc).__name__}: {exc}"
            self.progress("fail", f"{config.name}: {self.failures[config.name]}")
            for _ in load_idx[len(windows) :]:
                self.progress("cell", f"{config.name}: not measured")
        finally:
            server.stop()
        self._read_db(db_url, windows)
        if db.exists() and not os.environ.get("HOUCHU_LEVERS_KEEP_DB"):
            for suffix in ("", "-wal", "-shm", ".migrate-lock"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)

    async def _cell(
        self, server: ManagedServer, config: Config, repeat: int, i: int
    ) -> tuple[int, float, float, int]:
        """One load level on a running server; returns (run index, t0, t1, preemptions)."""
        load = self.plan.loads[i]
        seed = self.inputs.spec.run.seed + SEED_STRIDE_LOAD * i + SEED_STRIDE_REPEAT * repeat
        spec = load_spec(self.inputs.spec, load, seed)
        url = f"ws://127.0.0.1:{server.port}/ws"
        stats_url = f"http://127.0.0.1:{server.port}/stats"
        name = f"{config.name} {load.label} #{repeat + 1}"
        params = spec.params
        conns = self.inputs.ws_connections
        if spec.warmup:
            warm = warmup_spec(spec)
            await benchmark(HouchuWsBackend(url, params, conns), warm, self.inputs.builder, name)
        await self._flush(url, params)
        pre0 = int(_get_json(stats_url).get("num_preemptions", 0))
        t0 = time.time()
        measured = replace(spec, warmup=0)
        record = await benchmark(
            HouchuWsBackend(url, params, conns), measured, self.inputs.builder, name
        )
        await self._flush(url, params)
        t1 = time.time()
        pre1 = int(_get_json(stats_url).get("num_preemptions", 0))
        metrics = {m: record["results"].get(m) for m in METRICS}
        self.runs.append(CellRun(config.name, load.value, repeat, metrics))
        self.progress("cell", f"{name}: {metrics['output_throughput'] or 0:.1f} tok/s")
        return len(self.runs) - 1, t0, t1, pre1 - pre0

    @staticmethod
    async def _flush(url: str, params) -> None:  # noqa: ANN001
        """An idle second, then a one-token request: the runner reports its counters."""
        await asyncio.sleep(FLUSH_WAIT_S)
        backend = HouchuWsBackend(url, params, 1)
        await backend.start()
        try:
            one = Session([RequestSpec("flush", None, 1, "flush")])
            await run_sessions(backend, [one], RunConfig(concurrency=1, progress=False))
        finally:
            await backend.close()

    def _read_db(self, db_url: str, windows: list[tuple[int, float, float, int]]) -> None:
        """Each run's ledger and steps, from its server's database (after the server
        stopped: the recorder has written everything)."""
        if not windows:
            return
        from houchu.storage.db import open_db
        from houchu.storage.sweep_view import ledger_between, steps_between

        engine = open_db(db_url)
        try:
            for k, t0, t1, pre in windows:
                run = self.runs[k]
                run.ledger = ledger_between(engine, t0, t1)
                run.steps = StepTotals(**steps_between(engine, t0, t1))
                run.preemptions = pre
        finally:
            engine.dispose()
