"""vLLM's ``bad_words``: the token sequences of words a request must never generate."""

from __future__ import annotations

from collections.abc import Sequence

from houchu.text.tokenizer.core import TextTokenizer


def bad_words_ids(tokenizer: TextTokenizer, words: Sequence[str]) -> list[list[int]]:
    """The token id sequences to ban for ``words``, as vLLM builds them
    (``vllm.sampling_params.SamplingParams.update_from_tokenizer``): each word as it
    stands (leading spaces stripped) and, where it encodes to a different first token of
    the same length, with one leading space (the word inside a text), without BOS.

    Returns:
        list of non-empty lists of token ids (a word that encodes to nothing is dropped).
    """
    out: list[list[int]] = []
    for word in words:
        bare = tokenizer.encode_plain(word.lstrip())
        if not bare:
            continue
        out.append(bare)
        spaced = tokenizer.encode_plain(" " + word.lstrip())
        if spaced and spaced[0] != bare[0] and len(spaced) == len(bare):
            out.append(spaced)
    return out
