"""How much of the CPU other processes take: for the thread governor (``model.threads``)
and the start-up measurement (``model.autotune``).

A thread-count trial that adds a thread on cores other processes keep busy is expensive:
each of a fused decode step's ~150 barriers can wait a whole scheduler time slice for the
preempted thread (one such step took 0.5 s beside two busy loops on 2 cores, against
26 ms at one thread). ``CpuLoad`` reads the kernel's CPU accounting (Linux
``/proc/stat`` and ``/proc/self/stat``, in clock ticks) every ``every_s`` seconds and
keeps what the rest of the machine used over the last window, in cores, so the governor
tries a thread more only where a core is free. The runner's ``CpuLoad`` reads them from a
background thread (``watch``) too, so the window a new kind of step starts from is the
last quarter second, not the whole idle time since the previous step (which spans the
server's start-up: the other actors loading made a fresh server's first requests start
at one thread of two). ``waited`` and ``wait_share`` tell how long
this process's threads waited for a core: the start-up measurement's test of contention.
"""

from __future__ import annotations

import os
import resource
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path

#: windows whose mean ``CpuLoad.recent`` gives (with ``watch``: about a second)
RECENT_WINDOWS = 4


def _ticks(stat: str) -> tuple[int, int, int] | None:
    """(all CPUs' ticks, their busy ticks, CPU count) from ``/proc/stat`` text."""
    lines = stat.splitlines()
    if not lines or not lines[0].startswith("cpu "):
        return None
    f = [int(v) for v in lines[0].split()[1:9]]  # user nice system idle iowait irq softirq steal
    ncpu = sum(1 for ln in lines if ln.startswith("cpu") and ln[3:4].isdigit())
    return sum(f), sum(f) - f[3] - f[4], ncpu


def _own_ticks(stat: str) -> int:
    """This process's user + system ticks from ``/proc/self/stat`` text."""
    fields = stat.rsplit(")", 1)[1].split()  # after the command name, which may hold spaces
    return int(fields[11]) + int(fields[12])  # utime, stime (fields 14 and 15)


class CpuLoad:
    """Cores the other processes kept busy over the last window (None where unknown).

    Args:
        every_s: the shortest window; ``tick`` reads the counters at most this often.
        read: for tests: returns (``/proc/stat`` text, ``/proc/self/stat`` text), or None.
        clock: for tests; ``time.monotonic``.
    """

    def __init__(
        self,
        every_s: float = 0.25,
        read: Callable[[], tuple[str, str] | None] | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.every_s = every_s
        self._read = read or _read_proc
        self._clock = clock
        self._last: tuple[float, int, int, int] | None = None  # (time, total, busy, own)
        self.others: float | None = None  # cores, over the last window
        self._recent: deque[float] = deque(maxlen=RECENT_WINDOWS)  # the last windows'
        self.cpus = 0  # CPUs the counters cover
        self._lock = threading.Lock()  # ``tick`` from the watcher and the runner's thread
        self.tick()

    def watch(self) -> threading.Thread:
        """Tick every ``every_s`` seconds from a daemon thread for the life of the
        process (about 50 us of reading ``/proc`` each), so that ``others`` always covers
        the last window, idle periods included; returns the thread."""

        me, every = weakref.ref(self), self.every_s  # the thread ends once its CpuLoad is gone

        def loop() -> None:
            while (load := me()) is not None:
                load.tick()
                del load
                time.sleep(every)

        t = threading.Thread(target=loop, name="houchu-cpu-load", daemon=True)
        t.start()
        return t

    def tick(self) -> None:
        """Reads the counters if the window is over, updating ``others``."""
        with self._lock:
            self._tick()

    def _tick(self) -> None:
        now = self._clock()
        if self._last is not None and now - self._last[0] < self.every_s:
            return
        got = self._read()
        parsed = _ticks(got[0]) if got else None
        if got is None or parsed is None:
            self.others, self._last = None, None
            return
        total, busy, ncpu = parsed
        own = _own_ticks(got[1])
        self.cpus = ncpu
        usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else None
        if usable != ncpu:
            self.others = None  # the counters cover CPUs this process cannot use
        elif self._last is not None and total > self._last[1]:
            d_total = (total - self._last[1]) / ncpu  # ticks per CPU over the window
            d_others = (busy - self._last[2]) - (own - self._last[3])
            self.others = max(0.0, d_others / d_total)
            self._recent.append(self.others)
        self._last = (now, total, busy, own)

    def recent(self) -> float | None:
        """Cores the other processes kept busy over the last ``RECENT_WINDOWS`` windows
        (their mean: about a second with ``watch``), or None where unknown."""
        got = list(self._recent)
        if self.others is None or not got:
            return self.others
        return sum(got) / len(got)

    def core_free(self, threads: int) -> bool:
        """Whether a core is free for a thread more beside ``threads`` of this process's
        own: at least half a core left once the others' share is counted (True where the
        share is unknown)."""
        if self.others is None:
            return True
        return self.cpus - self.others - threads >= 0.5


def waited() -> float:
    """Seconds this process's threads have spent runnable but waiting for a core, summed
    over the threads alive now (Linux ``/proc/self/task/*/schedstat``, its second field:
    ``run_delay`` in nanoseconds). Where schedstat is missing, the involuntary context
    switches times a 4 ms time slice stand in.

    Waiting, not CPU share, tells contention: an OpenMP pool that spins keeps its CPU
    share high while other processes hold the cores, and a quiet pool that sleeps has a
    low share with nobody else about."""
    total, seen = 0, False
    try:
        tasks = os.listdir("/proc/self/task")
    except OSError:
        tasks = []
    for tid in tasks:
        try:
            with open(f"/proc/self/task/{tid}/schedstat") as f:
                total += int(f.read().split()[1])
            seen = True
        except (OSError, IndexError, ValueError):
            continue  # a thread that ended meanwhile
    if seen:
        return total / 1e9
    return resource.getrusage(resource.RUSAGE_SELF).ru_nivcsw * 0.004


def wait_share(waited_s: float, wall_s: float, threads: int) -> float:
    """The fraction of ``threads`` threads' ``wall_s`` seconds they spent waiting for a
    core (0: never waited; 0.5: as with one other busy process per core)."""
    return waited_s / max(wall_s * max(threads, 1), 1e-9)


def _read_proc() -> tuple[str, str] | None:
    try:
        return Path("/proc/stat").read_text(), Path("/proc/self/stat").read_text()
    except OSError:
        return None
