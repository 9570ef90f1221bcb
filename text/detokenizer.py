"""Incremental, UTF-8-safe detokenization of a generated token stream.

A token is not a unit of text: a byte-level BPE token can hold half of a UTF-8 character,
and a SentencePiece token's leading space depends on what precedes it. Decoding each token
alone would emit broken characters and wrong spaces; re-decoding the whole sequence per
token costs O(n) per token. The standard answer (Hugging Face TGI, vLLM) keeps two offsets
into the token list:

- ``prefix``: start of a short window of already-emitted tokens, decoded again only as
  context, so the new token's text is seen as a continuation;
- ``read``: end of the emitted tokens. The text of ``ids[prefix:]`` minus the text of
  ``ids[prefix:read]`` is the new text.

New text is released only when it does not end in U+FFFD (an unfinished multi-byte
character); then ``prefix`` moves to ``read`` and ``read`` to the end. Each token costs two
decodes of a window of a few tokens: O(1).

Guarantee: with ``prompt_ids=None``, the concatenation of everything :meth:`add` and
:meth:`flush` return equals ``tokenizer.decode(all_ids_added)`` (special tokens skipped,
unknown ids ignored, see :mod:`houchu.text.tokenizer.core`), and no piece before the flush
ends with half a character. With ``prompt_ids``, the text is the continuation of the
prompt: identical for byte-level BPE, and for SentencePiece it keeps the first generated
word's leading space, which decoding the generated ids alone would strip.
"""

from __future__ import annotations

from collections.abc import Iterable

from houchu.text.tokenizer.core import TextTokenizer

#: Prompt tokens kept as decoding context for the first generated tokens (as vLLM).
CONTEXT_TOKENS = 5
#: A text that still ends in U+FFFD after this many held tokens is not a character in
#: progress (one needs at most 3 more bytes) but invalid output: release it anyway so an
#: invalid stream cannot grow the window without bound.
MAX_HELD_TOKENS = 32

_REPLACEMENT = "\ufffd"


class IncrementalDetokenizer:
    """Turns one request's generated token ids into text, piece by piece.

    Not thread-safe; one instance per request. The caller does not pass EOS (it would be
    skipped anyway, being special).
    """

    def __init__(self, tokenizer: TextTokenizer, prompt_ids: Iterable[int] | None = None) -> None:
        """Start a stream; ``prompt_ids`` (optional) gives the text before the first token.

        Only the last :data:`CONTEXT_TOKENS` non-special prompt ids are used, and none if
        the prompt ends inside a character.
        """
        self._tokenizer = tokenizer
        self._special = tokenizer.special_ids
        self._vocab_size = tokenizer.vocab_size
        context = [t for t in prompt_ids or () if self._is_text(t)][-CONTEXT_TOKENS:]
        if context and tokenizer.decode(context).endswith(_REPLACEMENT):
            context = []
        self._ids: list[int] = context
        self._prefix = 0
        self._read = len(context)
        self._prefix_text = tokenizer.decode(context)
        self.num_tokens = 0
        """Ids passed to :meth:`add` so far, including skipped special ones."""

    def _is_text(self, token_id: int) -> bool:
        """Whether the id contributes to decoded text (known and not special)."""
        return 0 <= token_id < self._vocab_size and token_id not in self._special

    def add(self, token_ids: Iterable[int]) -> str:
        """Feed generated ids; return the text that became final (possibly ``""``).

        Text ending in an unfinished UTF-8 character is held back until a later token
        completes it (or :meth:`flush`). Special and unknown ids produce no text.
        """
        pieces: list[str] = []
        for token_id in token_ids:
            self.num_tokens += 1
            if not self._is_text(token_id):
                continue
            self._ids.append(token_id)
            text = self._tokenizer.decode(self._ids[self._prefix :])
            if len(text) <= len(self._prefix_text):
                continue  # nothing visible yet (for example a lone byte of a character)
            held = len(self._ids) - self._read
            if text.endswith(_REPLACEMENT) and held < MAX_HELD_TOKENS:
                continue
            pieces.append(text[len(self._prefix_text) :])
            self._advance()
        return "".join(pieces)

    def flush(self) -> str:
        """Release all held text, including an unfinished character as U+FFFD.

        Call once at the end of the stream; afterwards the stream starts a fresh window.
        """
        text = self._tokenizer.decode(self._ids[self._prefix :])
        piece = text[len(self._prefix_text) :] if len(text) > len(self._prefix_text) else ""
        if len(self._ids) > self._read:
            self._advance()
        return piece

    def _advance(self) -> None:
        """Mark everything up to the end as emitted; keep the last batch as context."""
        self._prefix, self._read = self._read, len(self._ids)
        # drop ids before the window so memory stays O(window)
        del self._ids[: self._prefix]
        self._read -= self._prefix
        self._prefix = 0
        self._prefix_text = self._tokenizer.decode(self._ids[: self._read])
