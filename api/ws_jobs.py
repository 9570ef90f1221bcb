"""A WebSocket request in flight (``houchu.api.ws_api``): the tally of each choice and,
for a chat request with ``tools``, each choice's tool-call parser, which splits the
model's text into the reply's content (a delta frame's ``text``) and OpenAI tool-call
deltas, as the SSE stream does (``houchu.api.openai_format.ChatFormatter``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from houchu.api.openai_format import Tally, tool_finish
from houchu.text.tool_call_streams import ToolCallStream
from houchu.text.tool_calls import ToolCallParser

ClientId = str | int


@dataclass
class WsJob:
    """One request in flight on a WebSocket: its choices' tallies, and with tools the
    parser of each choice's reply (``houchu.text.tool_call_streams``)."""

    client_id: ClientId
    logprobs: bool
    top_n: int
    n: int = 1
    prompt_logprobs: bool = False
    tallies: list[Tally] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    parser: ToolCallParser | None = None  # parses tool calls (a chat with tools)
    tools: list[ToolCallStream] | None = None  # one per choice (with ``parser``)
    content: list[list[str]] = field(default_factory=list)  # per choice: text not a call
    #: the request's parameters for the dashboard (``ParsedRequest.record``)
    record: dict[str, float | int | str] | None = None

    def __post_init__(self) -> None:
        self.tallies = [Tally() for _ in range(self.n)]
        if self.parser is not None:
            self.tools = [self.parser.stream() for _ in range(self.n)]
            self.content = [[] for _ in range(self.n)]

    def delta_frame(
        self, i: int, text: str, calls: list[dict[str, Any]], token_ids: list[int]
    ) -> dict[str, Any]:
        """A ``delta`` frame of choice ``i``: ``text``, its ``token_ids``, and
        ``tool_calls`` when there are any."""
        out: dict[str, Any] = {
            "id": self.client_id,
            "type": "delta",
            "text": text,
            "token_ids": token_ids,
        }
        if self.n > 1:
            out["index"] = i
        if calls:
            out["tool_calls"] = calls
        return out

    def tool_delta(self, i: int, text: str | None) -> tuple[str, list[dict[str, Any]]]:
        """(content, tool-call deltas) that ``text``, the model's next text in choice
        ``i`` (None: the reply is complete), releases: the call markup is not content."""
        assert self.tools is not None
        stream = self.tools[i]
        d = stream.feed(text) if text is not None else stream.finish()
        self.content[i].append(d.content)
        return d.content, d.tool_calls

    def tool_reply(self, i: int, finish_reason: str) -> dict[str, Any]:
        """Choice ``i``'s ``finish_reason``, ``content`` and ``tool_calls`` (with tools)."""
        assert self.tools is not None
        calls = self.tools[i].calls
        content = "".join(self.content[i])
        return {
            "finish_reason": tool_finish(finish_reason, bool(calls)),
            # as the HTTP reply's ``message.content``: None beside calls when it is blank
            "content": content if content.strip() or not calls else None,
            "tool_calls": [c.to_openai() for c in calls],
        }
