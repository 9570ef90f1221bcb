"""A request's speculative-decoding state in the scheduler.

Regions of the request's tokens during a verification step::

    | computed (KV in pages) | last token | proposals d_1 .. d_k |
      0 .. num_computed - 1   uncomputed   positions num_tokens .. num_tokens + k - 1,
                                           pages reserved for the step only

After the step the accepted proposals and the target's own token join ``output_ids``;
``num_computed`` covers the last token and the accepted proposals; pages past
``num_tokens`` positions are freed (the rejected proposals' KV is discarded).
"""

from __future__ import annotations

from houchu.speculative.adaptive import Acceptance
from houchu.speculative.ledger import SpecCounters


class SpecState:
    """Per-request speculative state (held by ``scheduler.request.Request.spec``)."""

    __slots__ = ("draft_ids", "num_draft", "num_synced", "acceptance", "counters")

    def __init__(self) -> None:
        self.draft_ids: list[int] = []  # proposals received for the next step
        self.num_draft = 0  # proposals in the step in flight
        self.num_synced = 0  # leading tokens the draft actor holds (0: unknown to it)
        self.acceptance = Acceptance(decay=0.8)  # recent verifications weigh most
        self.counters = SpecCounters()
