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
"""

from __future__ import annotations

import statistics
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch

T = TypeVar("T")


def step_key(num_tokens: int, all_decode: bool) -> str:
    """The kind of a step: ``"decode<=B"`` (B: its rows rounded up to a power of two) or
    ``"prefill<=B"`` (B: its tokens, likewise)."""
    bucket = 1 << max(0, num_tokens - 1).bit_length()
    return f"{'decode' if all_decode else 'prefill'}<={bucket}"


@dataclass
class _Kind:
    """One step kind's measurements: recent cycle seconds per token by thread count."""

    threads: int
    samples: dict[int, deque[float]] = field(default_factory=dict)
    trial: int | None = None  # the thread count on trial
    trial_left: int = 0  # steps of the trial still to start
    last_probe: float = 0.0
    next_down: bool = True  # which neighbour the next probe tries

    def add(self, threads: int, per_token_s: float, keep: int) -> None:
        self.samples.setdefault(threads, deque(maxlen=keep)).append(per_token_s)


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
        probe_every_s: seconds between a kind's trials of a neighbouring count.
        trial_steps: steps a trial runs.
        min_gain: a trial count is kept when its median cycle per token is below
            ``(1 - min_gain)`` times the current count's.
        idle_gap_s: a gap after a step longer than this is idle time, not measured.
        keep: recent samples kept per (kind, thread count).
        set_threads, clock: for tests; torch's and ``time.perf_counter``.
    """

    def __init__(
        self,
        max_threads: int,
        *,
        probe_every_s: float = 1.0,
        trial_steps: int = 6,
        min_gain: float = 0.03,
        idle_gap_s: float = 0.05,
        keep: int = 24,
        set_threads: Callable[[int], None] = torch.set_num_threads,
        clock: Callable[[], float] = time.perf_counter,
    ) -> None:
        self.max_threads = max(1, max_threads)
        self.threads = self.max_threads  # the count the last step ran with
        self.probe_every_s, self.trial_steps, self.min_gain = probe_every_s, trial_steps, min_gain
        self.idle_gap_s, self.keep = idle_gap_s, keep
        self._set, self._clock = set_threads, clock
        self.kinds: dict[str, _Kind] = {}
        self._last: _Step | None = None
        self.changes = 0  # kept changes of some kind's thread count

    def chosen(self) -> dict[str, int]:
        """The thread count each step kind runs with now, e.g. ``{"decode<=1": 1}``."""
        return {k: s.threads for k, s in sorted(self.kinds.items())}

    def run(self, step: Callable[[], T], key: str, tokens: int) -> T:
        """Run ``step()`` (a forward pass of kind ``key`` over ``tokens`` tokens) at the
        thread count chosen for ``key``; a kept change is printed (the runner's log says
        why its speed changed)."""
        now = self._clock()
        self._measure(now)
        kind = self.kinds.setdefault(key, _Kind(self.max_threads, last_probe=now))
        n = self._pick(kind, now)
        if n != self.threads:
            self._set(n)
            self.threads = n
        cur = _Step(key, n, max(1, tokens), now)
        out = step()
        cur.end = self._clock()
        self._last = cur
        return out

    def _measure(self, now: float) -> None:
        last = self._last
        if last is None or now - last.end > self.idle_gap_s:
            return
        kind = self.kinds[last.key]
        kind.add(last.threads, (now - last.start) / last.tokens, self.keep)

    def _pick(self, kind: _Kind, now: float) -> int:
        if kind.trial is not None:
            if kind.trial_left > 0:
                kind.trial_left -= 1
                return kind.trial
            self._judge(kind)
        if self.max_threads > 1 and now - kind.last_probe >= self.probe_every_s:
            kind.last_probe = now
            down, up = kind.threads - 1, kind.threads + 1
            options = [
                t
                for t in ((down, up) if kind.next_down else (up, down))
                if 1 <= t <= self.max_threads
            ]
            kind.next_down = not kind.next_down
            if options and len(kind.samples.get(kind.threads, ())) >= 3:
                kind.trial = options[0]
                kind.samples.pop(kind.trial, None)  # judged on fresh samples only
                kind.trial_left = self.trial_steps - 1
                return kind.trial
        return kind.threads

    def _judge(self, kind: _Kind) -> None:
        trial, kind.trial = kind.trial, None
        assert trial is not None
        got, base = kind.samples.get(trial, ()), kind.samples.get(kind.threads, ())
        if len(got) < max(2, self.trial_steps // 2) or len(base) < 3:
            return  # too few back-to-back steps to judge (idle gaps, other kinds between)
        if statistics.median(got) < (1 - self.min_gain) * statistics.median(base):
            before, kind.threads = kind.threads, trial
            self.changes += 1
            print(
                f"houchu runner: {before} -> {trial} threads serve faster now "
                f"(measured cycle per token)",
                flush=True,
            )
