"""The overlap scheduler's bookkeeping: what each step in flight holds, and its ledger.

With overlap on (``--overlap-schedule on``, or ``auto`` where it pays:
``resolve_overlap``; ``--overlap-schedule off`` turns it off) the scheduler
actor sends step N+1's plan while step N still runs, so applying N's result and planning
N+2 happen while the runner executes N+1 (SGLang's "zero-overhead" overlap scheduler;
mini-sglang's overlap loop). At most two steps are in flight; a plan is built with at
most one step's result unknown. The scheduler handles results one step late:

- a request sampled in step N is planned in N+1 with a placeholder token
  (``SeqWork.use_last_sampled``) the runner replaces with the token it sampled;
- a request that finishes at N by ``max_tokens`` is not planned in N+1 (that finish is
  known in advance); one that finishes by EOS or a stop token may already be in N+1:
  that step's token for it is discarded (counted as ``discarded_tokens``), and its
  pages, freed when N's result is applied, are reused only by plans the runner executes
  after N+1 (plans run in order, so N+1's write into them comes first);
- a request preempted while in a step keeps what that step samples, and is re-admitted
  only once nothing of it is in flight (its recompute needs every token);
- a step that verifies speculative proposals is never overlapped (its accepted length is
  unknown until it returns), and neither is a plan that may carry proposals: with
  speculation on, steps overlap only while the decoding batch is above the size at
  which speculation is off (``SpecController.cutoff``).

The lever ("overlap_scheduler", verb fill): saved = seconds of the scheduler's work
(applying results, planning and sending a plan) that ran while the runner executed a
step, measured as the intersection of each such span of work with the runner's
execution span of the step it overlapped (``StepResult.started_at`` + ``duration_s``);
spent = tokens computed for requests that had already finished a step earlier.
"""

from __future__ import annotations

import time
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING

from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.stats import OverlapStats
from houchu.transport.telemetry import LeverSample

if TYPE_CHECKING:
    from houchu.scheduler.request import Request
    from houchu.transport.messages import RunnerInfo

#: Seconds between two lever samples (the counters accrue in between).
EMIT_EVERY_S = 1.0
#: ``auto`` overlaps on a CPU runner only with this many cores beyond the runner's threads
#: (for the scheduler, tokenizer and gateway processes to run beside a step).
SPARE_CORES_FOR_OVERLAP = 2


def resolve_overlap(mode: str, info: RunnerInfo, num_cores: int) -> bool:
    """Whether to overlap scheduling with execution.

    ``mode`` "on" / "off" decide; "auto" overlaps when the runner is on a CUDA GPU (its
    CPU thread mostly waits for the device, as in SGLang, where overlap is the default),
    or on a CPU runner when ``num_cores`` exceed its threads by at least
    ``SPARE_CORES_FOR_OVERLAP``. On a CPU whose cores all run the step, planning ahead
    only takes cores from it: measured on 2 cores with 2 runner threads, overlap gave
    0.96x the decode tokens/s of one stream and 0.90x of 8 (``houchu.bench.served.overlap``).

    Raises:
        ValueError: another ``mode``.
    """
    if mode in ("on", "off"):
        return mode == "on"
    if mode != "auto":
        raise ValueError(f"overlap schedule must be auto, on or off, got {mode!r}")
    if info.device_type == "cuda":
        return True
    threads = info.num_threads or num_cores
    return num_cores - threads >= SPARE_CORES_FOR_OVERLAP


@dataclass(slots=True)
class Slot:
    """One request's share of a step in flight, as planned.

    Attributes:
        req: the request.
        num_tokens: positions the step computes for it (proposals included).
        sample: the step samples a token for it.
        num_draft: speculative proposals among ``num_tokens``.
        prefill: the work is prefill (a prompt chunk or a recompute), not a decode.
    """

    req: Request
    num_tokens: int
    sample: bool
    num_draft: int
    prefill: bool

    def enter(self) -> None:
        """Add this share to the request's in-flight overlay (at plan time)."""
        self.req.num_ahead += self.num_tokens
        self.req.num_pending += int(self.sample)

    def leave(self) -> None:
        """Take it out again (its result arrived, or the step was lost)."""
        self.req.num_ahead -= self.num_tokens
        self.req.num_pending -= int(self.sample)


class OverlapLedger:
    """Counters of the overlap scheduler (module docstring), in wall-clock seconds.

    Args:
        enabled: whether the scheduler overlaps steps (reported in the stats).
    """

    def __init__(self, enabled: bool = False) -> None:
        self.enabled = enabled
        self.hidden_s = 0.0  # scheduler work that ran while the runner executed a step
        self.work_s = 0.0  # all scheduler work on results and plans
        self.discarded_tokens = 0  # sampled for requests already finished
        self.steps_ahead = 0  # plans sent while another step was in flight
        self._spans: deque[tuple[float, float]] = deque(maxlen=256)
        self._unsent_hidden = 0.0
        self._unsent_discarded = 0
        self._sent_at = time.monotonic()

    def on_planned(self, ahead: bool) -> None:
        """A plan was built; ``ahead``: while another step was in flight."""
        self.steps_ahead += int(ahead)

    def record_work(self, t0: float, t1: float, overlapped: bool) -> None:
        """The scheduler worked on results or a plan from ``t0`` to ``t1`` (time.time()).

        ``overlapped``: a step was in flight the whole time (only such spans can be
        hidden).
        """
        self.work_s += max(t1 - t0, 0.0)
        if overlapped and t1 > t0:
            self._spans.append((t0, t1))

    def on_executed(self, started_at: float, duration_s: float) -> float:
        """The runner executed a step from ``started_at`` (time.time(); 0: unknown) for
        ``duration_s`` seconds: count the recorded work that ran meanwhile as hidden.
        Returns the seconds hidden behind this step."""
        if started_at <= 0.0:
            return 0.0
        end = started_at + duration_s
        hidden = sum(max(0.0, min(t1, end) - max(t0, started_at)) for t0, t1 in self._spans)
        while self._spans and self._spans[0][1] <= end:  # steps run in order: done with it
            self._spans.popleft()
        self.hidden_s += hidden
        self._unsent_hidden += hidden
        return hidden

    def on_discarded(self, num_tokens: int) -> None:
        """``num_tokens`` sampled for a request that had finished one step earlier."""
        self.discarded_tokens += num_tokens
        self._unsent_discarded += num_tokens

    def samples(self, now: float | None = None) -> list[LeverSample]:
        """A lever sample of what accrued since the last one, at most once every
        ``EMIT_EVERY_S`` seconds (an empty list in between, or when nothing accrued)."""
        if not (self._unsent_hidden or self._unsent_discarded):
            return []
        if time.monotonic() - self._sent_at < EMIT_EVERY_S:
            return []
        self._sent_at = time.monotonic()
        sample = LeverSample(
            Lever.OVERLAP_SCHEDULER,
            Verb.FILL,
            self._unsent_hidden,
            Unit.SECONDS,
            float(self._unsent_discarded),
            Unit.TOKENS,
            time.time() if now is None else now,
        )
        self._unsent_hidden, self._unsent_discarded = 0.0, 0
        return [sample]

    def stats(self) -> OverlapStats:
        """Counters for ``/stats`` (seconds and tokens since start)."""
        return OverlapStats(
            overlap_schedule=int(self.enabled),
            overlap_hidden_s=self.hidden_s,
            overlap_scheduler_s=self.work_s,
            overlap_hidden_fraction=self.hidden_s / self.work_s if self.work_s else 0.0,
            overlap_discarded_tokens=self.discarded_tokens,
            overlap_steps_ahead=self.steps_ahead,
        )
