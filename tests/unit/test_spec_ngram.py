"""N-gram prompt lookup and the proposers' sync protocol (rollback of rejected proposals)."""

from __future__ import annotations

import pytest

from houchu.speculative.ngram import NgramIndex
from houchu.speculative.proposers import NgramProposer, ProtocolError
from houchu.transport.spec_messages import DraftSeq


def index(tokens: list[int], **kw) -> NgramIndex:
    ix = NgramIndex(**kw)
    ix.extend(tokens)
    return ix


def test_proposes_what_followed_the_latest_earlier_match():
    ix = index([1, 2, 3, 4, 5, 9, 2, 3, 7, 8, 2, 3])
    assert ix.propose(3) == [7, 8, 2]  # "2 3" last seen before the suffix at 6..7
    assert ix.propose(1) == [7]
    assert ix.propose(0) == []


def test_longest_ngram_wins():
    # "9 2 3" occurred once (followed by 4); "2 3" more recently (followed by 5)
    ix = index([9, 2, 3, 4, 0, 2, 3, 5, 6, 9, 2, 3])
    assert ix.propose(2) == [4, 0]


def test_no_match_proposes_nothing_and_the_suffix_is_not_its_own_match():
    assert index([1, 2, 3, 4]).propose(4) == []
    assert index([5, 5]).propose(2) == []  # min_n = 2: the only 2-gram is the suffix
    assert index([5, 5, 5]).propose(2) == [5]  # "5 5" at 0..1 is followed by a 5


def test_continuation_stops_at_the_end_of_the_sequence():
    ix = index([1, 2, 3, 1, 2])
    assert ix.propose(10) == [3, 1, 2]


def test_truncate_rebuilds_the_index():
    ix = index([1, 2, 3, 4, 1, 2, 8, 8])
    ix.truncate(6)
    assert ix.tokens == [1, 2, 3, 4, 1, 2] and ix.propose(2) == [3, 4]
    ix.truncate(2)
    ix.extend([7, 1, 2])
    assert ix.propose(3) == [7, 1, 2]


def test_bad_bounds():
    with pytest.raises(ValueError):
        NgramIndex(min_n=0)
    with pytest.raises(ValueError):
        NgramIndex(min_n=3, max_n=2)


def test_proposer_syncs_replaces_rejected_tokens_and_releases():
    p = NgramProposer()
    out = p.propose([DraftSeq("a", 0, [1, 2, 3, 4, 1, 2], 3)])
    assert out == {"a": [3, 4, 1]}
    # the target accepted "3" then emitted 9: the true tokens from 6 on are [3, 9]
    out = p.propose([DraftSeq("a", 6, [3, 9], 2)])
    assert p.seqs["a"].tokens == [1, 2, 3, 4, 1, 2, 3, 9] and out == {"a": []}
    # a resend from an earlier position replaces what followed it
    out = p.propose([DraftSeq("a", 4, [1, 2], 2)])
    assert p.seqs["a"].tokens == [1, 2, 3, 4, 1, 2] and out == {"a": [3, 4]}
    assert p.num_seqs == 1 and p.pool_usage() == (0, 0)
    p.release(["a", "unknown"])
    assert p.num_seqs == 0


def test_proposer_rejects_an_update_past_what_it_holds():
    p = NgramProposer()
    p.propose([DraftSeq("a", 0, [1, 2, 3], 1)])
    with pytest.raises(ProtocolError):
        p.propose([DraftSeq("b", 0, [4], 1), DraftSeq("a", 5, [4], 1)])
    assert "b" not in p.seqs  # nothing of the failed call was applied
