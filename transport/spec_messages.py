"""Messages between the scheduler and the draft actor (speculative decoding).

The draft actor mirrors each speculating request's token sequence. The scheduler sends
only what changed since the last request, and the draft keeps whatever part of its own
earlier proposals the target accepted (its KV included), dropping the rest (rollback)::

    scheduler --DraftRequest--> draft --DraftReply--> scheduler

A ``DraftRequest`` with no ``seqs`` only releases finished requests; it is answered too,
so the scheduler's counters of the draft's pool stay current.
"""

from __future__ import annotations

from msgspec import Struct, field

from houchu.transport.messages import Shutdown


class DraftSeq(Struct, array_like=True):
    """One request's sequence update and how many tokens to propose after it.

    ``start``: the draft already holds the request's true tokens ``0 .. start - 1``;
    ``token_ids`` (list[int]): the true tokens from position ``start`` to the end of the
    sequence (prompt and accepted output); anything the draft held at positions
    ``>= start`` is replaced. ``k``: tokens to propose after the last one (0: just sync).
    """

    rid: str
    start: int
    token_ids: list[int]
    k: int


class DraftRequest(Struct, tag=True, kw_only=True):
    """Proposals wanted for the next step; ``release``: requests that left (their draft
    state and pages are freed)."""

    query_id: int
    seqs: list[DraftSeq] = field(default_factory=list)
    release: list[str] = field(default_factory=list)


class DraftProposal(Struct, array_like=True):
    """Up to ``k`` proposed continuation tokens of one request (list[int], may be empty)."""

    rid: str
    token_ids: list[int]


class DraftReply(Struct, tag=True, kw_only=True):
    """The draft's answer. ``duration_s``: seconds the draft spent on the request;
    ``num_seqs``: requests whose state the draft holds; ``pages_used`` / ``pages_total``:
    the draft model's KV pool (0 for proposers without KV)."""

    query_id: int
    proposals: list[DraftProposal] = field(default_factory=list)
    duration_s: float = 0.0
    num_seqs: int = 0
    pages_used: int = 0
    pages_total: int = 0
    error: str | None = None


DraftInbox = DraftRequest | Shutdown
