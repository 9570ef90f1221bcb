"""Shapes of the OpenAI-compatible responses: chunks, full responses, usage, logprobs.

Pure functions and small classes with no I/O, so the streaming and non-streaming paths
(and the WebSocket API, for usage and logprobs) build their JSON the same way.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from houchu.text.tool_calls import StreamDelta, ToolCallParser, ToolCallStream
from houchu.transport.messages import TextDelta, TokenLogprob


@dataclass
class Tally:
    """Accumulates a request's text, logprobs, counters and finish reason over its deltas.

    Counters are cumulative in the engine's deltas; the largest value seen is kept, so a
    counter sent only once (``cached_tokens`` with the first delta) or only at the end is
    reported either way.
    """

    texts: list[str] = field(default_factory=list)
    logprobs: list[TokenLogprob] = field(default_factory=list)
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    finish_reason: str | None = None

    def add(self, delta: TextDelta) -> None:
        """Fold one delta in."""
        self.texts.append(delta.text)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        self.prompt_tokens = max(self.prompt_tokens, delta.prompt_tokens)
        self.completion_tokens = max(self.completion_tokens, delta.completion_tokens)
        self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason

    @property
    def text(self) -> str:
        """All text so far."""
        return "".join(self.texts)

    def usage(self) -> dict[str, Any]:
        """The OpenAI ``usage`` object, with ``prompt_tokens_details.cached_tokens``."""
        return {
            "prompt_tokens": self.prompt_tokens,
            "completion_tokens": self.completion_tokens,
            "total_tokens": self.prompt_tokens + self.completion_tokens,
            "prompt_tokens_details": {"cached_tokens": self.cached_tokens},
        }


def token_bytes(token: str) -> list[int]:
    """UTF-8 bytes of a token's text (for alternatives, whose raw bytes are not sent)."""
    return list(token.encode("utf-8", errors="replace"))


def chat_logprobs(lps: list[TokenLogprob], top_n: int) -> dict[str, Any]:
    """Chat format: ``{"content": [{"token", "logprob", "bytes", "top_logprobs"}]}``."""
    return {
        "content": [
            {
                "token": lp.token,
                "logprob": lp.logprob,
                "bytes": list(lp.bytes_),
                "top_logprobs": [
                    {"token": t, "logprob": p, "bytes": token_bytes(t)}
                    for t, _, p in lp.top[:top_n]
                ],
            }
            for lp in lps
        ]
    }


def completion_logprobs(
    lps: list[TokenLogprob], top_n: int, offset: int = 0
) -> tuple[dict[str, Any], int]:
    """Legacy completions format, and the text offset after the last token.

    ``{"tokens", "token_logprobs", "top_logprobs": [{token: logprob}], "text_offset"}``;
    each ``top_logprobs`` entry holds the ``top_n`` best alternatives and the sampled
    token (so up to ``top_n + 1`` entries, as in the OpenAI API). ``text_offset`` counts
    characters from the start of the completion, continuing from ``offset``.
    """
    tokens, token_lps, tops, offsets = [], [], [], []
    for lp in lps:
        tokens.append(lp.token)
        token_lps.append(lp.logprob)
        top = {t: p for t, _, p in lp.top[:top_n]}
        top.setdefault(lp.token, lp.logprob)
        tops.append(top)
        offsets.append(offset)
        offset += len(lp.token)
    body = {
        "tokens": tokens,
        "token_logprobs": token_lps,
        "top_logprobs": tops,
        "text_offset": offsets,
    }
    return body, offset


def ws_logprobs(lps: list[TokenLogprob], top_n: int) -> list[dict[str, Any]]:
    """WebSocket format: one object per token, with token ids."""
    return [
        {
            "token": lp.token,
            "token_id": lp.token_id,
            "logprob": lp.logprob,
            "bytes": list(lp.bytes_),
            "top_logprobs": [
                {"token": t, "token_id": i, "logprob": p} for t, i, p in lp.top[:top_n]
            ],
        }
        for lp in lps
    ]


def tool_finish(reason: str | None, called: bool) -> str | None:
    """OpenAI's finish reason of a reply that made tool calls: "tool_calls" where it
    ended by itself."""
    return "tool_calls" if called and reason == "stop" else reason


class Formatter:
    """Builds one response's JSON objects; subclasses fix the endpoint's shapes.

    Args:
        rid: the response id (also the engine request id).
        created: unix seconds.
        model: the served model name.
        logprobs: whether the client asked for logprobs.
        top_n: alternatives per token.
        include_usage: stream chunks carry ``"usage": null`` and a usage chunk follows.
        tool_parser: how the reply is parsed into tool calls (chat with ``tools``), or
            None.
    """

    object_name = ""
    chunk_object_name = ""

    def __init__(
        self,
        rid: str,
        created: int,
        model: str,
        *,
        logprobs: bool,
        top_n: int,
        include_usage: bool = False,
        tool_parser: ToolCallParser | None = None,
    ) -> None:
        self.tool_parser = tool_parser
        self.tool_stream: ToolCallStream | None = tool_parser.stream() if tool_parser else None
        self.rid = rid
        self.created = created
        self.model = model
        self.logprobs = logprobs
        self.top_n = top_n
        self.include_usage = include_usage

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _chunk(self, choice: dict[str, Any]) -> dict[str, Any]:
        out = self._envelope(self.chunk_object_name, [{"index": 0, **choice}])
        if self.include_usage:
            out["usage"] = None
        return out

    def start_chunks(self) -> list[dict[str, Any]]:
        """Chunks sent before the first content."""
        return []

    def content_chunk(self, text: str, lps: list[TokenLogprob] | None) -> dict[str, Any]:
        """A chunk carrying new text (and its logprobs)."""
        raise NotImplementedError

    def finish_chunk(self, reason: str) -> dict[str, Any]:
        """The chunk carrying ``finish_reason``."""
        raise NotImplementedError

    def content_chunks(self, text: str, lps: list[TokenLogprob] | None) -> list[dict[str, Any]]:
        """The chunks new text makes (tool-call deltas too, on chat with tools)."""
        return [self.content_chunk(text, lps)]

    def finish_chunks(self, reason: str) -> list[dict[str, Any]]:
        """The last chunks: what was held back, then ``finish_reason``."""
        return [self.finish_chunk(reason)]

    def usage_chunk(self, tally: Tally) -> dict[str, Any]:
        """The last chunk when ``include_usage``: no choices, the usage."""
        out = self._envelope(self.chunk_object_name, [])
        out["usage"] = tally.usage()
        return out

    def response(self, tally: Tally) -> dict[str, Any]:
        """The non-streaming response."""
        raise NotImplementedError


class CompletionFormatter(Formatter):
    """``/v1/completions``: ``object`` is ``text_completion`` for chunks and responses."""

    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._offset = 0

    def content_chunk(self, text: str, lps: list[TokenLogprob] | None) -> dict[str, Any]:
        logprobs = None
        if self.logprobs:
            logprobs, self._offset = completion_logprobs(lps or [], self.top_n, self._offset)
        return self._chunk({"text": text, "logprobs": logprobs, "finish_reason": None})

    def finish_chunk(self, reason: str) -> dict[str, Any]:
        return self._chunk({"text": "", "logprobs": None, "finish_reason": reason})

    def response(self, tally: Tally) -> dict[str, Any]:
        logprobs = completion_logprobs(tally.logprobs, self.top_n)[0] if self.logprobs else None
        choice = {
            "index": 0,
            "text": tally.text,
            "logprobs": logprobs,
            "finish_reason": tally.finish_reason,
        }
        out = self._envelope(self.object_name, [choice])
        out["usage"] = tally.usage()
        return out


class ChatFormatter(Formatter):
    """``/v1/chat/completions``: ``chat.completion`` / ``chat.completion.chunk``."""

    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def start_chunks(self) -> list[dict[str, Any]]:
        delta = {"role": "assistant", "content": ""}
        return [self._chunk({"delta": delta, "logprobs": None, "finish_reason": None})]

    def content_chunk(self, text: str, lps: list[TokenLogprob] | None) -> dict[str, Any]:
        logprobs = chat_logprobs(lps or [], self.top_n) if self.logprobs else None
        return self._chunk(
            {"delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
        )

    def finish_chunk(self, reason: str) -> dict[str, Any]:
        return self._chunk({"delta": {}, "logprobs": None, "finish_reason": reason})

    def content_chunks(self, text: str, lps: list[TokenLogprob] | None) -> list[dict[str, Any]]:
        if self.tool_stream is None:
            return [self.content_chunk(text, lps)]
        return self._tool_chunks(self.tool_stream.feed(text), lps)

    def finish_chunks(self, reason: str) -> list[dict[str, Any]]:
        if self.tool_stream is None:
            return [self.finish_chunk(reason)]
        out = self._tool_chunks(self.tool_stream.finish(), None)
        return [*out, self.finish_chunk(tool_finish(reason, bool(self.tool_stream.calls)))]

    def _tool_chunks(self, d: StreamDelta, lps: list[TokenLogprob] | None) -> list[dict[str, Any]]:
        out = []
        if d.content or (lps and self.logprobs):
            out.append(self.content_chunk(d.content, lps))
        if d.tool_calls:
            delta = {"tool_calls": d.tool_calls}
            out.append(self._chunk({"delta": delta, "logprobs": None, "finish_reason": None}))
        return out

    def response(self, tally: Tally) -> dict[str, Any]:
        logprobs = chat_logprobs(tally.logprobs, self.top_n) if self.logprobs else None
        message: dict[str, Any] = {"role": "assistant", "content": tally.text}
        reason = tally.finish_reason
        if self.tool_parser is not None:
            parsed = self.tool_parser.parse(tally.text)
            message["content"] = parsed.content
            if parsed.calls:
                message["tool_calls"] = [c.to_openai() for c in parsed.calls]
            reason = tool_finish(reason, bool(parsed.calls))
        choice = {
            "index": 0,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": reason,
        }
        out = self._envelope(self.object_name, [choice])
        out["usage"] = tally.usage()
        return out
