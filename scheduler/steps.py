"""The steps in flight: planned, sent to the runner, their results not applied yet.

At most two are in flight (the overlap scheduler plans one while another runs, see
``houchu.scheduler.overlap``). The ``StepTracker`` keeps each one's ``Slot``s (what it
holds of each request) and times them:

- since when the oldest one has been at the runner (``at_runner_s``; the scheduler actor
  reports a runner that takes longer than its heartbeat timeout as stuck);
- its round trip, from the runner's start (or the plan, when the runner did not say) to
  the result landing here (``round_trip_ms``, a scheduler stat: the runner's own
  ``StepRecord`` has the compute time).
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass

from houchu.scheduler.overlap import Slot
from houchu.scheduler.request import Request
from houchu.transport.messages import StepResult
from houchu.transport.stats import StepStats

#: Seconds of landed steps that ``round_trip_ms`` averages over.
ROUND_TRIP_WINDOW_S = 10.0


@dataclass(slots=True)
class InFlight:
    """One step in flight: its requests' shares and when it was planned (time.time())."""

    slots: list[Slot]
    planned_at: float


class StepTracker:
    """The steps planned whose results have not landed, in plan order."""

    def __init__(self) -> None:
        self._steps: dict[int, InFlight] = {}
        self._at_runner_since = 0.0  # time.perf_counter() the oldest step started there
        self._round_trips: deque[tuple[float, float]] = deque(maxlen=512)  # (landed, s)

    def __len__(self) -> int:
        return len(self._steps)

    def __contains__(self, step_id: object) -> bool:
        return step_id in self._steps

    def launch(self, step_id: int, slots: list[Slot]) -> None:
        """Step ``step_id`` was planned with these shares: add them to their requests'
        in-flight overlay (``Slot.enter``)."""
        for slot in slots:
            slot.enter()
        if not self._steps:
            self._at_runner_since = time.perf_counter()
        self._steps[step_id] = InFlight(slots, time.time())

    def land(self, result: StepResult) -> list[Slot]:
        """The result of a step arrived: its shares, taken out of their requests'
        overlay ([] for a step not in flight). Times its round trip."""
        if result.step_id not in self._steps:
            return []
        step = self._steps.pop(result.step_id)
        now = time.time()
        for slot in step.slots:
            slot.leave()
        start = result.started_at or step.planned_at  # a plan sent ahead waits at first
        self._round_trips.append((now, now - start))
        if self._steps:  # the step sent ahead starts at the runner now
            self._at_runner_since = time.perf_counter()
        return step.slots

    def void_samples(self, req: Request) -> None:
        """``req`` got forced tokens (jump-forward) in the step just applied: a step
        still in flight that samples for it ends behind them, so the runner draws
        nothing there (``houchu.model.grammar.jump_forward.drop_stale_samples``); its share no
        longer expects a token."""
        for step in self._steps.values():
            for slot in step.slots:
                if slot.req is req and slot.sample:
                    slot.sample = False
                    req.num_pending -= 1

    def only(self) -> list[Slot]:
        """The shares of the one step in flight.

        Raises:
            RuntimeError: no step or two are in flight.
        """
        if len(self._steps) != 1:
            raise RuntimeError(f"{len(self._steps)} steps are in flight, not one")
        (step,) = self._steps.values()
        return step.slots

    def lose_all(self) -> list[int]:
        """Forget every step in flight (the runner that ran them is gone); returns their
        ids. Their requests are failed by the caller, so their overlay is left as is."""
        lost = list(self._steps)
        self._steps.clear()
        return lost

    def at_runner_s(self) -> float:
        """Seconds the oldest step in flight has been at the runner (0: none in flight)."""
        return time.perf_counter() - self._at_runner_since if self._steps else 0.0

    def stats(self) -> StepStats:
        """``round_trip_ms``: mean round trip of the steps landed in the last
        ``ROUND_TRIP_WINDOW_S`` seconds (absent when none landed)."""
        cutoff = time.time() - ROUND_TRIP_WINDOW_S
        recent = [s for t, s in self._round_trips if t >= cutoff]
        if not recent:
            return StepStats()
        return StepStats(round_trip_ms=1000.0 * sum(recent) / len(recent))
