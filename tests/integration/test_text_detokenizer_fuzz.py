"""Hypothesis-generated token sequences through the incremental detokenizer: the pieces
always reassemble to the full decode, whatever the ids (special, unknown, partial UTF-8
bytes) and however they are split into chunks."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from houchu.text.detokenizer import IncrementalDetokenizer
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer

pytestmark = pytest.mark.slow

EXAMPLES = 300


@pytest.fixture(scope="module")
def tok(real_model_path: Path) -> TextTokenizer:
    return load_tokenizer(real_model_path)


@pytest.fixture(scope="module")
def byte_ids(tok: TextTokenizer) -> list[int]:
    """Ids whose bytes are not valid UTF-8 alone (pieces of multi-byte characters)."""
    out = []
    for i in range(tok.vocab_size):
        try:
            tok.token_bytes(i).decode("utf-8")
        except UnicodeDecodeError:
            out.append(i)
    assert out, "a byte-level vocabulary has partial-character tokens"
    return out


def token_ids(tok: TextTokenizer, byte_ids: list[int]) -> st.SearchStrategy[list[int]]:
    """Any ids (a few unknown), partial-character ids, special ids, and real text."""
    any_id = st.integers(0, tok.vocab_size + 5)
    partial = st.sampled_from(byte_ids)
    special = st.sampled_from(sorted(tok.special_ids) or [0])
    mixed = st.lists(st.one_of(any_id, partial, partial, special), max_size=60)
    text = st.text(max_size=40).map(tok.encode)
    return st.one_of(mixed, text, st.tuples(text, mixed, text).map(lambda t: t[0] + t[1] + t[2]))


def chunked(ids: list[int], sizes: list[int]) -> list[list[int]]:
    """``ids`` split by the repeating chunk ``sizes`` (empty chunks included)."""
    if not any(sizes):
        sizes = [*sizes, 1]  # some chunk must take a token, or this never ends
    chunks, i, k = [], 0, 0
    while i < len(ids):
        n = sizes[k % len(sizes)]
        chunks.append(ids[i : i + n])
        i, k = i + n, k + 1
    return chunks


def test_detokenizer_reassembles_random_token_streams(
    tok: TextTokenizer, byte_ids: list[int]
) -> None:
    tried = 0

    @settings(max_examples=EXAMPLES, deadline=None, suppress_health_check=list(HealthCheck))
    @given(
        ids=token_ids(tok, byte_ids),
        sizes=st.lists(st.integers(0, 5), max_size=8),
        prompt=st.none() | st.text(max_size=20).map(tok.encode),
    )
    def check(ids: list[int], sizes: list[int], prompt: list[int] | None) -> None:
        nonlocal tried
        tried += 1
        detok = IncrementalDetokenizer(tok, prompt)
        pieces = [detok.add(chunk) for chunk in chunked(ids, sizes)]
        pieces.append(detok.flush())
        assert "".join(pieces) == tok.decode(ids)
        assert detok.num_tokens == len(ids)
        # before the flush, no piece ends inside a character unless the text itself
        # holds U+FFFD (invalid bytes are released after a bounded wait)
        if "\ufffd" not in tok.decode(ids):
            assert not any(p.endswith("\ufffd") for p in pieces)

    check()
    print(f"detokenizer fuzz: {tried} token sequences")
    assert tried >= EXAMPLES // 2
