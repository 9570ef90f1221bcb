"""The grammar worker's fill of a step's bitmask rows (``houchu.model.grammar.matcher``), and
each request's share of the fill time.

The rows without proposals are filled by one call to llguidance's ``LLExecutor`` (its
own threads, without the GIL), so the worker takes the GIL from the forward pass's
thread a few times per step rather than twice per request; the rest (proposals to
check, a matcher in error) row by row, each one timed. The executor's call does not
say how long each of its rows took, so a batched row's share of the call's time comes
from that request's own mask time measured alone: every ``SOLO_EVERY``-th step one row
(the request timed alone least recently, one never timed first) leaves the batch and is
filled and timed on its own (one GIL hand-off more on that step). A batched row's
share is the call's time times its request's mean solo time over the sum of those of
the call's rows; a request not timed alone yet counts as the mean of the others (equal
shares when none is). A share is thus an estimate from the request's own earlier masks,
not a measurement of that step's.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from houchu.model.grammar.matcher import RequestGrammar

#: One row of every this many steps' batched rows is filled alone and timed.
SOLO_EVERY = 8


@dataclass
class SoloTiming:
    """A request's masks filled alone (without proposals): their seconds and count, and
    the step of the last one (-1: never)."""

    seconds: float = 0.0
    count: int = 0
    last_step: int = -1

    def add(self, seconds: float, step: int) -> None:
        """Record one mask filled alone in ``seconds`` at ``step``."""
        self.seconds += seconds
        self.count += 1
        self.last_step = step

    @property
    def mean_s(self) -> float | None:
        """Mean seconds per mask filled alone (None: never timed)."""
        return self.seconds / self.count if self.count else None


@dataclass
class MaskRow:
    """One constrained request of a step: its grammar, its first logits row, the
    proposals to verify, and the worker seconds its masks took this step (``fill_s``:
    measured when filled alone, its share of the executor's call when batched)."""

    grammar: RequestGrammar
    row: int
    drafts: Sequence[int]
    fill_s: float = 0.0


def constrained_rows(rows: Sequence[MaskRow]) -> list[int]:
    """The logits rows a step's grammars mask (each request's row and one per proposal
    to verify), ascending."""
    return sorted({r.row + j for r in rows for j in range(len(r.drafts) + 1)})


def fill_rows(
    rows: list[MaskRow], bitmask: torch.Tensor, executor: Any = None, step: int = 0
) -> None:
    """Fill ``bitmask``'s (``[R, W]`` int32, contiguous) rows of ``rows`` and set each
    row's ``fill_s``; ``executor``: llguidance's ``LLExecutor`` (None: row by row);
    ``step``: the worker's step count (every ``SOLO_EVERY``-th one times a row alone)."""
    batched = [r for r in rows if not r.drafts and not r.grammar.matcher.is_error()]
    if executor is None:
        batched = []
    if batched and step % SOLO_EVERY == 0:
        batched.remove(min(batched, key=lambda r: r.grammar.solo.last_step))
    if len(batched) < 2:
        batched = []
    if batched:
        t0 = time.perf_counter()
        targets = [(r.grammar.matcher, r.row) for r in batched]
        row_bytes = bitmask.shape[1] * bitmask.element_size()
        executor.unsafe_compute_mask_ptr(targets, bitmask.data_ptr(), row_bytes, bitmask.shape[0])
        for r in batched:
            if r.grammar.matcher.is_stopped() or r.grammar.matcher.is_error():
                r.grammar.eos_only(bitmask[r.row])
        share_batched(batched, time.perf_counter() - t0)
    done = {id(r) for r in batched}
    for r in rows:
        if id(r) in done:
            continue
        t0 = time.perf_counter()
        r.grammar.fill(bitmask, r.row, r.drafts)
        r.fill_s = time.perf_counter() - t0
        if not r.drafts:
            r.grammar.solo.add(r.fill_s, step)


def share_batched(rows: Sequence[MaskRow], seconds: float) -> None:
    """Split one executor call's ``seconds`` among its ``rows`` in proportion to each
    request's mean mask time filled alone (``SoloTiming.mean_s``); a request never
    timed alone weighs the mean of the others, and all weigh the same when none was."""
    means = [r.grammar.solo.mean_s for r in rows]
    known = [m for m in means if m is not None]
    fallback = sum(known) / len(known) if known else 1.0
    weights = [fallback if m is None else m for m in means]
    total = sum(weights)
    for r, w in zip(rows, weights, strict=True):
        r.fill_s = seconds * w / total if total > 0 else seconds / len(rows)
