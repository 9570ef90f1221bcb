"""The draft actor's proposers: keep a mirror of each speculating request's tokens and
propose up to ``k`` next tokens for it.

Protocol (``transport.spec_messages``): a ``DraftSeq`` says the request's true tokens
from position ``start`` on; the proposer replaces whatever it held there (its own earlier
proposals: a rollback where the target rejected them) and proposes after the end.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol

from houchu.speculative.ngram import NgramIndex
from houchu.transport.spec_messages import DraftSeq

if TYPE_CHECKING:
    from houchu.cache_tiers.page_allocator import PageAllocator


class ProtocolError(ValueError):
    """A ``DraftSeq`` that does not continue what the proposer holds (``start`` beyond the
    tokens it has for that request)."""


class Proposer(Protocol):
    """What the draft actor needs from a proposer. ``seqs``: the state held per request
    id (released all at once when the scheduler is replaced)."""

    seqs: Mapping[str, object]

    def propose(self, seqs: list[DraftSeq]) -> dict[str, list[int]]:
        """Sync each sequence, then propose up to ``seq.k`` tokens for it.

        Returns rid -> proposed token ids (possibly empty; never more than ``k``).
        Raises:
            ProtocolError: a sequence starts beyond the tokens held for it (nothing of
                that call is applied).
        """
        ...

    def release(self, rids: list[str]) -> None:
        """Forget these requests (unknown rids are ignored)."""
        ...

    @property
    def num_seqs(self) -> int:
        """Requests whose state is held."""
        ...

    def pool_usage(self) -> tuple[int, int]:
        """(pages used, pages total) of the proposer's KV pool; (0, 0) without one."""
        ...


def check_starts(seqs: list[DraftSeq], lengths: dict[str, int]) -> None:
    """Raise ``ProtocolError`` if some ``seq.start`` exceeds the tokens held for it
    (``lengths``: rid -> tokens held; an unknown rid holds 0)."""
    for s in seqs:
        held = lengths.get(s.rid, 0)
        if s.start > held or s.start < 0 or s.k < 0:
            raise ProtocolError(
                f"request {s.rid!r}: update starts at {s.start} (k={s.k}) but the draft "
                f"holds {held} tokens"
            )


class NgramProposer:
    """Prompt-lookup proposals (``houchu.speculative.ngram``) for every request.

    Args:
        min_n, max_n: n-gram lengths to match, longest first.
    """

    def __init__(self, min_n: int = 2, max_n: int = 4) -> None:
        self.min_n, self.max_n = min_n, max_n
        self.seqs: dict[str, NgramIndex] = {}

    def propose(self, seqs: list[DraftSeq]) -> dict[str, list[int]]:
        check_starts(seqs, {rid: len(ix) for rid, ix in self.seqs.items()})
        out: dict[str, list[int]] = {}
        for s in seqs:
            ix = self.seqs.get(s.rid)
            if ix is None:
                ix = self.seqs[s.rid] = NgramIndex(self.min_n, self.max_n)
            ix.truncate(s.start)
            ix.extend(s.token_ids)
            out[s.rid] = ix.propose(s.k)
        return out

    def release(self, rids: list[str]) -> None:
        for rid in rids:
            self.seqs.pop(rid, None)

    @property
    def num_seqs(self) -> int:
        return len(self.seqs)

    def pool_usage(self) -> tuple[int, int]:
        return 0, 0


def reserve_pages(
    allocator: PageAllocator,
    seqs: Mapping[str, Any],
    seq: Any,
    num_tokens: int,
    now: int,
    drop: Callable[[Any], None],
) -> bool:
    """Give ``seq`` (with ``pages``: list of page ids) pages for ``num_tokens`` positions
    from ``allocator``, first freeing the pages of the least recently used other
    sequences of ``seqs`` (``last_used`` < ``now``; ``drop`` resets a victim's state
    once its pages are freed and cleared) while they do not fit. False if it still does
    not fit (nothing is allocated then)."""
    need = allocator.pages_for(num_tokens) - len(seq.pages)
    if need <= 0:
        return True
    if not allocator.can_allocate(need):
        victims = sorted(
            (q for q in seqs.values() if q.last_used < now and q.pages),
            key=lambda q: q.last_used,
        )
        for q in victims:
            if allocator.can_allocate(need):
                break
            allocator.free(q.pages)
            q.pages = []
            drop(q)
    if not allocator.can_allocate(need):
        return False
    seq.pages.extend(allocator.allocate(need))
    return True
