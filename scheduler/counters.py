"""The scheduler's running totals since start, for the stats endpoint."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from houchu.transport.stats import CounterStats


@dataclass
class SchedulerCounters:
    """Totals since the scheduler started.

    Attributes:
        steps: step results applied.
        prompt_tokens: prompt tokens of the requests queued.
        generated_tokens: output tokens sent to the tokenizer.
        finished: requests finished (EOS, stop token or string, length).
        aborted: requests aborted (client gone, tokenizer replaced).
        refused: requests refused because the waiting queue was full.
        failed: requests failed (a step failed, the runner was replaced).
        busy_s: seconds the runner reported computing steps.
        allreduce_s: of those, seconds a tensor-parallel runner spent in its collectives.
        jump_forward_tokens: of ``generated_tokens``, those the grammar forced
            (structured-output jump-forward): each a decode step not run.
        started: wall-clock seconds (``time.time()``) at start.
    """

    steps: int = 0
    prompt_tokens: int = 0
    generated_tokens: int = 0
    finished: int = 0
    aborted: int = 0
    refused: int = 0
    failed: int = 0
    busy_s: float = 0.0
    allreduce_s: float = 0.0
    jump_forward_tokens: int = 0
    started: float = field(default_factory=time.time)

    def stats(self) -> CounterStats:
        """The totals under their stats names; ``busy_fraction`` is busy seconds per
        second since start; ``tp_allreduce_share`` the collectives' share of them."""
        up = max(time.time() - self.started, 1e-9)
        return CounterStats(
            num_refused_queue_full=self.refused,
            num_steps=self.steps,
            num_prompt_tokens=self.prompt_tokens,
            num_generated_tokens=self.generated_tokens,
            jump_forward_tokens=self.jump_forward_tokens,
            num_finished=self.finished,
            num_aborted=self.aborted,
            num_failed=self.failed,
            busy_fraction=self.busy_s / up,
            tp_allreduce_s=self.allreduce_s,
            tp_allreduce_s_per_step=self.allreduce_s / max(self.steps, 1),
            tp_allreduce_share=self.allreduce_s / self.busy_s if self.busy_s else 0.0,
        )
