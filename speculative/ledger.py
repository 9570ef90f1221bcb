"""Speculative decoding's share of the lever ledger: what it saved and what it spent.

| lever | verb | saved | spent |
|---|---|---|---|
| speculative_decoding | break_serial | target forward passes saved | draft seconds; rejected proposals |

A verification pass that emits ``m`` tokens saves ``m - 1`` target passes (without
speculation each token costs one). Tokens cut off after a stop are not counted as
emitted. Draft time is the scheduler's wait for the draft actor, shared among the
requests of the call in proportion to the tokens asked of each.
"""

from __future__ import annotations

import time

from houchu.transport.levers import Lever, Unit, Verb
from houchu.transport.stats import SpecTotalsStats
from houchu.transport.telemetry import LeverSample

SPEC_LEVER, SPEC_VERB = Lever.SPECULATIVE_DECODING, Verb.BREAK_SERIAL


class SpecCounters:
    """Counters of one request, or of the whole engine."""

    __slots__ = ("num_verify_steps", "num_proposed", "num_accepted", "num_emitted", "draft_s")

    def __init__(self) -> None:
        self.num_verify_steps = 0  # target passes that verified proposals
        self.num_proposed = 0  # proposals verified
        self.num_accepted = 0  # proposals the target accepted
        self.num_emitted = 0  # tokens those passes emitted (accepted + the target's own)
        self.draft_s = 0.0  # seconds waiting for the draft

    def on_verify(self, proposed: int, accepted: int, emitted: int) -> None:
        """One verification pass: ``proposed`` proposals, ``accepted`` of them kept by the
        target, ``emitted`` tokens sent on (fewer when a stop cut the run)."""
        self.num_verify_steps += 1
        self.num_proposed += proposed
        self.num_accepted += accepted
        self.num_emitted += emitted

    @property
    def num_rejected(self) -> int:
        return self.num_proposed - self.num_accepted

    @property
    def forward_passes_saved(self) -> int:
        return max(self.num_emitted - self.num_verify_steps, 0)

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens per verification pass (1 = nothing accepted)."""
        return self.num_emitted / max(self.num_verify_steps, 1)

    def samples(
        self, rid: str | None, now: float | None = None, lever: Lever = SPEC_LEVER
    ) -> list[LeverSample]:
        """The ledger samples of these counters: passes saved against draft seconds, and
        (saving nothing more) the rejected proposals, under ``lever`` ("mtp" where the
        checkpoint's MTP layer proposed). Empty if nothing was proposed."""
        if self.num_proposed == 0:
            return []
        t = now or time.time()
        return [
            LeverSample(
                lever,
                SPEC_VERB,
                float(self.forward_passes_saved),
                Unit.FORWARD_PASSES,
                self.draft_s,
                Unit.SECONDS,
                t,
                rid,
            ),
            LeverSample(
                lever,
                SPEC_VERB,
                0.0,
                Unit.FORWARD_PASSES,
                float(self.num_rejected),
                Unit.TOKENS,
                t,
                rid,
            ),
        ]

    def stats(self) -> SpecTotalsStats:
        """The totals for ``/stats`` (tokens, steps, seconds)."""
        return SpecTotalsStats(
            spec_verify_steps=self.num_verify_steps,
            spec_proposed_tokens=self.num_proposed,
            spec_accepted_tokens=self.num_accepted,
            spec_rejected_tokens=self.num_rejected,
            spec_acceptance_rate=self.num_accepted / max(self.num_proposed, 1),
            spec_mean_acceptance_length=self.mean_acceptance_length,
            spec_forward_passes_saved=self.forward_passes_saved,
            spec_draft_s=self.draft_s,
        )
