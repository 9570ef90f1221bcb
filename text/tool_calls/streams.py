"""Tool calls as a reply streams (``houchu.text.tool_calls.parse``): content is released as it
comes except text that may start a call marker, held back until it cannot; a call is
released once complete (its name, then its arguments), as OpenAI's deltas do."""

from __future__ import annotations

import abc
from typing import TYPE_CHECKING, Any

from houchu.text.tool_calls.types import StreamDelta, ToolCall

if TYPE_CHECKING:
    from houchu.text.tool_calls.parse import MarkerParser, ToolCallParser


class ToolCallStream(abc.ABC):
    """An incremental parser: ``feed`` each new piece of text, then ``finish``. The
    calls released so far are ``calls``."""

    def __init__(self) -> None:
        self.calls: list[ToolCall] = []

    @abc.abstractmethod
    def feed(self, text: str) -> StreamDelta:
        """Release what ``text`` (the next piece of the reply) allows."""

    @abc.abstractmethod
    def finish(self) -> StreamDelta:
        """Release the rest (the reply is complete)."""

    def _release(self, calls: list[ToolCall]) -> list[dict[str, Any]]:
        """Deltas of complete calls: one entry per call (its ``index``, id, name and
        whole arguments), as OpenAI sends at most one entry per index in a chunk."""
        out = []
        for c in calls:
            i = len(self.calls)
            self.calls.append(c)
            out.append(c.to_openai(i))
        return out


class BufferedStream(ToolCallStream):
    """Holds the whole reply when it may be a call (it starts like one), else streams
    it as content; parses at the end."""

    def __init__(self, parser: ToolCallParser) -> None:
        super().__init__()
        self.parser, self.held = parser, ""
        self.holding: bool | None = None  # None: not known yet

    def feed(self, text: str) -> StreamDelta:
        if self.holding is False:
            return StreamDelta(content=text)
        self.held += text
        head = self.held.lstrip()
        if not head:
            return StreamDelta()
        self.holding = head[0] in "{[<"
        if self.holding:
            return StreamDelta()
        out, self.held = self.held, ""
        return StreamDelta(content=out)

    def finish(self) -> StreamDelta:
        if not self.held:
            return StreamDelta()
        parsed = self.parser.parse(self.held)
        self.held = ""
        return StreamDelta(content=parsed.content or "", tool_calls=self._release(parsed.calls))


class HeldStream(BufferedStream):
    """Holds the whole reply and parses it at the end: for a parser whose reply is never
    content (``RequiredCallsParser``), so no piece of it is streamed as content, even
    one that does not start like a call."""

    def feed(self, text: str) -> StreamDelta:
        self.held += text
        return StreamDelta()


class MarkerStream(ToolCallStream):
    """Streams content around ``start`` / ``end`` markers; each call is released when
    its end marker arrives (or at the end).

    Whitespace is held back until non-blank content follows it, or until the end: a
    reply that is only calls (and whitespace around them) has no content, as the whole
    reply's parse says (``MarkerParser.parse``), so no blank content delta is streamed
    (SGLang's and vLLM's parsers hold whitespace back the same way).
    """

    def __init__(self, parser: MarkerParser) -> None:
        super().__init__()
        self.parser, self.buf, self.inside = parser, "", False
        self.blank = ""  # whitespace held back while no non-blank content is out
        self.spoke = False  # some non-blank content is out

    def feed(self, text: str) -> StreamDelta:
        self.buf += text
        out = StreamDelta()
        p = self.parser
        while True:
            if not self.inside:
                i = self.buf.find(p.start)
                if i < 0:
                    keep = _partial_suffix(self.buf, p.start)
                    self._say(self.buf[: len(self.buf) - keep], out)
                    self.buf = self.buf[len(self.buf) - keep :]
                    return out
                self._say(self.buf[:i], out)
                self.buf, self.inside = self.buf[i:], True
            j = self.buf.find(p.end, len(p.start)) if p.end else -1
            if j < 0:
                return out
            whole, self.buf, self.inside = (
                self.buf[: j + len(p.end)],
                self.buf[j + len(p.end) :],
                False,
            )
            self._add(whole, out)

    def finish(self) -> StreamDelta:
        out = StreamDelta()
        if self.inside:
            self._add(self.buf, out)
        else:
            self._say(self.buf, out)
        if not self.calls:  # no call: the reply is its text, blank or not
            out.content += self.blank
        self.buf, self.inside, self.blank = "", False, ""
        return out

    def _add(self, whole: str, out: StreamDelta) -> None:
        parsed = self.parser.parse(whole)
        self._say(parsed.content or "", out)
        out.tool_calls.extend(self._release(parsed.calls))

    def _say(self, text: str, out: StreamDelta) -> None:
        """Release content ``text``, holding whitespace back until non-blank text comes."""
        if not self.spoke and not text.strip():
            self.blank += text
            return
        out.content += self.blank + text
        self.blank, self.spoke = "", True


class ForcedStream(ToolCallStream):
    """A named ``tool_choice``: the call starts at once; every piece of text is a
    fragment of its arguments."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.call = ToolCall(name, "")
        self.started = False

    def feed(self, text: str) -> StreamDelta:
        out = StreamDelta()
        self.call.arguments += text
        if not self.started:  # the first entry: id, name and the arguments so far
            self.started = True
            self.calls.append(self.call)
            first = self.call.to_openai(0)
            first["function"]["arguments"] = text
            out.tool_calls.append(first)
        elif text:
            out.tool_calls.append({"index": 0, "function": {"arguments": text}})
        return out

    def finish(self) -> StreamDelta:
        return self.feed("") if not self.started else StreamDelta()


class FirstCallStream(ToolCallStream):
    """``inner``'s deltas of its first call only, and nothing after it
    (``FirstCallParser``); ``end``: the parser's end-of-call marker ("" if none), where
    the text ``inner`` is fed stops."""

    def __init__(self, inner: ToolCallStream, end: str = "") -> None:
        super().__init__()
        self.inner, self.end = inner, end
        self.seen = ""  # the text fed so far (while an end marker may still come)
        self.done = False  # the first call is out: the rest of the reply is dropped

    def feed(self, text: str) -> StreamDelta:
        if not self.end:
            return self._first(self.inner.feed(text))
        out = StreamDelta()
        while text and not self.done:  # up to each end marker, until a call is out
            self.seen += text
            at = self.seen.find(self.end)
            keep = len(text) if at < 0 else len(text) - (len(self.seen) - at - len(self.end))
            piece, text = text[:keep], text[keep:]
            if at >= 0:
                self.seen = ""
            d = self._first(self.inner.feed(piece))
            out.content += d.content
            out.tool_calls += d.tool_calls
        return out

    def finish(self) -> StreamDelta:
        return self._first(self.inner.finish())

    def _first(self, d: StreamDelta) -> StreamDelta:
        if self.done:
            return StreamDelta()
        self.calls = self.inner.calls[:1]
        self.done = bool(self.calls)
        return StreamDelta(d.content, [t for t in d.tool_calls if t["index"] == 0])


def _partial_suffix(text: str, marker: str) -> int:
    """Length of the longest suffix of ``text`` that is a proper prefix of ``marker``."""
    for n in range(min(len(text), len(marker) - 1), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0
