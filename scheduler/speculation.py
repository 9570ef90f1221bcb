"""The scheduler's speculation part: ``spec.scheduling.SpecScheduler`` when speculative
decoding is on, ``NoSpeculation`` when it is off (the core never checks which)."""

from __future__ import annotations

from collections.abc import Callable, Iterable

from houchu.options.speculation_options import SpeculativeOptions
from houchu.scheduler.request import Request
from houchu.speculative.scheduling import SpecScheduler
from houchu.transport.messages import SeqWork, StepResult
from houchu.transport.spec_messages import DraftReply, DraftRequest
from houchu.transport.stats import SpecStats
from houchu.transport.telemetry import LeverSample


class NoSpeculation:
    """Speculative decoding off: no proposals are asked for, nothing is counted."""

    def draft_request(self, running: Iterable[Request]) -> DraftRequest | None:
        """Never any proposals to ask for (None)."""
        return None

    def release_request(self) -> DraftRequest | None:
        """Never any draft state to release (None)."""
        return None

    def on_reply(
        self, reply: DraftReply, lookup: Callable[[str], Request | None], seconds: float
    ) -> None:
        """Ignore a draft reply (none is ever asked for)."""

    def on_pool_stats(self, reply: DraftReply) -> None:
        """Ignore a draft actor's pool counters."""

    def ask_runner(self, work: list[SeqWork], scheduled: list[Request]) -> None:
        """Ask the runner for no proposals (``num_propose`` stays 0)."""

    def on_runner_proposals(
        self, result: StepResult, lookup: Callable[[str], Request | None]
    ) -> None:
        """Ignore proposals in a step result (none is ever asked for)."""

    def abandon(self) -> None:
        """Nothing is awaited."""

    def on_verified(self, req: Request, proposed: int, num_outputs: int, num_kept: int) -> None:
        """Never called: no step carries proposals."""

    def observe_step(self, num_tokens: int, seconds: float) -> None:
        """No cost model to feed."""

    def on_leave(self, req: Request) -> list[LeverSample]:
        """A request left: nothing to release, no samples."""
        return []

    def resync(self, running: Iterable[Request]) -> None:
        """No draft mirror to resend."""

    def calibrate(self, times: dict[int, float]) -> None:
        """No cost model to seed."""

    def blocks_overlap(self, num_decoding: int) -> bool:
        """Speculation never keeps a step from being planned ahead (False)."""
        return False

    def stats(self) -> SpecStats:
        """``speculative`` "off", nothing else."""
        return SpecStats(speculative="off")


#: What the core holds: the real bookkeeping, or its stand-in when speculation is off.
Speculation = SpecScheduler | NoSpeculation


def speculation(
    config: SpeculativeOptions | None, max_context: int, max_running: int
) -> Speculation:
    """The speculation part for ``config`` (None: off).

    Raises:
        ValueError: ``config`` is invalid (``SpeculativeOptions.validate``).
    """
    if config is None:
        return NoSpeculation()
    return SpecScheduler(config, max_context, max_running)
