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

The servers to start come from ``houchu.bench.sweep.schedule.server_jobs``: with the
runs of an earlier, interrupted session (``prior``), only the cells it did not measure.
A server's runs join the sweep's after the server stopped and its database was read, so
after each server (``on_server``) the runs are whole; a server interrupted midway
(SIGINT, SIGTERM: ``KeyboardInterrupt``) is stopped and its runs left to a resumed sweep.
"""

from __future__ import annotations

import asyncio
import json
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from houchu import env as env_vars
from houchu.bench.backends.ws import HouchuWsBackend
from houchu.bench.core import WARMUP_SEED_OFFSET, BenchSpec, benchmark
from houchu.bench.driver import RunConfig, run_sessions
from houchu.bench.prompts import PromptBuilder
from houchu.bench.servers import ManagedServer, ServerError, houchu_serve
from houchu.bench.sweep.plan import Load, SweepPlan
from houchu.bench.sweep.records import (
    CELL_METRICS,
    CellRun,
    ServerFacts,
    StepTotals,
    SweepResult,
    parse_runner_line,
    summary_line,
)
from houchu.bench.sweep.schedule import ServerJob, in_plan_order, measured_cells, server_jobs
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
#: Called after each server with the sweep's result so far (its runs whole).
OnServer = Callable[[SweepResult], None]
Window = tuple[CellRun, float, float, int]  # a run, its start and end (epoch s), preemptions


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
    """Runs a plan's cells on fresh servers (see the module docstring).

    Args:
        plan: the sweep plan.
        inputs: what every server and run shares.
        progress: called on each progress event.
        prior: the measurements of an earlier session of this sweep (resumed): its cells
            are not measured again, its runs and facts are kept.
        on_server: called after each server (a checkpoint).
    """

    def __init__(
        self,
        plan: SweepPlan,
        inputs: SweepInputs,
        progress: Progress,
        prior: SweepResult | None = None,
        on_server: OnServer | None = None,
    ) -> None:
        self.plan = plan
        self.inputs = inputs
        self.progress = progress
        self.on_server = on_server
        self.runs: list[CellRun] = list(prior.runs) if prior else []
        self.facts: dict[str, ServerFacts] = dict(prior.facts) if prior else {}
        self.failures: dict[str, str] = {}
        self.jobs: list[ServerJob] = server_jobs(
            plan, inputs.fresh_per_load, measured_cells(self.runs)
        )
        self.servers_done = 0
        self._prior_s = prior.seconds if prior else 0.0
        self._t0 = time.perf_counter()
        self._n_db = 0

    def total_cells(self) -> int:
        """Measured runs this session asks for (all of the plan's unless resumed)."""
        return sum(len(j.loads) for j in self.jobs)

    def result(self) -> SweepResult:
        """The sweep so far: every whole run (the earlier sessions' too) in sweep
        order, the facts, the failures and the wall time."""
        seconds = self._prior_s + time.perf_counter() - self._t0
        runs = in_plan_order(self.plan, self.runs)
        return SweepResult(runs, dict(self.facts), dict(self.failures), seconds)

    def run(self) -> SweepResult:
        """Every server of ``jobs``, in order; a configuration whose server fails to
        start or whose run fails is recorded in ``failures`` (its later cells are not
        measured) and the sweep goes on.

        Raises:
            KeyboardInterrupt: a signal stopped the sweep (the running server was
                stopped; ``result()`` holds the whole runs so far).
        """
        self._t0 = time.perf_counter()
        self.inputs.workdir.mkdir(parents=True, exist_ok=True)
        for job in self.jobs:
            if job.config.name in self.failures:
                for _ in job.loads:
                    self.progress("cell", f"{job.config.name}: not measured (failed before)")
            else:
                self._on_server(job)
            self.servers_done += 1
            if self.on_server is not None:
                self.on_server(self.result())
        return self.result()

    def _on_server(self, job: ServerJob) -> None:
        config, repeat = job.config, job.repeat
        self._n_db += 1
        db = self.inputs.workdir / f"server{self._n_db}.db"
        db_url = f"sqlite:///{db}"
        flags = [*self.inputs.serve_args, *self.plan.flags(config), "--db-url", db_url]
        server = houchu_serve(self.inputs.model, flags, keep_prefix="houchu runner:")
        self.progress("server", f"{config.name} (repeat {repeat + 1}): {' '.join(flags)}")
        windows: list[Window] = []
        try:
            t = time.perf_counter()
            try:
                server.start(self.inputs.start_timeout_s)
            except ServerError as exc:
                tail = "\n".join(str(exc).strip().splitlines()[-4:])
                self.failures[config.name] = f"server did not start: {tail}"
                self.progress("fail", f"{config.name}: server did not start")
                for _ in job.loads:
                    self.progress("cell", f"{config.name}: not measured")
                return
            facts = parse_runner_line(summary_line(server.kept), time.perf_counter() - t)
            try:
                for i in job.loads:
                    windows.append(asyncio.run(self._cell(server, job, i)))
            except Exception as exc:  # noqa: BLE001 - a failed run is recorded, the sweep goes on
                self.failures[config.name] = f"run failed: {type(exc).__name__}: {exc}"
                self.progress("fail", f"{config.name}: {self.failures[config.name]}")
                for _ in job.loads[len(windows) :]:
                    self.progress("cell", f"{config.name}: not measured")
        finally:
            server.stop()  # also when interrupted, starting or measuring
        self._read_db(db_url, windows)
        self.facts.setdefault(config.name, facts)
        self.runs += [w[0] for w in windows]
        if db.exists() and not env_vars.levers_keep_db():
            for suffix in ("", "-wal", "-shm", ".migrate-lock"):
                Path(f"{db}{suffix}").unlink(missing_ok=True)

    async def _cell(self, server: ManagedServer, job: ServerJob, i: int) -> Window:
        """Load level ``i`` on a running server; returns its run (ledger and steps read
        from the database after the server stopped), t0, t1 and the preemptions."""
        config, repeat, load = job.config, job.repeat, self.plan.loads[i]
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
        metrics = {m: record["results"].get(m) for m in CELL_METRICS}
        self.progress("cell", f"{name}: {metrics['output_throughput'] or 0:.1f} tok/s")
        return CellRun(config.name, load.value, repeat, metrics), t0, t1, pre1 - pre0

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

    def _read_db(self, db_url: str, windows: list[Window]) -> None:
        """Each run's ledger and steps, from its server's database (after the server
        stopped: the recorder has written everything)."""
        if not windows:
            return
        from houchu.storage.db import open_db
        from houchu.storage.sweep_view import ledger_between, steps_between

        engine = open_db(db_url)
        try:
            for run, t0, t1, pre in windows:
                run.ledger = ledger_between(engine, t0, t1)
                run.steps = StepTotals(**steps_between(engine, t0, t1))
                run.preemptions = pre
        finally:
            engine.dispose()
