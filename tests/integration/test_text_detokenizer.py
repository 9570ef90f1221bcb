"""Incremental detokenization on the real tokenizer."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from houchu.text.detokenizer import IncrementalDetokenizer
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer
from houchu.transport.messages import ChatMessage

pytestmark = pytest.mark.slow

TEXTS = [
    "Hello, world! How are you today?",
    "你好世界",
    "我们一起去吃饭吧，好不好？这是一个测试。",
    "👩‍👩‍👧 family and 🎉 party 🎉🎉",
    "def f(x):\n    return x  # two  spaces\n\n\n\ttabbed\r\n",
    "mixed: naïve café — 日本語 and ελληνικά ✓ 😀 end",
    "   leading spaces and trailing   ",
    "\ufffd a literal replacement char \ufffd",
    "a",
]


@pytest.fixture(scope="module")
def tok(real_model_path: Path) -> TextTokenizer:
    return load_tokenizer(real_model_path)


def stream(
    tok: TextTokenizer, chunks: list[list[int]], prompt: list[int] | None = None
) -> list[str]:
    """All pieces a detokenizer returns for ``chunks`` and the final flush (last item)."""
    detok = IncrementalDetokenizer(tok, prompt)
    return [detok.add(chunk) for chunk in chunks] + [detok.flush()]


def random_chunks(rng: random.Random, ids: list[int]) -> list[list[int]]:
    chunks, i = [], 0
    while i < len(ids):
        size = rng.randint(0, 4)
        chunks.append(ids[i : i + size])
        i += size
    return chunks


@pytest.mark.parametrize("text", TEXTS)
def test_one_token_at_a_time(tok: TextTokenizer, text: str) -> None:
    ids = tok.encode(text)
    pieces = stream(tok, [[t] for t in ids])
    assert "".join(pieces) == tok.decode(ids) == text
    if "\ufffd" not in text:
        assert not any("\ufffd" in piece for piece in pieces)
    if not text.endswith("\ufffd"):  # a literal U+FFFD at the end waits for the flush
        assert pieces[-1] == ""  # valid text leaves nothing held at the end


@pytest.mark.parametrize("text", TEXTS)
def test_random_chunk_sizes(tok: TextTokenizer, text: str) -> None:
    rng = random.Random(text)
    ids = tok.encode(text)
    for _ in range(20):
        pieces = stream(tok, random_chunks(rng, ids))
        assert "".join(pieces) == text
        if "\ufffd" not in text:
            assert not any("\ufffd" in piece for piece in pieces)


def test_multibyte_character_is_held_until_complete(tok: TextTokenizer) -> None:
    ids = tok.encode("你")
    assert len(ids) == 2
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[:1]) == ""
    assert detok.add(ids[1:]) == "你"
    detok = IncrementalDetokenizer(tok)
    assert detok.add(ids[:1]) == ""
    assert detok.flush() == "\ufffd"  # an unfinished character at the end, as decode gives


def test_with_prompt_context(tok: TextTokenizer) -> None:
    prompt = tok.apply_chat_template([ChatMessage("user", "Say hi")])
    for text in TEXTS:
        ids = tok.encode(text)
        assert "".join(stream(tok, [[t] for t in ids], prompt)) == text
    # a prompt that ends inside a character is not used as context
    half = tok.encode("你")[:1]
    assert "".join(stream(tok, [[t] for t in tok.encode(" ok")], half)) == " ok"


def test_special_tokens_are_skipped(tok: TextTokenizer) -> None:
    a, b = tok.encode("你"), tok.encode(" there")
    ids = [1, a[0], 2, a[1], 0, *b, 2, tok.vocab_size + 3]
    detok = IncrementalDetokenizer(tok)
    text = "".join(detok.add([t]) for t in ids) + detok.flush()
    assert text == tok.decode(ids) == "你 there"
    assert detok.num_tokens == len(ids)


def test_random_token_sequences(tok: TextTokenizer) -> None:
    rng = random.Random(0)
    for _ in range(300):
        ids = [rng.randrange(tok.vocab_size) for _ in range(rng.randint(1, 40))]
        if rng.random() < 0.3:  # favour byte tokens: partial and invalid UTF-8
            ids = [rng.choice(range(100, 300)) for _ in range(len(ids))]
        expected = tok.decode(ids)
        assert "".join(stream(tok, [[t] for t in ids])) == expected, ids
        assert "".join(stream(tok, random_chunks(rng, ids))) == expected, ids


def test_window_stays_small(tok: TextTokenizer) -> None:
    ids = tok.encode("The quick brown fox jumps over the lazy dog. 你好！ " * 60)
    detok = IncrementalDetokenizer(tok)
    out = []
    for t in ids:
        out.append(detok.add([t]))
        assert len(detok._ids) <= 8
    out.append(detok.flush())
    assert "".join(out) == tok.decode(ids)
