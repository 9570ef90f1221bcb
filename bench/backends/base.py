"""What every load-generator target implements, and the request parameters they share.

A backend turns a :class:`~houchu.bench.workloads.RequestSpec` (plus the conversation
so far) into one streamed generation and fills a
:class:`~houchu.bench.metrics.RequestResult` with its timestamps, token counts and
error, if any. A backend never raises for a failed request: failures are recorded in
the result (``timeout``, ``http_<status>``, ``server_error``, ``connection``,
``protocol``) so that the run goes on and counts them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol

from houchu.bench.metrics import RequestResult
from houchu.bench.workloads import Message, RequestSpec

BACKENDS = ("houchu-ws", "openai", "hf")


@dataclass(frozen=True)
class GenParams:
    """Request settings shared by every backend.

    Attributes:
        api: ``chat`` (messages, chat template applied by the server) or
            ``completions`` (a raw prompt). Multi-turn and ``messages`` replay use chat.
        temperature: sampling temperature (0 = greedy).
        ignore_eos: ask the server to generate exactly ``max_tokens`` tokens.
        timeout_s: seconds one request may take before it is aborted and counted as a
            ``timeout`` error.
        model: the ``model`` field sent to OpenAI-compatible servers (None: ask
            ``/v1/models``).
        extra: more JSON fields merged into every request body.
    """

    api: str = "completions"
    temperature: float = 0.0
    ignore_eos: bool = True
    timeout_s: float = 300.0
    model: str | None = None
    extra: dict[str, Any] = field(default_factory=dict)

    def use_chat(self, spec: RequestSpec, history: list[Message]) -> bool:
        """Whether this request goes as chat messages."""
        return self.api == "chat" or bool(history) or spec.messages is not None

    def sampling(self, max_tokens: int) -> dict[str, Any]:
        """The sampling fields of a request body."""
        body: dict[str, Any] = {"max_tokens": max_tokens, "temperature": self.temperature}
        if self.ignore_eos:
            body["ignore_eos"] = True
        return {**body, **self.extra}


class Backend(Protocol):
    """A target of the load generator."""

    name: str

    async def start(self) -> None:
        """Connect (or load); called once before the first request."""
        ...

    async def generate(
        self, spec: RequestSpec, history: list[Message], result: RequestResult
    ) -> None:
        """Send one request and fill ``result`` (``start`` is already set)."""
        ...

    async def close(self) -> None:
        """Release connections (or the model)."""
        ...

    def info(self) -> dict[str, Any]:
        """Settings of the target worth saving with the results."""
        ...


def apply_usage(result: RequestResult, usage: dict[str, Any] | None) -> None:
    """Take token counts from an OpenAI ``usage`` object, when there is one."""
    if not isinstance(usage, dict) or "completion_tokens" not in usage:
        return
    result.usage_reported = True
    result.output_tokens = int(usage.get("completion_tokens") or 0)
    if usage.get("prompt_tokens") is not None:
        result.input_tokens = int(usage["prompt_tokens"])
    details = usage.get("prompt_tokens_details")
    if isinstance(details, dict) and details.get("cached_tokens") is not None:
        result.cached_tokens = int(details["cached_tokens"])


def fail(result: RequestResult, kind: str, message: str, now: float) -> None:
    """Mark ``result`` as failed with error ``kind`` at time ``now`` (seconds)."""
    result.error = kind
    result.error_message = message
    result.end = now
