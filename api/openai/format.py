"""Shapes of the OpenAI-compatible responses: chunks and full responses.

Pure functions and small classes with no I/O, so the streaming and non-streaming paths
(and the WebSocket API, for usage and logprobs) build their JSON the same way. The
tally of a response is in ``houchu.api.tally``, the logprobs bodies in
``houchu.api.openai.logprobs`` (both re-exported here).
"""

from __future__ import annotations

import abc
from typing import Any

from houchu.api.openai.logprobs import (
    chat_logprobs,
    completion_logprobs,
    echo_logprobs,
    join_logprobs,
    token_bytes,
    vllm_prompt_logprobs,
    ws_logprobs,
)
from houchu.api.tally import Tally, usage_of
from houchu.text.tool_calls.parse import ToolCallParser
from houchu.text.tool_calls.streams import ToolCallStream
from houchu.text.tool_calls.types import StreamDelta
from houchu.transport.messages import TokenLogprob

__all__ = [
    "ChatFormatter",
    "CompletionFormatter",
    "Formatter",
    "Tally",
    "chat_logprobs",
    "completion_logprobs",
    "echo_logprobs",
    "join_logprobs",
    "token_bytes",
    "tool_finish",
    "usage_of",
    "vllm_prompt_logprobs",
    "ws_logprobs",
]


def tool_finish(reason: str | None, called: bool) -> str | None:
    """OpenAI's finish reason of a reply that made tool calls: "tool_calls" where it
    ended by itself."""
    return "tool_calls" if called and reason == "stop" else reason


class Formatter(abc.ABC):
    """Builds one response's JSON objects; subclasses fix the endpoint's shapes.

    Args:
        rid: the response id (also the engine request id, or its choices' prefix).
        created: unix seconds.
        model: the served model name.
        logprobs: whether the client asked for logprobs.
        top_n: alternatives per token.
        include_usage: stream chunks carry ``"usage": null`` and a usage chunk follows.
        continuous_usage: (with ``include_usage``) every chunk's ``usage`` is the counts
            so far (vLLM's ``continuous_usage_stats``: ``with_running_usage``).
        tool_parser: how the reply is parsed into tool calls (chat with ``tools``), or
            None; every choice is parsed on its own.
        echo: the prompt comes before each choice's text (completions).
        prompt_logprobs: the client asked for vLLM's ``prompt_logprobs``.
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
        continuous_usage: bool = False,
        tool_parser: ToolCallParser | None = None,
        echo: bool = False,
        prompt_logprobs: bool = False,
    ) -> None:
        self.tool_parser = tool_parser
        self.tool_streams: dict[int, ToolCallStream] = {}  # choice -> its tool-call parser
        #: choice -> logprobs of tokens whose text a tool-call parser holds back (sent
        #: with the choice's next chunk: no empty content delta carries them)
        self.held_logprobs: dict[int, list[TokenLogprob]] = {}
        self.rid = rid
        self.created = created
        self.model = model
        self.logprobs = logprobs
        self.top_n = top_n
        self.include_usage = include_usage
        self.continuous_usage = continuous_usage and include_usage
        self.echo = echo
        self.prompt_logprobs = prompt_logprobs

    def _envelope(self, obj: str, choices: list[dict[str, Any]]) -> dict[str, Any]:
        return {
            "id": self.rid,
            "object": obj,
            "created": self.created,
            "model": self.model,
            "choices": choices,
        }

    def _chunk(self, index: int, choice: dict[str, Any]) -> dict[str, Any]:
        out = self._envelope(self.chunk_object_name, [{"index": index, **choice}])
        if self.include_usage:
            out["usage"] = None
        return out

    def start_chunks(self, index: int = 0) -> list[dict[str, Any]]:
        """Chunks sent before choice ``index``'s first content."""
        return []

    def prompt_chunks(self, index: int, prompt: Tally) -> list[dict[str, Any]]:
        """Chunks of the prompt (``echo``, ``prompt_logprobs``) before choice
        ``index``'s first content; ``prompt``: the tally holding them."""
        return []

    @abc.abstractmethod
    def content_chunk(
        self, text: str, lps: list[TokenLogprob] | None, index: int = 0
    ) -> dict[str, Any]:
        """A chunk carrying new text (and its logprobs) of choice ``index``."""

    @abc.abstractmethod
    def finish_chunk(
        self, reason: str, index: int = 0, stop_reason: int | str | None = None
    ) -> dict[str, Any]:
        """The chunk carrying choice ``index``'s ``finish_reason`` and vLLM's
        ``stop_reason`` (the stop string or ``stop_token_ids`` id that ended it, or
        null), as vLLM's last chunk of a choice carries them."""

    def content_chunks(
        self, text: str, lps: list[TokenLogprob] | None, index: int = 0
    ) -> list[dict[str, Any]]:
        """The chunks new text of choice ``index`` makes (tool-call deltas too, on chat
        with tools)."""
        return [self.content_chunk(text, lps, index)]

    def finish_chunks(
        self, reason: str, index: int = 0, stop_reason: int | str | None = None
    ) -> list[dict[str, Any]]:
        """Choice ``index``'s last chunks: what was held back, then ``finish_reason``
        (with ``stop_reason``)."""
        return [self.finish_chunk(reason, index, stop_reason)]

    def with_running_usage(self, chunk: dict[str, Any], tallies: list[Tally]) -> dict[str, Any]:
        """``chunk`` with its ``usage`` filled in when ``continuous_usage``, as vLLM
        fills it: the prompt and the tokens of the chunk's choice so far (``tallies``:
        every choice's, by index); a chunk without a choice (the chat API's
        ``prompt_logprobs``) counts every choice. Other chunks are returned as given."""
        if not self.continuous_usage or "usage" not in chunk or chunk["usage"] is not None:
            return chunk
        choices = chunk["choices"]
        mine = [tallies[choices[0]["index"]]] if choices else tallies
        return {**chunk, "usage": usage_of(mine)}

    def usage_chunk(self, tally: Tally | list[Tally]) -> dict[str, Any]:
        """The last chunk when ``include_usage``: no choices, the usage of every choice."""
        out = self._envelope(self.chunk_object_name, [])
        out["usage"] = usage_of(tally if isinstance(tally, list) else [tally])
        return out

    def response(
        self, tally: Tally | list[Tally], order: list[int] | None = None
    ) -> dict[str, Any]:
        """The non-streaming response: the choices ``order`` (default: all) of
        ``tally`` (one per generated choice; the first holds the prompt's text and
        logprobs), renumbered from 0; the usage counts every generated choice."""
        tallies = tally if isinstance(tally, list) else [tally]
        order = list(range(len(tallies))) if order is None else order
        choices = [self._choice(i, tallies[j], tallies[0]) for i, j in enumerate(order)]
        out = self._envelope(self.object_name, choices)
        out["usage"] = usage_of(tallies)
        return out

    @abc.abstractmethod
    def _choice(self, index: int, tally: Tally, prompt: Tally) -> dict[str, Any]:
        """Choice ``index`` of a non-streaming response, from its ``tally`` (``prompt``:
        the tally holding the prompt's text and logprobs)."""


class CompletionFormatter(Formatter):
    """``/v1/completions``: ``object`` is ``text_completion`` for chunks and responses."""

    object_name = "text_completion"
    chunk_object_name = "text_completion"

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._offsets: dict[int, int] = {}  # choice -> text offset of its next token

    def prompt_chunks(self, index: int, prompt: Tally) -> list[dict[str, Any]]:
        if not self.echo and not self.prompt_logprobs:
            return []
        logprobs = None
        if self.echo and self.logprobs:
            logprobs, self._offsets[index] = echo_logprobs(prompt.prompt_logprobs or [], self.top_n)
        choice: dict[str, Any] = {
            "text": (prompt.prompt_text or "") if self.echo else "",
            "logprobs": logprobs,
            "finish_reason": None,
        }
        if self.prompt_logprobs:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(prompt.prompt_logprobs)
        return [self._chunk(index, choice)]

    def content_chunk(
        self, text: str, lps: list[TokenLogprob] | None, index: int = 0
    ) -> dict[str, Any]:
        logprobs = None
        if self.logprobs:
            offset = self._offsets.get(index, 0)
            logprobs, self._offsets[index] = completion_logprobs(lps or [], self.top_n, offset)
        return self._chunk(index, {"text": text, "logprobs": logprobs, "finish_reason": None})

    def finish_chunk(
        self, reason: str, index: int = 0, stop_reason: int | str | None = None
    ) -> dict[str, Any]:
        choice = {"text": "", "logprobs": None, "finish_reason": reason, "stop_reason": stop_reason}
        return self._chunk(index, choice)

    def _choice(self, index: int, tally: Tally, prompt: Tally) -> dict[str, Any]:
        text, logprobs = tally.text, None
        if self.echo:
            text = (prompt.prompt_text or "") + text
        if self.logprobs:
            offset = 0
            head = None
            if self.echo:
                head, offset = echo_logprobs(prompt.prompt_logprobs or [], self.top_n)
            logprobs = completion_logprobs(tally.logprobs, self.top_n, offset)[0]
            if head is not None:
                logprobs = join_logprobs(head, logprobs)
        choice = {
            "index": index,
            "text": text,
            "logprobs": logprobs,
            "finish_reason": tally.finish_reason,
            "stop_reason": tally.stop_reason,
        }
        if self.prompt_logprobs:
            choice["prompt_logprobs"] = vllm_prompt_logprobs(prompt.prompt_logprobs)
        return choice


class ChatFormatter(Formatter):
    """``/v1/chat/completions``: ``chat.completion`` / ``chat.completion.chunk``; vLLM's
    ``prompt_logprobs`` sits beside ``choices``."""

    object_name = "chat.completion"
    chunk_object_name = "chat.completion.chunk"

    def start_chunks(self, index: int = 0) -> list[dict[str, Any]]:
        delta = {"role": "assistant", "content": ""}
        return [self._chunk(index, {"delta": delta, "logprobs": None, "finish_reason": None})]

    def prompt_chunks(self, index: int, prompt: Tally) -> list[dict[str, Any]]:
        if not self.prompt_logprobs or index != 0:
            return []
        out = self._envelope(self.chunk_object_name, [])
        out["prompt_logprobs"] = vllm_prompt_logprobs(prompt.prompt_logprobs)
        if self.include_usage:
            out["usage"] = None
        return [out]

    def content_chunk(
        self, text: str, lps: list[TokenLogprob] | None, index: int = 0
    ) -> dict[str, Any]:
        logprobs = chat_logprobs(lps or [], self.top_n) if self.logprobs else None
        return self._chunk(
            index, {"delta": {"content": text}, "logprobs": logprobs, "finish_reason": None}
        )

    def finish_chunk(
        self, reason: str, index: int = 0, stop_reason: int | str | None = None
    ) -> dict[str, Any]:
        choice = {
            "delta": {},
            "logprobs": None,
            "finish_reason": reason,
            "stop_reason": stop_reason,
        }
        return self._chunk(index, choice)

    def _tool_stream(self, index: int) -> ToolCallStream | None:
        if self.tool_parser is None:
            return None
        if index not in self.tool_streams:
            self.tool_streams[index] = self.tool_parser.stream()
        return self.tool_streams[index]

    def content_chunks(
        self, text: str, lps: list[TokenLogprob] | None, index: int = 0
    ) -> list[dict[str, Any]]:
        stream = self._tool_stream(index)
        if stream is None:
            return [self.content_chunk(text, lps, index)]
        return self._tool_chunks(stream.feed(text), lps, index)

    def finish_chunks(
        self, reason: str, index: int = 0, stop_reason: int | str | None = None
    ) -> list[dict[str, Any]]:
        stream = self._tool_stream(index)
        if stream is None:
            return [self.finish_chunk(reason, index, stop_reason)]
        out = self._tool_chunks(stream.finish(), None, index)
        last = self.finish_chunk(tool_finish(reason, bool(stream.calls)), index, stop_reason)
        held = self.held_logprobs.pop(index, [])
        if held:  # tokens no content or call chunk was sent for
            last["choices"][0]["logprobs"] = chat_logprobs(held, self.top_n)
        return [*out, last]

    def _tool_chunks(
        self, d: StreamDelta, lps: list[TokenLogprob] | None, index: int
    ) -> list[dict[str, Any]]:
        """The chunks of what a tool-call parser released: its content (if any), then
        its call deltas (if any). Text it holds back (a call's wrapper, arguments not yet
        complete) sends no chunk: no empty content delta; the logprobs of its tokens
        wait for the choice's next chunk (on a call delta's ``logprobs``)."""
        held = [*self.held_logprobs.pop(index, []), *(lps or [])] if self.logprobs else []
        out = []
        if d.content:
            out.append(self.content_chunk(d.content, held, index))
            held = []
        if d.tool_calls:
            logprobs = chat_logprobs(held, self.top_n) if held else None
            delta = {"tool_calls": d.tool_calls}
            out.append(
                self._chunk(index, {"delta": delta, "logprobs": logprobs, "finish_reason": None})
            )
            held = []
        if held:
            self.held_logprobs[index] = held
        return out

    def response(
        self, tally: Tally | list[Tally], order: list[int] | None = None
    ) -> dict[str, Any]:
        out = super().response(tally, order)
        if self.prompt_logprobs:
            first = tally[0] if isinstance(tally, list) else tally
            out["prompt_logprobs"] = vllm_prompt_logprobs(first.prompt_logprobs)
        return out

    def _choice(self, index: int, tally: Tally, prompt: Tally) -> dict[str, Any]:
        logprobs = chat_logprobs(tally.logprobs, self.top_n) if self.logprobs else None
        message: dict[str, Any] = {"role": "assistant", "content": tally.text}
        reason = tally.finish_reason
        if self.tool_parser is not None:
            parsed = self.tool_parser.parse(tally.text)
            message["content"] = parsed.content
            if parsed.calls:
                message["tool_calls"] = [c.to_openai() for c in parsed.calls]
            reason = tool_finish(reason, bool(parsed.calls))
        return {
            "index": index,
            "message": message,
            "logprobs": logprobs,
            "finish_reason": reason,
            "stop_reason": tally.stop_reason,
        }
