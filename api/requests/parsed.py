"""A validated request (``ParsedRequest``) and the wire requests of its choices."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import msgspec

from houchu.api.requests.record_params import Value, shape_record, tools_record
from houchu.api.requests.tools import ToolSetup
from houchu.api.schema.bodies import SEED_RANGE
from houchu.transport.messages import ChatMessage, GenerateRequest, SamplingParams

#: Seeds are 64-bit: a choice's ``seed + i`` wraps around into ``SEED_RANGE``.
_SEED_WRAP = 2**64


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request, ready to be given a request id.

    Exactly one of ``prompt``, ``prompt_ids``, ``messages`` is set. The number of
    alternatives per token the client asked for is ``sampling.top_logprobs``. ``n``
    choices are returned, the best ``n`` of ``best_of`` generated (by mean token
    log-probability, OpenAI's "highest log probability per token").
    """

    sampling: SamplingParams
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    stream: bool = False
    include_usage: bool = False
    continuous_usage: bool = False  # vLLM's continuous_usage_stats: usage in every chunk
    tools: ToolSetup | None = None  # a chat request's tools and tool_choice
    n: int = 1
    best_of: int = 1
    prompt_logprobs: int | None = None  # vLLM's field, as the client gave it
    suffix: str | None = None  # a completion's text after the answer (fill-in-the-middle)
    #: a chat's template options (``houchu.api.requests.chat_template.template_options``)
    template: dict[str, Any] | None = None
    #: the template fields as the client sent them (``record_params.template_record``)
    template_sent: dict[str, Value] = field(default_factory=dict)

    def record(self) -> dict[str, Value]:
        """The request's parameters as the dashboard records them
        (``houchu.api.requests.record_params``): its sampling parameters as the client asked for
        them (every choice's, less a choice's own seed; ``prompt_logprobs`` only when
        the client sent it, not the prompt logprobs ``echo`` computes), the API, the
        number of chat turns, the chat-template fields sent, ``n`` and ``best_of``
        (above one), ``suffix`` (its length, characters) and the tools."""
        out = shape_record(self.messages, self.sampling)
        if self.prompt_logprobs is None:
            out.pop("prompt_logprobs", None)
        out.update(self.template_sent)
        if self.n > 1 or self.best_of > 1:
            out["n"] = self.n
        if self.best_of > self.n:
            out["best_of"] = self.best_of
        if self.suffix:
            out["suffix"] = len(self.suffix)
        if self.tools is not None:
            out.update(tools_record(self.tools))
        return out

    def to_generate(self, rid: str) -> GenerateRequest:
        """The wire request of a single choice, stamped with ``rid`` and the arrival
        time."""
        return GenerateRequest(
            rid=rid,
            prompt=self.prompt,
            prompt_ids=self.prompt_ids,
            messages=self.messages,
            sampling=self.sampling,
            arrival_time=time.time(),
            tools=None if self.tools is None else self.tools.template_tools,
            **(self.template or {}),
        )

    def to_generates(self, rid: str) -> list[GenerateRequest]:
        """One wire request per generated choice (``best_of`` of them): ``rid`` alone
        for one, else ``rid-0 .. rid-(k-1)`` in one prefill group ``rid``. Choice ``i``
        gets the seed ``seed + i`` (wrapped to 64 bits); only choice 0 asks for the
        prompt's logprobs and text (every choice shares them); with ``best_of > n`` every
        choice computes its tokens' logprobs (to rank them)."""
        k = self.best_of
        if k == 1:
            return [self.to_generate(rid)]
        s, now = self.sampling, time.time()
        rank = k > self.n and not s.logprobs
        out = []
        for i in range(k):
            seed = s.seed
            if seed is not None and seed + i > SEED_RANGE[1]:
                seed = seed + i - _SEED_WRAP
            elif seed is not None:
                seed = seed + i
            first = i == 0
            sampling = msgspec.structs.replace(
                s,
                seed=seed,
                logprobs=s.logprobs or rank,
                prompt_logprobs=s.prompt_logprobs if first else None,
                echo=s.echo and first,
            )
            out.append(
                GenerateRequest(
                    rid=f"{rid}-{i}",
                    prompt=self.prompt,
                    prompt_ids=self.prompt_ids,
                    messages=self.messages,
                    sampling=sampling,
                    arrival_time=now,
                    prefill_group=rid,
                    prefill_group_size=k,
                    tools=None if self.tools is None else self.tools.template_tools,
                    **(self.template or {}),
                )
            )
        return out
