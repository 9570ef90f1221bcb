"""Stop strings matched on streamed text, as the OpenAI API and vLLM define them.

The output ends right before the earliest occurrence of any stop string; the stop string
itself is never emitted. Text arrives in pieces (one per detokenized token batch), so a
stop string can span pieces; text that could still turn into a stop string is held back
and released as soon as it cannot.

"Earliest" is decided on the whole text, so the result does not depend on how the text
was split: with stops ``["abcd", "bc"]`` and the text ``"abcd"``, output is ``""`` whether
``"abc"`` arrived first (where ``"bc"`` is already complete but ``"abcd"`` could still
match earlier) or everything at once. When such a tie is open, the stop is declared on the
piece that decides it, or at :meth:`StopStringMatcher.flush`.

All positions and lengths are in Python characters (code points), not bytes or tokens.

Stop *ids* end a request when sampled; ``stop_ids`` computes them once per request (the
tokenizer actor sends them to the scheduler in ``TokenizedRequest.stop_ids``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from houchu.transport.messages import SamplingParams


def stop_ids(sampling: SamplingParams, eos_token_ids: Sequence[int]) -> list[int]:
    """The token ids that end a request when sampled: its ``stop_token_ids``, and the
    model's end-of-sequence ids unless ``ignore_eos`` (no duplicates, in that order).

    A request with an output grammar (structured output) keeps its EOS ids whatever
    ``ignore_eos``: the grammar allows EOS only where its text is complete, and then
    nothing else, so its end ends the output (as SGLang ends a request whose grammar
    terminated) rather than forcing EOS tokens until ``max_tokens``."""
    ignore = sampling.ignore_eos and sampling.structured is None
    ids = [*sampling.stop_token_ids, *(() if ignore else eos_token_ids)]
    return list(dict.fromkeys(ids))


class StopStringMatcher:
    """Filters one request's text stream through its stop strings.

    Not thread-safe; one instance per request.
    """

    def __init__(self, stops: Iterable[str], include: bool = False) -> None:
        """Compile the stop list (duplicates are ignored, order kept). ``include``: the
        matched stop string is emitted as the output's end (vLLM's
        ``include_stop_str_in_output``); by default it is cut.

        Raises ``ValueError`` if a stop string is empty or not a ``str``.
        """
        self.stops: list[str] = []
        for stop in stops:
            if not isinstance(stop, str) or not stop:
                raise ValueError(f"stop strings must be non-empty strings, got {stop!r}")
            if stop not in self.stops:
                self.stops.append(stop)
        self.include = include
        self._held = ""
        self.stopped = False
        """True once a stop string matched; all later text is dropped."""
        self.matched: str | None = None
        """The stop string that ended the output (OpenAI's ``stop_reason``), if any."""

    @property
    def held(self) -> str:
        """Text received but not yet released (a possible start of a stop string)."""
        return self._held

    def feed(self, text: str) -> tuple[str, bool]:
        """Add streamed text; return (text safe to emit now, whether a stop matched).

        Once stopped, returns ``("", True)`` for any further text.
        """
        if self.stopped:
            return "", True
        if not self.stops:
            return text, False
        buffer = self._held + text
        match = self._earliest_match(buffer)
        pending = self._earliest_partial(buffer)
        if match is not None and match[0] <= pending:
            return self._stop(buffer, match), True
        self._held = buffer[pending:]
        return buffer[:pending], False

    def flush(self) -> str:
        """End of stream: release held text, cut at a stop string still undecided.

        After it, :attr:`stopped` tells whether the output ended on a stop string.
        """
        if self.stopped:
            return ""
        buffer, self._held = self._held, ""
        match = self._earliest_match(buffer)
        if match is not None:
            return self._stop(buffer, match)
        return buffer

    def _stop(self, buffer: str, match: tuple[int, str]) -> str:
        """Record the match and return the text before it (through it, with
        ``include``)."""
        self.stopped = True
        self.matched = match[1]
        self._held = ""
        return buffer[: match[0] + (len(match[1]) if self.include else 0)]

    def _earliest_match(self, buffer: str) -> tuple[int, str] | None:
        """(index, stop) of the earliest complete stop string in ``buffer``, or None."""
        best: tuple[int, str] | None = None
        for stop in self.stops:
            index = buffer.find(stop)
            if index >= 0 and (best is None or index < best[0]):
                best = (index, stop)
        return best

    def _earliest_partial(self, buffer: str) -> int:
        """Smallest i such that ``buffer[i:]`` is a proper prefix of a stop string.

        Text before it can never be part of a stop string and is safe to release;
        ``len(buffer)`` when no suffix is such a prefix.
        """
        longest = max(len(stop) for stop in self.stops)
        for start in range(max(0, len(buffer) - longest + 1), len(buffer)):
            tail = buffer[start:]
            if any(len(tail) < len(stop) and stop.startswith(tail) for stop in self.stops):
                return start
        return len(buffer)
