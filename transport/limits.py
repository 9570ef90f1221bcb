"""The runner's limits, and the one check (with its one message) of each.

The runner owns the limits: its ``RunnerInfo`` carries them to the scheduler, the
tokenizer and the gateway, which read them through ``RunnerLimits``. Each limit has one
check here, which every actor asks with what it knows of the request:

- context (``max_context``): prompt + ``max_tokens`` tokens must fit. The gateway asks
  before the prompt is tokenized (prompt length 0, so ``max_tokens`` alone), the
  tokenizer before it encodes a long text (a lower bound of its length), the scheduler
  with the exact prompt length.
- vocabulary (``vocab_size``): prompt token ids must be in ``[0, vocab_size)``.
- KV pool (``num_pages * page_size``): one request must fit in the whole pool.

A check returns the ``Failure`` the client gets, or None when the request fits.

``tokens_left`` is the one definition of how many tokens a request may still take (the
scheduler's ``Request.tokens_left`` is it for a request's state; the proposers bound
their proposals with it).
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterable
from typing import Annotated

import msgspec
from msgspec import Meta, Struct

from houchu.transport.failures import CONTEXT_LENGTH_EXCEEDED, bad_request
from houchu.transport.messages import Failure, RunnerInfo


def tokens_left(
    max_context: int, num_tokens: int, max_tokens: int | None = None, generated: int = 0
) -> int:
    """Tokens a request may still take (tokens; 0 or less: none).

    A request holds ``num_tokens`` tokens (prompt plus the ``generated`` ones). It never
    passes the context window, ``max_context`` tokens in all, nor ``max_tokens`` generated
    tokens (None: the window alone bounds it). So ``num_tokens + tokens_left(...)`` is
    the longest it gets: ``min(prompt + max_tokens, max_context)``.

    Args:
        max_context: the context window (tokens, prompt + completion).
        num_tokens: tokens it holds now (prompt + generated).
        max_tokens: completion tokens it may generate in all, or None.
        generated: completion tokens it has generated (counted in ``num_tokens``).
    """
    left = max_context - num_tokens
    if max_tokens is not None:
        left = min(left, max_tokens - generated)
    return left


class RunnerLimits(Struct, frozen=True, kw_only=True):
    """What one request may ask of the runner.

    Attributes:
        max_context: tokens per request, prompt + completion (>= 1: checked by ``fixed``;
            a runner's own announcement always is).
        vocab_size: token ids are in ``[0, vocab_size)``; 0: not checked.
        kv_tokens: tokens the whole KV pool holds; 0: not checked.
    """

    max_context: Annotated[int, Meta(ge=1)]
    vocab_size: int = 0
    kv_tokens: int = 0

    @classmethod
    def fixed(cls, max_context: int) -> RunnerLimits:
        """Limits of a fixed context window alone (a gateway without a runner: tests).

        Raises:
            msgspec.ValidationError: (a ``ValueError``) ``max_context`` below 1.
        """
        return msgspec.convert({"max_context": max_context}, cls)

    @classmethod
    def of(cls, info: RunnerInfo) -> RunnerLimits:
        """The limits a runner announced."""
        return cls(
            max_context=info.max_context,
            vocab_size=info.vocab_size,
            kv_tokens=info.num_pages * info.page_size,
        )

    def context_failure(
        self,
        max_tokens: int,
        prompt_tokens: int = 0,
        *,
        at_least: bool = False,
        param: str | None = None,
    ) -> Failure | None:
        """Whether ``prompt_tokens`` + ``max_tokens`` exceed ``max_context`` (HTTP 400,
        code "context_length_exceeded"), else None.

        Args:
            max_tokens: completion tokens asked for.
            prompt_tokens: prompt tokens (0: not known yet).
            at_least: ``prompt_tokens`` is a lower bound (the text is not encoded yet).
            param: the request field that asked for ``max_tokens`` (the gateway knows
                it; the engine does not).
        """
        if prompt_tokens + max_tokens <= self.max_context:
            return None
        asks = f"'{param}' asks for" if param else "the request asks for"
        if prompt_tokens:
            bound = "at least " if at_least else ""
            what = f"the prompt has {bound}{prompt_tokens} tokens and {asks} {max_tokens} more"
        else:
            what = f"{asks} {max_tokens} tokens"
        return bad_request(
            f"this model's context window is {self.max_context} tokens; {what}",
            code=CONTEXT_LENGTH_EXCEEDED,
            param=param,
        )

    def token_id_failure(self, ids: Iterable[int]) -> Failure | None:
        """Whether a prompt token id is outside the vocabulary (HTTP 400), else None."""
        if self.vocab_size and any(t < 0 or t >= self.vocab_size for t in ids):
            return bad_request(f"prompt token ids must be in [0, {self.vocab_size})")
        return None

    def kv_failure(self, prompt_tokens: int, max_tokens: int) -> Failure | None:
        """Whether the request could never fit in the whole KV pool (HTTP 400), else None.

        It needs its prompt and ``max_tokens`` (at most ``max_context``) in pages."""
        need = prompt_tokens + tokens_left(self.max_context, prompt_tokens, max_tokens)
        if self.kv_tokens and need > self.kv_tokens:
            return bad_request(
                f"request needs {need} tokens of KV cache but the whole pool holds {self.kv_tokens}"
            )
        return None


class LimitsWatch:
    """The runner's limits as its latest ``RunnerInfo`` told them; awaitable until the
    first arrives (the runner loads its model after the other actors start).

    Args:
        limits: already known (tests, a fixed configuration), or None.
    """

    def __init__(self, limits: RunnerLimits | None = None) -> None:
        self._limits = limits
        self._known = asyncio.Event()
        if limits is not None:
            self._known.set()

    @property
    def current(self) -> RunnerLimits | None:
        """The latest limits, or None before the first ``RunnerInfo``."""
        return self._limits

    def update(self, info: RunnerInfo) -> None:
        """A runner announced itself (at start-up, or a replacement)."""
        self._limits = RunnerLimits.of(info)
        self._known.set()

    async def wait(self, timeout_s: float | None = None) -> RunnerLimits:
        """The latest limits, once known.

        Raises:
            asyncio.TimeoutError: none arrived within ``timeout_s`` seconds.
        """
        if self._limits is None:
            await asyncio.wait_for(self._known.wait(), timeout_s)
        assert self._limits is not None
        return self._limits
