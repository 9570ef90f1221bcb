"""A WebSocket request in flight (``houchu.api.ws.routes``): the tally of each choice, the
``delta`` frames its engine deltas make and, for a chat request with ``tools``, each
choice's tool-call parser, which splits the model's text into the reply's content (a
delta frame's ``text``) and OpenAI tool-call deltas, as the SSE stream does
(``houchu.api.openai.format.ChatFormatter``).

With ``echo`` (a prompt frame) each choice's first frame is the prompt's: a ``delta``
with ``"echo": true``, the prompt as ``text`` and, with logprobs, its tokens' logprobs
(the first token's ``logprob`` and ``top_logprobs`` null), as ``POST /v1/completions``
puts the prompt before each choice's text; every logprobs entry then has the legacy
``text_offset`` (characters of the tokens' texts, the prompt's then the choice's:
``houchu.api.openai.logprobs.text_offsets``)."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass, field
from typing import Any

from houchu.api.openai.format import Tally, tool_finish, vllm_prompt_logprobs, ws_logprobs
from houchu.api.openai.logprobs import text_offsets
from houchu.text.tool_calls.parse import ToolCallParser
from houchu.text.tool_calls.streams import ToolCallStream
from houchu.transport.messages import PromptTokenLogprob, TextDelta, TokenLogprob

ClientId = str | int


@dataclass
class WsJob:
    """One request in flight on a WebSocket: its choices' tallies, and with tools the
    parser of each choice's reply (``houchu.text.tool_calls.streams``). ``echo``: each
    choice's frames start with the prompt's (its deltas come after choice 0's first,
    which carries the prompt: ``houchu.api.openai.choices.prompt_first``)."""

    client_id: ClientId
    logprobs: bool
    top_n: int
    n: int = 1
    prompt_logprobs: bool = False
    echo: bool = False
    tallies: list[Tally] = field(default_factory=list)
    task: asyncio.Task[None] | None = None
    parser: ToolCallParser | None = None  # parses tool calls (a chat with tools)
    tools: list[ToolCallStream] | None = None  # one per choice (with ``parser``)
    content: list[list[str]] = field(default_factory=list)  # per choice: text not a call
    #: the request's parameters for the dashboard (``ParsedRequest.record``)
    record: dict[str, float | int | str] | None = None
    started: list[bool] = field(default_factory=list)  # per choice: a delta came
    offsets: list[int] = field(default_factory=list)  # per choice: next text_offset
    #: per choice: the token ids and logprobs of text a tool-call parser holds back
    held: list[tuple[list[int], list[TokenLogprob]]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.tallies = [Tally() for _ in range(self.n)]
        self.started = [False] * self.n
        self.offsets = [0] * self.n
        if self.parser is not None:
            self.tools = [self.parser.stream() for _ in range(self.n)]
            self.content = [[] for _ in range(self.n)]
            self.held = [([], []) for _ in range(self.n)]

    def frames(self, i: int, delta: TextDelta) -> list[dict[str, Any]]:
        """Fold choice ``i``'s ``delta`` into its tally; the frames to send for it: with
        ``echo``, the prompt's frame before the choice's first, then a ``delta`` frame
        when there is anything new. vLLM's ``prompt_logprobs`` go on the first frame."""
        self.tallies[i].add(delta)
        out: list[dict[str, Any]] = []
        if self.echo and not self.started[i]:
            out.append(self._echo_frame(i))
        self.started[i] = True
        prompt = delta.prompt_logprobs is not None and self.prompt_logprobs
        text, calls = delta.text, []
        ids, lps = delta.token_ids, delta.logprobs or []
        if self.tools is not None:  # the content only; the calls as their deltas
            text, calls = self.tool_delta(i, delta.text)
            ids, lps = [*self.held[i][0], *ids], [*self.held[i][1], *lps]
            # text held back (a call's wrapper) sends no empty frame: its tokens wait
            hold = not (text or calls or (prompt and not out))
            self.held[i] = (ids, lps) if hold else ([], [])
            if hold:
                ids, lps = [], []
        if text or calls or ids or lps or (prompt and not out):
            out.append(self.delta_frame(i, text, calls, ids))
            if self.logprobs:
                out[-1]["logprobs"] = self._logprobs(i, lps)
        if prompt and out:
            out[0]["prompt_logprobs"] = vllm_prompt_logprobs(delta.prompt_logprobs)
        return out

    def _echo_frame(self, i: int) -> dict[str, Any]:
        """Choice ``i``'s echo of the prompt (held by choice 0's tally): its text, and
        its tokens' logprobs when asked for (their ids are there; ``token_ids`` lists
        generated tokens only, so it is empty)."""
        prompt = self.tallies[0]
        frame = self.delta_frame(i, prompt.prompt_text or "", [], [])
        frame["echo"] = True
        if self.logprobs:
            frame["logprobs"] = self._logprobs(i, prompt.prompt_logprobs or [])
        return frame

    def _logprobs(
        self, i: int, lps: list[TokenLogprob] | list[PromptTokenLogprob]
    ) -> list[dict[str, Any]]:
        """The WebSocket logprobs entries of ``lps`` (choice ``i``'s next tokens), with
        their ``text_offset`` when ``echo``."""
        offsets = None
        if self.echo:
            offsets, self.offsets[i] = text_offsets(lps, self.offsets[i])
        return ws_logprobs(lps, self.top_n, offsets)

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

    def end_frames(self, i: int) -> list[dict[str, Any]]:
        """Choice ``i``'s last ``delta`` frame (with tools): what the parser held to the
        end, with the token ids (and logprobs) still held; none when nothing is left."""
        text, calls = self.tool_delta(i, None)
        ids, lps = self.held[i]
        self.held[i] = ([], [])
        if not (text or calls or ids or lps):
            return []
        frame = self.delta_frame(i, text, calls, ids)
        if self.logprobs:
            frame["logprobs"] = self._logprobs(i, lps)
        return [frame]

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
