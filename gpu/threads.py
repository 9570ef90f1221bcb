"""The CPU runner's thread count, adapted to what the cores give it.

A forward pass on the CPU runs on ``T`` threads that meet at barriers (every parallel op,
and between the decoder layers of a fused decode step). When other processes want the
same cores, the OS preempts one of the ``T`` threads for a whole time slice and the
others wait for it at the next barrier: the step's time grows far beyond the share of
the cores it lost. ``ThreadGovernor`` measures, per step, how much of ``T`` cores the
process really got (its CPU time over ``T`` x wall time, from ``os.times``), and steps
down to fewer threads while that share stays low; every ``probe_every_s`` it tries one
thread more and keeps it if the cores are free again. Quiet machines never see a change.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import TypeVar

import torch

T = TypeVar("T")


def usage() -> tuple[float, int]:
    """(CPU seconds of the process, its involuntary context switches so far)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_nivcsw


class ThreadGovernor:
    """Adapts ``torch.set_num_threads`` between 1 and ``max_threads``.

    Args:
        max_threads: the most threads (the runner's configured count).
        low_share: a step that got less than this share of its threads' cores counts as
            contended.
        patience: consecutive contended steps before stepping down.
        probe_every_s: seconds between tries of one thread more.
        min_step_s: shorter steps are not judged (too little time to measure).
        set_threads, clock, usage: for tests; torch's, ``time.perf_counter`` and
            ``usage`` (process CPU seconds and involuntary context switches).
    """

    def __init__(
        self,
        max_threads: int,
        *,
        low_share: float = 0.75,
        patience: int = 3,
        probe_every_s: float = 2.0,
        min_step_s: float = 0.5e-3,
        set_threads: Callable[[int], None] = torch.set_num_threads,
        clock: Callable[[], float] = time.perf_counter,
        usage: Callable[[], tuple[float, int]] = usage,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.threads = self.max_threads
        self.low_share, self.patience = low_share, patience
        self.probe_every_s, self.min_step_s = probe_every_s, min_step_s
        self._set, self._clock, self._usage = set_threads, clock, usage
        self._low = 0
        self._last_change = clock()
        self._t0 = self._c0 = 0.0
        self._n0 = 0
        self.changes = 0  # thread-count changes so far
        self.last_share = 1.0  # the share of the cores the last judged step got

    def begin(self) -> None:
        """Call right before a step."""
        self._t0 = self._clock()
        self._c0, self._n0 = self._usage()

    def end(self) -> None:
        """Call right after the step; may change the thread count for the next one."""
        wall = self._clock() - self._t0
        if wall < self.min_step_s:
            return
        cpu, preempted = self._usage()
        share = (cpu - self._c0) / (wall * self.threads)
        self.last_share = share
        now = self._clock()
        if share < self.low_share and preempted > self._n0:
            self._low += 1
            if self._low >= self.patience and self.threads > 1:
                self._change(self.threads - 1, now)
            return
        self._low = 0
        if self.threads < self.max_threads and now - self._last_change >= self.probe_every_s:
            self._change(self.threads + 1, now)  # kept unless its steps are contended

    def run(self, step: Callable[[], T]) -> T:
        """``step()`` between ``begin`` and ``end``; a change of the thread count is
        printed (the runner's log says why its speed changed)."""
        before = self.threads
        self.begin()
        out = step()
        self.end()
        if self.threads != before:
            why = "cores contended" if self.threads < before else "probing free cores"
            print(f"houchu runner: {why}: {before} -> {self.threads} threads", flush=True)
        return out

    def _change(self, n: int, now: float) -> None:
        self.threads = n
        self._set(n)
        self._low = 0
        self._last_change = now
        self.changes += 1
