"""Prompt text of a controlled length in tokens, built from a fixed word list.

Every word of :data:`WORDS` is common English; with a tokenizer, only the words that
encode to exactly one token after a space are kept, so a prompt of ``n`` words is ``n``
tokens (checked, and corrected, by encoding it). Without a tokenizer each word is assumed
to be one token, which holds for most byte-level BPE vocabularies and is approximate
otherwise; the server's reported ``usage.prompt_tokens`` is what the metrics use.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Protocol

WORDS = (
    "the of and to in is for on that with as was at by it from be this are or an have not "
    "they which one you were all we her she there would their will when who him been has "
    "more if no out so said what up its about into than them can only other new some time "
    "could these two may then do first any my now such like our over man me even most made "
    "after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still "
    "own see men work long get here between both life being under never day same another "
    "know while last might us great old year off come since against go came right used take "
    "three house water light river stone bread table garden window music paper letter road "
    "city field story market summer winter morning evening school kitchen mountain forest "
    "island bridge castle engine orange yellow green blue small large quick bright quiet "
    "happy simple strong early later open close begin follow answer number question "
    "system reason moment power change point family friend country company problem service"
).split()


class Encoder(Protocol):
    """What prompt building needs of a tokenizer: ``encode(text) -> ids``."""

    def encode(self, text: str) -> list[int]: ...


class PromptBuilder:
    """Builds prompt text of a given token count.

    Args:
        tokenizer: encodes text to ids, or None to count one token per word.
    """

    def __init__(self, tokenizer: Encoder | None = None) -> None:
        self._tok = tokenizer
        if tokenizer is None:
            self._words = list(WORDS)
            self._overhead = 0
        else:
            self._words = [w for w in WORDS if _one(tokenizer, w)]
            self._overhead = len(tokenizer.encode(""))
        if len(self._words) < 16:
            raise ValueError("the tokenizer splits nearly every word; cannot build prompts")

    @property
    def exact(self) -> bool:
        """Whether token counts are checked against a real tokenizer."""
        return self._tok is not None

    def count(self, text: str) -> int:
        """Tokens of ``text`` (without BOS), or its words without a tokenizer."""
        if self._tok is None:
            return len(text.split())
        return len(self._tok.encode(text)) - self._overhead

    def text(self, rng: random.Random, n_tokens: int) -> str:
        """Random words making ``n_tokens`` tokens (exactly, with a tokenizer).

        Different seeds give different first words, so unrelated prompts share no prefix
        beyond chance. The text may start with a space (that makes the first word one
        token in byte-level BPE vocabularies).
        """
        words = [rng.choice(self._words) for _ in range(n_tokens)]
        text = " ".join(words)
        if self._tok is None:
            return text
        # the first word has no leading space and may split: try a leading space, then
        # trim or pad words until the count is right
        for _ in range(8):
            for cand in (text, " " + text):
                if self.count(cand) == n_tokens:
                    return cand
            if self.count(text) > n_tokens and len(words) > 1:
                words.pop()
            else:
                words.append(rng.choice(self._words))
            text = " ".join(words)
        return text


def _one(tokenizer: Encoder, word: str) -> bool:
    """Whether ``" " + word`` is exactly one token (beyond any BOS)."""
    return len(tokenizer.encode(" " + word)) - len(tokenizer.encode("")) == 1


def load_encoder(spec: str | None) -> Encoder | None:
    """The tokenizer named by ``--tokenizer``.

    ``spec`` is a ``.gguf`` file or a Hugging Face model folder, ``"none"`` for word
    counting, or None for the default model's tokenizer when it is already fetched
    (word counting otherwise).
    """
    if spec is not None and spec.lower() == "none":
        return None
    from houchu.model.fetch import default_model_path

    path = Path(spec) if spec else default_model_path()
    if spec is None and not path.exists():
        return None
    from houchu.text.tokenizer.core import load_tokenizer

    return load_tokenizer(path)
