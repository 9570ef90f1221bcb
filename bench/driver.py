"""Driving a backend with a workload: arrival, concurrency, warm-up, limits, progress.

Sessions arrive either as fast as ``concurrency`` allows (a closed loop: a new session
starts when one ends) or by a Poisson process of ``request_rate`` sessions per second
(optionally capped by ``concurrency`` too). The arrival times come from the seed, so two
runs send the same requests in the same order at the same offsets. Warm-up sessions
run first and are not measured. A run stops issuing at ``max_duration_s`` and cancels
what is still in flight; those requests are reported as ``incomplete``.
"""

from __future__ import annotations

import asyncio
import random
import time
from dataclasses import dataclass, field

from tqdm import tqdm

from houchu.bench.backends.base import Backend
from houchu.bench.metrics import RequestResult
from houchu.bench.workloads import Message, Session


@dataclass(frozen=True)
class RunConfig:
    """How requests are issued.

    Attributes:
        concurrency: most sessions in flight at once (None: no cap).
        request_rate: Poisson arrival rate in sessions per second (None: closed loop).
        max_duration_s: seconds after which no request starts and in-flight ones are
            cancelled (None: no limit).
        seed: seeds the arrival times.
        progress: show a progress bar on stderr.
    """

    concurrency: int | None = 1
    request_rate: float | None = None
    max_duration_s: float | None = None
    seed: int = 0
    progress: bool = True

    def settings(self) -> dict[str, object]:
        """JSON-ready values."""
        return {
            "concurrency": self.concurrency,
            "request_rate": self.request_rate,
            "max_duration_s": self.max_duration_s,
            "seed": self.seed,
        }


@dataclass
class RunOutcome:
    """Measured requests and the run's wall time.

    Attributes:
        results: one per request that was sent and ended (success or failure).
        duration_s: seconds from the first send to the end of the last request.
        incomplete: requests cancelled at the time limit.
        not_sent: requests never sent (time limit, or a failed earlier turn).
    """

    results: list[RequestResult] = field(default_factory=list)
    duration_s: float = 0.0
    incomplete: int = 0
    not_sent: int = 0


def arrival_offsets(n: int, rate: float | None, seed: int) -> list[float]:
    """Start offsets in seconds of ``n`` sessions: all 0 without a rate, else Poisson."""
    if rate is None or rate <= 0 or rate == float("inf"):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


class _Run:
    """State of one run: results, in-flight requests, the progress bar."""

    def __init__(self, backend: Backend, cfg: RunConfig, bar: tqdm | None) -> None:
        self.backend = backend
        self.cfg = cfg
        self.bar = bar
        self.results: list[RequestResult] = []
        self.in_flight = 0
        self.not_sent = 0
        self.deadline = float("inf")

    async def session(self, s: Session, sem: asyncio.Semaphore | None) -> None:
        try:
            history: list[Message] = []
            for i, turn in enumerate(s.turns):
                if time.perf_counter() >= self.deadline:
                    self.not_sent += len(s.turns) - i
                    return
                result = RequestResult(turn.tag, time.perf_counter())
                self.in_flight += 1
                await self.backend.generate(turn, history, result)
                self.in_flight -= 1
                self.results.append(result)
                if self.bar is not None:
                    self.bar.update(1)
                if not result.ok:
                    self.not_sent += len(s.turns) - i - 1
                    return
                if s.multi_turn:
                    asked = turn.chat([])[-1]
                    history = [*history, asked, {"role": "assistant", "content": result.text}]
        finally:
            if sem is not None:
                sem.release()


async def run_sessions(
    backend: Backend, sessions: list[Session], cfg: RunConfig, desc: str = ""
) -> RunOutcome:
    """Send every session's requests to ``backend`` as ``cfg`` says; collect the results."""
    total = sum(len(s.turns) for s in sessions)
    bar = tqdm(
        total=total, desc=desc or backend.name, unit="req", disable=not cfg.progress, leave=False
    )
    run = _Run(backend, cfg, bar)
    sem = asyncio.Semaphore(cfg.concurrency) if cfg.concurrency else None
    offsets = arrival_offsets(len(sessions), cfg.request_rate, cfg.seed)
    t0 = time.perf_counter()
    if cfg.max_duration_s is not None:
        run.deadline = t0 + cfg.max_duration_s
    tasks: list[asyncio.Task[None]] = []
    try:
        for k, (s, off) in enumerate(zip(sessions, offsets, strict=True)):
            wait = t0 + off - time.perf_counter()
            if wait > 0:
                await asyncio.sleep(min(wait, max(0.0, run.deadline - time.perf_counter())))
            got = await _acquire(sem, run.deadline) if sem is not None else True
            if time.perf_counter() >= run.deadline:
                if sem is not None and got:
                    sem.release()
                run.not_sent += sum(len(x.turns) for x in sessions[k:])
                break
            tasks.append(asyncio.create_task(run.session(s, sem)))
        if tasks:
            remaining = (
                None
                if run.deadline == float("inf")
                else max(0.0, run.deadline - time.perf_counter())
            )
            _, pending = await asyncio.wait(tasks, timeout=remaining)
            incomplete = run.in_flight
            for t in pending:
                t.cancel()
            await asyncio.gather(*pending, return_exceptions=True)
        else:
            incomplete = 0
    finally:
        bar.close()
    end = max((r.end for r in run.results), default=t0)
    duration = (run.deadline - t0) if incomplete else end - t0
    return RunOutcome(run.results, max(duration, 0.0), incomplete, run.not_sent)


async def _acquire(sem: asyncio.Semaphore, deadline: float) -> bool:
    """Acquire ``sem`` unless the deadline passes first; returns whether it was acquired."""
    if deadline == float("inf"):
        await sem.acquire()
        return True
    try:
        await asyncio.wait_for(sem.acquire(), max(0.0, deadline - time.perf_counter()))
    except asyncio.TimeoutError:
        return False
    return True
