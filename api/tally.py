"""A response's running tally over its deltas, and the OpenAI ``usage`` object."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from houchu.transport.messages import PromptTokenLogprob, TextDelta, TokenLogprob


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
    stop_reason: int | str | None = None  # vLLM's: the stop string or stop token id
    prompt_text: str | None = None  # echo
    prompt_logprobs: list[PromptTokenLogprob] | None = None

    def add(self, delta: TextDelta) -> None:
        """Fold one delta in."""
        if delta.prompt_text is not None:
            self.prompt_text = delta.prompt_text
        if delta.prompt_logprobs is not None:
            self.prompt_logprobs = delta.prompt_logprobs
        self.texts.append(delta.text)
        if delta.logprobs:
            self.logprobs.extend(delta.logprobs)
        self.prompt_tokens = max(self.prompt_tokens, delta.prompt_tokens)
        self.completion_tokens = max(self.completion_tokens, delta.completion_tokens)
        self.cached_tokens = max(self.cached_tokens, delta.cached_tokens)
        if delta.finish_reason is not None:
            self.finish_reason = delta.finish_reason
            self.stop_reason = delta.stop_reason

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


def usage_of(tallies: list[Tally]) -> dict[str, Any]:
    """The ``usage`` of several choices of one prompt: the prompt (and its cached
    tokens) counted once, as the first choice saw it; the completion tokens of every
    choice (OpenAI's and vLLM's ``n`` and ``best_of``)."""
    first = tallies[0]
    completion = sum(t.completion_tokens for t in tallies)
    prompt = max(t.prompt_tokens for t in tallies)
    return {
        "prompt_tokens": prompt,
        "completion_tokens": completion,
        "total_tokens": prompt + completion,
        "prompt_tokens_details": {"cached_tokens": first.cached_tokens},
    }
