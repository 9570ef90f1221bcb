"""The CPU runner's thread count, chosen by measuring what each count delivers.

A forward pass on the CPU runs on ``T`` threads that meet at barriers (every parallel op,
and between the decoder layers of a fused decode step). Whatever else wants the same
cores — houchu's own actors (scheduler, tokenizer, gateway, recorder) on a small
machine, or other processes — preempts one of the ``T`` threads for a time slice while
the others wait for it at the next barrier, so a step's time can grow far beyond the
share of the cores it lost. Whether ``T`` or ``T - 1`` threads serve faster therefore
depends on the machine, the load beside houchu and the step's size (a batch-1 decode step
is bandwidth-bound and gains little from a second thread; a batch-32 step gains almost
2x), and no rule decides it well.

``ThreadGovernor`` measures it instead, per kind of step (``step_key``: decode steps by
batch bucket, prefill steps by token bucket). The figure of merit is the **cycle time per
token**: from one step's start to the next step's start, divided by the step's tokens,
taken only when the next step follows at once (the gap after a step is the time the
actors took to plan the next one, which more threads can lengthen). Every
``probe_every_s`` a kind runs ``trial_steps`` steps at a neighbouring thread count and
keeps it when its median cycle per token beats the current count's by ``min_gain``. Idle
periods (a gap longer than ``idle_gap_s``) are never measured.

A thread more is tried only where a core is free for it (``model.cpu_load``: the other
processes' share of the CPU over the last quarter second), as a trial on cores others keep
busy can stall a step for seconds' worth of time slices. A losing direction waits longer
and longer between trials (up to ``max_wait_s``), but the load that made it lose can
end, or a new one begin: when the current count's median cycle
per token over its last few steps has moved by more than ``retry_shift`` from its settled
value (one thread beside two busy loops on two cores runs a third slower than alone; two
threads run 10-60x slower), the machine changed, and both directions are due again at
once, whatever the budget below.

A trial costs time when it loses, so it is paid for out of a budget: a kind is tried
only after it has run ``probe_steps`` of its own steps' worth of cycle time at its current
count since its last trial (``probe_every_s`` is the least wall time in between), and a
trial step slower than ``abort_ratio`` times the current median ends the trial at once.
Measured on 2 AVX2 cores at 16 streams, a one-thread trial of 512-token prefill steps
(0.64 s at two threads, 1.14 s at one) cost 2.5 s of a 20.5 s run before the budget:
probes a second apart each ran six such steps. A losing trial's steps each cost at most
``abort_ratio - 1`` of a cycle more than the current count's (a slower one ends it), so
exploring costs a kind at most ``trial_steps * (abort_ratio - 1) / probe_steps`` of its
time (3 / 40 cycles: 7.5%, under the 10% a request may lose to it; ``EXPLORE_SHARE``).

What each kind settled on is kept between starts (``cached``, ``save``: the decision
cache, keyed by the model file, the kernel build, the ISA level, the thread budget and
the route, ``runner_setup``): per kind and per number of cores the other processes
held when it was judged, the count kept and each direction's wait. A new kind starts
from the entry for the cores held now, its waits included (a direction that lost many
times is not tried again at once); without one, from the startup measurement's best
count (``autotune``: the route's path timed at one thread fewer too), else from all
threads less one per core held. A server started again therefore serves its first
requests at the count the last one found best, instead of measuring its way there.
"""

from __future__ import annotations

import math
import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

from houchu.cpu.load import CpuLoad

T = TypeVar("T")

RECENT = 5  # steps whose median tells a change of the load (``retry_shift``)
#: the share of a kind's time its trials may cost at most (see the module docstring):
#: ``ThreadGovernor`` refuses settings that allow more
EXPLORE_SHARE = 0.1


def step_key(num_tokens: int, all_decode: bool) -> str:
    """The kind of a step: ``"decode<=B"`` (B: its rows rounded up to a power of two) or
    ``"prefill<=B"`` (B: its tokens, likewise)."""
    bucket = 1 << max(0, num_tokens - 1).bit_length()
    return f"{'decode' if all_decode else 'prefill'}<={bucket}"


#: The share of a core the other processes must keep busy for a new step kind to start
#: with a thread fewer (below it: houchu's own actors, which use part of a core while
#: the runner serves, do not cost a thread)
HELD_CORE = 0.9


@dataclass
class _Kind:
    """One step kind's measurements: recent cycle seconds per token by thread count, and
    when each neighbouring count (``-1`` fewer, ``+1`` more) is next tried."""

    threads: int
    now: float
    base_s: float
    samples: dict[int, deque[float]] = field(default_factory=dict)
    busy_s: float = 0.0  # cycle seconds run at ``threads`` since the last trial
    cycle_s: float = 0.0  # the last such step's cycle seconds
    trial: int | None = None  # the thread count on trial
    trial_left: int = 0  # steps of the trial still to start
    trial_lost: bool = False  # a trial step was far slower: ended early, lost
    due: dict[int, float] = field(default_factory=dict)  # direction -> next probe time
    wait: dict[int, float] = field(default_factory=dict)  # direction -> current interval
    ref_s: float | None = None  # the current count's recent median when last settled
    name: str = ""  # the kind's key, e.g. "decode<=1"

    def __post_init__(self) -> None:
        self.due = {-1: self.now + self.base_s, +1: self.now + self.base_s}
        self.wait = {-1: self.base_s, +1: self.base_s}

    def add(self, threads: int, per_token_s: float, keep: int) -> None:
        self.samples.setdefault(threads, deque(maxlen=keep)).append(per_token_s)

    def median(self, threads: int) -> float | None:
        got = self.samples.get(threads)
        return statistics.median(got) if got and len(got) >= 3 else None


@dataclass
class _Step:
    key: str
    threads: int
    tokens: int
    start: float
    end: float = 0.0


class ThreadGovernor:
    """Picks ``torch.set_num_threads`` in ``[1, max_threads]`` per step kind, by measured
    cycle time per token (see the module docstring).

    Args:
        max_threads: the most threads (the runner's configured count).
        probe_every_s: seconds before a kind first tries a neighbouring count; a trial
            that loses doubles the wait before the next one in its direction (up to
            ``max_wait_s``), one that wins resets both.
        probe_steps: a kind is tried only once it has spent this many of its last
            step's cycle time at its current count since its previous trial (so a
            losing trial costs a few percent of that kind's time at most).
        max_wait_s: the longest wait between trials in one direction.
        trial_steps: steps a trial runs; one step slower than ``abort_ratio`` times the
            current count's median cycle ends the trial at once, lost (a thread more on
            contended cores can stall a step for a whole time slice).
        min_gain: a trial count is kept when its median cycle per token is below
            ``(1 - min_gain)`` times the current count's.
        retry_shift: the relative change of the current count's median cycle per token
            (over its last ``RECENT`` steps) from its settled value that makes both
            directions due again.
        idle_gap_s: a gap after a step longer than this is idle time, not measured.
        keep: recent samples kept per (kind, thread count).
        load: the other processes' CPU share (``model.cpu_load``): a thread more is tried
            only where a core is free for it; None: always tried.
        cached: what earlier runs settled on (``save``'s dict): kind -> cores held ->
            ``{"threads": n, "wait": {"-1": s, "1": s}}``; entries under ``"measured"``
            (cores held: 0) are the startup measurement's, used where no kind's own is.
        save: called with ``cached`` (updated) when a kind's count was judged anew.
        set_threads, clock: for tests; torch's and ``time.perf_counter``.
    Raises:
        ValueError: trials that could cost more than ``EXPLORE_SHARE`` of a kind's time.
    """

    def __init__(
        self,
        max_threads: int,
        *,
        probe_every_s: float = 1.0,
        max_wait_s: float = 32.0,
        trial_steps: int = 6,
        probe_steps: int = 40,
        abort_ratio: float = 1.5,
        min_gain: float = 0.03,
        retry_shift: float = 0.3,
        idle_gap_s: float = 0.05,
        keep: int = 24,
        load: CpuLoad | None = None,
        cached: dict[str, dict[str, dict]] | None = None,
        save: Callable[[dict[str, dict[str, dict]]], object] | None = None,
        set_threads: Callable[[int], None] = torch.set_num_threads,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        if trial_steps * (abort_ratio - 1) > EXPLORE_SHARE * probe_steps:
            raise ValueError(
                f"trials of {trial_steps} steps at up to {abort_ratio}x every {probe_steps} "
                f"steps could cost more than {EXPLORE_SHARE:.0%} of a kind's time"
            )
        self.cached = cached if cached is not None else {}
        self._save = save
        self.max_threads = max(1, max_threads)
        self.threads = self.max_threads  # the count the last step ran with
        self.probe_every_s, self.max_wait_s = probe_every_s, max_wait_s
        self.probe_steps = probe_steps
        self.trial_steps, self.abort_ratio, self.min_gain = trial_steps, abort_ratio, min_gain
        self.retry_shift = retry_shift
        self.idle_gap_s, self.keep = idle_gap_s, keep
        self._set, self._clock, self.load = set_threads, clock, load
        self.kinds: dict[str, _Kind] = {}
        self._last: _Step | None = None
        self.changes = 0  # kept changes of some kind's thread count

    def start_notes(self) -> list[str]:
        """What the kinds start from, for the start-up lines, e.g. ["thread counts to
        start from, as measured before: decode<=1 2, prefill<=512 1 of 2"] ([] when
        nothing is cached: all threads, less one per core others hold)."""
        held, parts = self._held(), []
        for key in sorted(self.cached):
            got = self._start_entry(key, held)
            if got is not None:
                own = str(held) in self.cached[key]  # else the startup measurement's
                parts.append(f"{key} {self._count(got)}{'' if own else ' (startup measurement)'}")
        if not parts:
            return []
        others = f", other processes holding {held} cores" if held else ""
        return [
            f"thread counts to start from, as measured before{others}: "
            f"{', '.join(parts)} of {self.max_threads}"
        ]

    def chosen(self) -> dict[str, int]:
        """The thread count each step kind runs with now, e.g. ``{"decode<=1": 1}``."""
        return {k: s.threads for k, s in sorted(self.kinds.items())}

    def run(self, step: Callable[[], T], key: str, tokens: int) -> T:
        """Run ``step()`` (a forward pass of kind ``key`` over ``tokens`` tokens) at the
        thread count chosen for ``key``; a kept change is printed (the runner's log says
        why its speed changed)."""
        now = self._clock()
        self._measure(now)
        if self.load is not None:
            self.load.tick()
        kind = self.kinds.get(key)
        if kind is None:
            kind = self.kinds[key] = self._new_kind(key, now)
        n = self._pick(kind, now)
        if n != self.threads:
            self._set(n)
            self.threads = n
        cur = _Step(key, n, max(1, tokens), now)
        out = step()
        cur.end = self._clock()
        self._last = cur
        return out

    def _others(self) -> float | None:
        """Cores the other processes kept busy lately: ``load``'s mean over its last
        windows (``CpuLoad.recent``) where it keeps them, else its last window's; None
        where unknown. One quarter-second window swings with the bursts of a busy
        machine: kinds created a step apart started at different counts (a prefill kind
        at two threads beside busy processes took 0.7-3.3 s a step, its decode kind at
        one 11 ms)."""
        if self.load is None:
            return None
        recent = getattr(self.load, "recent", None)
        return recent() if recent is not None else self.load.others

    def _held(self) -> int:
        """Cores the other processes hold now (``HELD_CORE`` of one each, by
        ``_others``; 0 where unknown), at most ``max_threads - 1``."""
        others = self._others()
        if others is None:
            return 0
        return min(int(others / HELD_CORE), self.max_threads - 1)

    def _new_kind(self, key: str, now: float) -> _Kind:
        """A kind's state at its first step: from the cached entry for the cores held now
        (its count and waits), else ``_first_count``."""
        got = self._start_entry(key, self._held())
        if got is None:
            return _Kind(self._first_count(), now, self.probe_every_s, name=key)
        kind = _Kind(self._count(got), now, self.probe_every_s, name=key)
        for d in (-1, +1):
            wait = got.get("wait", {}).get(str(d))
            if wait:
                kind.wait[d] = min(max(float(wait), self.probe_every_s), self.max_wait_s)
                kind.due[d] = now + kind.wait[d]
        return kind

    def _start_entry(self, key: str, held: int) -> dict | None:
        """The cached entry a new kind ``key`` starts from with ``held`` cores held by
        others: its own judgement, else (quiet cores) the startup measurement's."""
        by_held = self.cached.get(key, {})
        got = by_held.get(str(held))
        return got if got is not None or held else by_held.get("measured")

    def _count(self, entry: dict) -> int:
        return min(max(1, int(entry["threads"])), self.max_threads)

    def _remember(self, kind: _Kind) -> None:
        """Keep what ``kind`` settled on for the cores held now, and ``save`` it where it
        changed."""
        if self._save is None:
            return
        entry = {"threads": kind.threads, "wait": {str(d): w for d, w in kind.wait.items()}}
        by_held = self.cached.setdefault(kind.name, {})
        if by_held.get(str(self._held())) != entry:
            by_held[str(self._held())] = entry
            self._save(self.cached)

    def _first_count(self) -> int:
        """A new step kind's thread count: all of them, less one per core the other
        processes hold (``HELD_CORE`` of one, by ``_others``), at least one.
        A server started beside two busy loops on 2 cores ran its first request's
        decode steps at two threads, 1.3 s per token, until a trial found one thread's
        29 ms 40 steps later."""
        others = self._others()
        if others is None:
            return self.max_threads
        first = max(1, self.max_threads - self._held())
        if first < self.max_threads:
            print(
                f"houchu runner: {time.strftime('%H:%M:%S')} a new kind of step starts at "
                f"{first} of {self.max_threads} threads (other processes hold "
                f"{others:.1f} cores)",
                flush=True,
            )
        return first

    def _measure(self, now: float) -> None:
        last = self._last
        if last is None or now - last.end > self.idle_gap_s:
            return
        kind = self.kinds[last.key]
        per_token = (now - last.start) / last.tokens
        kind.add(last.threads, per_token, self.keep)
        if last.threads == kind.threads:
            kind.busy_s += now - last.start
            kind.cycle_s = now - last.start
        if last.threads != kind.trial:
            return  # only a trial step is judged at once
        base = kind.median(kind.threads)
        if base is not None and per_token > self.abort_ratio * base:
            kind.trial_left, kind.trial_lost = 0, True

    def _pick(self, kind: _Kind, now: float) -> int:
        if kind.trial is not None:
            if kind.trial_left > 0:
                kind.trial_left -= 1
                return kind.trial
            self._judge(kind, now)
        if self.max_threads == 1 or len(kind.samples.get(kind.threads, ())) < 3:
            return kind.threads
        self._retry_if_changed(kind, now)
        if kind.busy_s < self.probe_steps * kind.cycle_s:
            return kind.threads  # not yet paid for
        for d in sorted(kind.due, key=kind.due.get):  # the direction due longest first
            n = kind.threads + d
            if kind.due[d] <= now and d > 0 and self.load and not self.load.core_free(kind.threads):
                kind.due[d] = now + self.probe_every_s  # no free core: no costly trial
                continue
            if kind.due[d] <= now and 1 <= n <= self.max_threads:
                kind.trial, kind.trial_lost, kind.busy_s = n, False, 0.0
                kind.samples.pop(n, None)  # judged on fresh samples only
                kind.trial_left = self.trial_steps - 1
                return n
        return kind.threads

    def _retry_if_changed(self, kind: _Kind, now: float) -> None:
        """Both directions due now, their waits and the trial budget forgiven, when the
        current count's median over its last RECENT steps has moved by more than
        ``retry_shift`` from its settled value (the load beside houchu changed: a step
        of 8 ms at two threads can take 0.1-0.5 s once two busy processes share the
        cores, and 40 such steps of budget would be seconds of it)."""
        got = kind.samples.get(kind.threads)
        if not got or len(got) < RECENT:
            return
        cur = statistics.median(list(got)[-RECENT:])
        if kind.ref_s is None:
            kind.ref_s = cur
        elif abs(cur / kind.ref_s - 1) > self.retry_shift:
            kind.ref_s = cur
            kind.samples[kind.threads] = deque(list(got)[-RECENT:], maxlen=self.keep)  # now's
            kind.wait = {-1: self.probe_every_s, +1: self.probe_every_s}
            kind.due = {-1: now, +1: now}
            kind.busy_s = math.inf

    def _judge(self, kind: _Kind, now: float) -> None:
        trial, kind.trial = kind.trial, None
        assert trial is not None
        d = 1 if trial > kind.threads else -1
        got, base = kind.samples.get(trial, ()), kind.median(kind.threads)
        enough = len(got) >= max(2, self.trial_steps // 2) and base is not None
        if not kind.trial_lost and not enough:
            kind.due[d] = now + kind.wait[d]  # too few back-to-back steps: try again later
            return
        if kind.trial_lost or statistics.median(got) >= (1 - self.min_gain) * base:
            kind.wait[d] = min(2 * kind.wait[d], self.max_wait_s)
            kind.due[d] = now + kind.wait[d]
            kind.ref_s = base
            self._remember(kind)
            return
        before, kind.threads, kind.ref_s = kind.threads, trial, None
        new_s = statistics.median(got)
        kind.wait = {-1: self.probe_every_s, +1: self.probe_every_s}
        kind.due = {-1: now + self.probe_every_s, +1: now + self.probe_every_s}
        self.changes += 1
        self._remember(kind)
        print(
            f"houchu runner: {time.strftime('%H:%M:%S')} {kind.name}: {before} -> {trial} "
            f"threads serve faster now (cycle per token {base * 1e3:.2f} -> "
            f"{new_s * 1e3:.2f} ms)",
            flush=True,
        )
