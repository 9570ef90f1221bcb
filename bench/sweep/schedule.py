"""The servers a lever sweep starts, which of its cells are measured, and how long it takes.

A sweep's unit of work is one server: a fresh ``houchu serve`` of one configuration in
one repeat that runs every load level in turn (or one level, for a replay: see
``houchu.bench.sweep.runner``). A *cell* is one (configuration, load, repeat): one
measured run. A sweep resumed from a partial record starts only the servers whose cells
are not measured yet, each for its missing loads, in the order of the whole sweep.

The estimate before the first server is an upper bound when each run is bounded
(``--max-duration``): every run's warm-up and measured requests stop at that limit, its
two counter flushes take :data:`FLUSH_ALLOWANCE_S`, and each server gets
:data:`STARTUP_ALLOWANCE_S` to start and stop. Once servers have finished, the time left
is their mean measured duration times the servers left (:class:`ServerEta`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from houchu.bench.sweep.plan import Config, SweepPlan
from houchu.bench.sweep.records import CellRun

#: Seconds allowed per server to start and stop (the default model with ``--compile
#: off`` starts in 5-20 s on 2 cores; compiling adds ~17 s).
STARTUP_ALLOWANCE_S = 60.0
#: Seconds per run for its two counter flushes (an idle second, then one tiny request).
FLUSH_ALLOWANCE_S = 2 * 1.5

Cell = tuple[str, float, int]  # (configuration name, load value, repeat)


@dataclass(frozen=True)
class ServerJob:
    """One server of the sweep: ``config`` in ``repeat``, running the load levels at
    indices ``loads`` of the plan's loads, in that order."""

    config: Config
    repeat: int
    loads: tuple[int, ...]


def server_jobs(
    plan: SweepPlan, fresh_per_load: bool, measured: Iterable[Cell] = ()
) -> list[ServerJob]:
    """The servers to start, in sweep order (per repeat, each configuration round-robin),
    leaving out the cells in ``measured``; a server with no cell left is not started.

    Args:
        plan: the sweep plan.
        fresh_per_load: one server per load level (a replay) instead of one for all.
        measured: cells already measured (a resumed sweep's).
    """
    done = set(measured)
    jobs = []
    for repeat in range(plan.repeats):
        for config in plan.configs():
            todo = [
                i for i, ld in enumerate(plan.loads) if (config.name, ld.value, repeat) not in done
            ]
            groups = [[i] for i in todo] if fresh_per_load else [todo]
            jobs += [ServerJob(config, repeat, tuple(g)) for g in groups if g]
    return jobs


def measured_cells(runs: Iterable[CellRun]) -> list[Cell]:
    """The cells ``runs`` measured."""
    return [(r.config, r.load, r.repeat) for r in runs]


def in_plan_order(plan: SweepPlan, runs: Iterable[CellRun]) -> list[CellRun]:
    """``runs`` in the order one uninterrupted sweep measures them (repeat, then
    configuration, then load), so a resumed sweep's record reads as one run in one go;
    runs of configurations or loads not in the plan go last."""
    configs = {c.name: i for i, c in enumerate(plan.configs())}
    loads = {ld.value: i for i, ld in enumerate(plan.loads)}
    n = len(configs) + len(loads)

    def key(r: CellRun) -> tuple[int, int, int]:
        return (r.repeat, configs.get(r.config, n), loads.get(r.load, n))

    return sorted(runs, key=key)


def _cell_json(cell: Cell) -> dict[str, Any]:
    return {"config": cell[0], "load": cell[1], "repeat": cell[2]}


def sweep_state(
    plan: SweepPlan, runs: list[CellRun], complete: bool, parts: list[dict[str, Any]]
) -> dict[str, Any]:
    """A record's ``sweep`` block: whether the sweep ran to its end (``complete``; a
    configuration that failed leaves its cells missing even then), the cells measured
    and those missing (each ``{config, load, repeat}``, in sweep order), and ``parts``:
    one ``{date, seconds, servers}`` per session that measured them."""
    done = set(measured_cells(runs))
    planned = [
        (c.name, ld.value, rep)
        for rep in range(plan.repeats)
        for c in plan.configs()
        for ld in plan.loads
    ]
    return {
        "complete": complete,
        "measured": [_cell_json(c) for c in planned if c in done],
        "missing": [_cell_json(c) for c in planned if c not in done],
        "parts": parts,
    }


def duration_text(seconds: float) -> str:
    """``3h 41m``, ``12m 05s`` or ``45 s``."""
    s = round(seconds)
    if s >= 3600:
        return f"{s // 3600}h {s % 3600 // 60:02d}m"
    if s >= 60:
        return f"{s // 60}m {s % 60:02d}s"
    return f"{s} s"


@dataclass(frozen=True)
class Estimate:
    """How long the servers of a sweep take, before any has run.

    Attributes:
        servers: servers to start.
        runs: measured runs (cells).
        upper_s: the upper bound, in seconds (None when runs are not bounded).
        startup_s: the start-up allowance of all the servers, in seconds.
    """

    servers: int
    runs: int
    upper_s: float | None
    startup_s: float

    def text(self) -> str:
        """One line, e.g. ``48 servers, 144 measured runs; at most 4h 10m (...)``."""
        head = f"{self.servers} servers, {self.runs} measured runs"
        if self.upper_s is None:
            return (
                f"{head}; no upper bound on the duration: runs are not time-limited "
                f"(--max-duration S bounds each); start-ups alone "
                f"~{duration_text(self.startup_s)}; the progress bar's ETA follows the "
                f"first server"
            )
        return (
            f"{head}; at most {duration_text(self.upper_s)} (each run and its warm-up "
            f"within --max-duration, {STARTUP_ALLOWANCE_S:g} s per server to start); the "
            f"progress bar's ETA follows the first server"
        )


def estimate(jobs: list[ServerJob], max_duration_s: float | None, warmup: int) -> Estimate:
    """The estimate of running ``jobs`` (see the module docstring): ``max_duration_s``
    bounds each run's measured requests and, with ``warmup`` requests, its warm-up."""
    runs = sum(len(j.loads) for j in jobs)
    startup = len(jobs) * STARTUP_ALLOWANCE_S
    if max_duration_s is None:
        return Estimate(len(jobs), runs, None, startup)
    per_run = max_duration_s * (2 if warmup else 1) + FLUSH_ALLOWANCE_S
    return Estimate(len(jobs), runs, runs * per_run + startup, startup)


class ServerEta:
    """Time left in a sweep from the measured durations of its finished servers.

    ``start`` when the first server starts, ``server_done`` after each; ``eta_s`` is
    then the mean duration so far times the servers left.
    """

    def __init__(self, servers: int, clock: Callable[[], float] = time.monotonic) -> None:
        self.servers = servers
        self.clock = clock
        self.done = 0
        self._t0: float | None = None

    def start(self) -> None:
        """The sweep's first server starts now."""
        self._t0 = self.clock()

    def server_done(self) -> None:
        """One more server finished (measured, or failed)."""
        self.done += 1

    def eta_s(self) -> float | None:
        """Seconds left, or None before a server finished."""
        if self._t0 is None or self.done == 0:
            return None
        per_server = (self.clock() - self._t0) / self.done
        return per_server * max(0, self.servers - self.done)

    def text(self) -> str:
        """``ETA 1h 20m`` (``ETA after the first server`` before one finished)."""
        eta = self.eta_s()
        return "ETA after the first server" if eta is None else f"ETA {duration_text(eta)}"
