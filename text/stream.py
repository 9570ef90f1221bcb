"""One request's output text: incremental detokenization followed by stop strings.

This is the composition the tokenizer actor runs per request::

    stream = TextStream(tokenizer, prompt_ids, sampling.stop)
    text, stopped = stream.add(event.token_ids)   # per TokenEvent
    if stopped: tell the scheduler to finish the request (AbortRequest reason "stop")
    text = stream.finish()                         # when the request finished otherwise

Everything returned is whole UTF-8 characters and never part of a stop string.
"""

from __future__ import annotations

from collections.abc import Iterable

from houchu.text.detokenizer import IncrementalDetokenizer
from houchu.text.stop import StopStringMatcher
from houchu.text.tokenizer import TextTokenizer


class TextStream:
    """Detokenizer plus stop-string matcher for one request. Not thread-safe."""

    def __init__(
        self,
        tokenizer: TextTokenizer,
        prompt_ids: Iterable[int] | None = None,
        stops: Iterable[str] = (),
    ) -> None:
        """Raises ``ValueError`` for an empty stop string."""
        self.stop = StopStringMatcher(stops)
        self.detokenizer = IncrementalDetokenizer(tokenizer, prompt_ids)
        self.text_len = 0
        """Characters released so far."""

    @property
    def stopped(self) -> bool:
        """Whether a stop string ended the output."""
        return self.stop.stopped

    def add(self, token_ids: Iterable[int]) -> tuple[str, bool]:
        """Feed generated ids; return (text to emit now, whether a stop string matched).

        After a match, further calls return ``("", True)`` and do not decode.
        """
        if self.stop.stopped:
            return "", True
        text, stopped = self.stop.feed(self.detokenizer.add(token_ids))
        self.text_len += len(text)
        return text, stopped

    def finish(self) -> str:
        """End of generation (EOS, length, abort): release all remaining text.

        The tail may still end on a stop string; check :attr:`stopped` afterwards.
        """
        if self.stop.stopped:
            return ""
        text, stopped = self.stop.feed(self.detokenizer.flush())
        if not stopped:
            text += self.stop.flush()
        self.text_len += len(text)
        return text
