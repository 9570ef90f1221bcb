"""The wire contract: every message that travels between houchu's actors.

Each message is a tagged msgspec ``Struct`` (``tag=True`` uses the class name), so a
receiver decodes into a union of the messages it accepts and dispatches with ``match``.
Bulk data (KV pages, weights) never travels here; token ids travel as msgpack integer
arrays (1-3 bytes per id for this vocabulary size).

Flow (see docs/architecture.md)::

    gateway --GenerateRequest/AbortRequest--> tokenizer
    tokenizer --TokenizedRequest/AbortRequest/FinishRequest--> scheduler
    scheduler --StepPlan--> runner --StepResult--> scheduler --TokenBatch--> tokenizer
    runner --RunnerInfo--> scheduler, tokenizer, gateway    (the runner's limits)
    tokenizer --TextDelta/RequestFailed--> gateway
    gateway --StatsQuery--> scheduler --StatsReply--> gateway
    every actor --ActorReady/ActorFailed/Heartbeat--> launcher
    launcher --ActorDown/ActorUp/Shutdown--> every actor    (houchu.actors.supervisor)
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import Struct, field

from houchu.transport.actor_messages import (  # re-exported: the whole contract here
    ActorDown,
    ActorFailed,
    ActorReady,
    ActorStuck,
    ActorUp,
    Heartbeat,
    Shutdown,
)
from houchu.transport.request_fields import (  # re-exported
    CHAT_ROLES,
    ROLE_ALIASES,
    ChatMessage,
    ChatRole,
    Failure,
    SamplingParams,
    ToolCallMessage,
)
from houchu.transport.stats import EngineStats
from houchu.transport.step_messages import (  # re-exported
    PageCopy,
    Phase,
    PromptLogprobs,
    RunnerInfo,
    SeqInit,
    SeqOutput,
    SeqWork,
    StepPlan,
    StepResult,
)
from houchu.transport.tier_messages import HostSlotGrant, TierLookupResult, TierStats
from houchu.transport.token_path import StepStamps

#: the whole wire contract, importable from here (the modules above hold some of it)
__all__ = [
    "SamplingParams",
    "ToolCallMessage",
    "ChatMessage",
    "Failure",
    "ChatRole",
    "CHAT_ROLES",
    "ROLE_ALIASES",
    "SeqInit",
    "SeqWork",
    "Phase",
    "PageCopy",
    "StepPlan",
    "SeqOutput",
    "PromptLogprobs",
    "StepResult",
    "StepStamps",
    "RunnerInfo",
    "ActorReady",
    "ActorFailed",
    "Shutdown",
    "Heartbeat",
    "ActorStuck",
    "ActorDown",
    "ActorUp",
    "GenerateRequest",
    "AbortRequest",
    "TokenizedRequest",
    "FinishRequest",
    "TokenEvent",
    "TokenBatch",
    "TokenLogprob",
    "PromptTokenLogprob",
    "TextDelta",
    "RequestFailed",
    "StatsQuery",
    "StatsReply",
    "GatewayInbox",
    "TokenizerInbox",
    "SchedulerInbox",
    "RunnerInbox",
    "LauncherInbox",
    "encoder",
]


# ---------------------------------------------------------------- gateway -> tokenizer


class GenerateRequest(Struct, tag=True, kw_only=True):
    """A validated client request. Exactly one of ``prompt`` / ``messages`` is set.

    ``prompt_ids`` may be given instead of text (an OpenAI completions prompt of token ids).
    ``prefill_group``: the client request this one is a choice of (``n > 1``), "" when
    alone: the choices of one group share one prompt, which the scheduler prefills once
    (``houchu.scheduler.groups``). ``prefill_group_size``: how many choices the group has
    (the gateway sends each as its own request; the scheduler starts them together).
    The chat template of ``messages`` is rendered with ``tools``, the extra variables
    ``chat_template_kwargs``, ``add_generation_prompt`` (end with the assistant's turn
    header) and ``continue_final_message`` (leave the last message open: the model
    continues it), as transformers' ``apply_chat_template`` takes them (vLLM's fields).
    """

    rid: str
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    sampling: SamplingParams = SamplingParams()
    arrival_time: float = 0.0
    #: the tools a chat template is given (OpenAI ``tools`` entries), or None
    tools: list[dict[str, Any]] | None = None
    prefill_group: str = ""
    prefill_group_size: int = 1
    chat_template_kwargs: dict[str, Any] | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False


class AbortRequest(Struct, tag=True):
    """Drop a request: its client went away (the gateway), or nobody can receive its text
    any more (the tokenizer, when the gateway restarted)."""

    rid: str


# ---------------------------------------------------------------- tokenizer -> scheduler


class TokenizedRequest(Struct, tag=True, kw_only=True):
    """A request ready to schedule. ``prompt_ids``: list[int] of length prompt_len.

    ``stop_ids``: the ids that end it when sampled (its ``stop_token_ids``, plus the
    model's EOS ids unless ``ignore_eos``), computed once by the tokenizer
    (``houchu.text.stop.stop_ids``). ``prefill_group``, ``prefill_group_size``: as
    ``GenerateRequest``'s.
    """

    rid: str
    prompt_ids: list[int]
    sampling: SamplingParams
    stop_ids: list[int]
    arrival_time: float = 0.0
    prefill_group: str = ""
    prefill_group_size: int = 1


class FinishRequest(Struct, tag=True):
    """A stop string matched in the request's text: it is finished (``finish_reason``
    "stop"), and the scheduler frees it as it does a request that ended by itself."""

    rid: str


# ---------------------------------------------------------------- scheduler -> tokenizer


class TokenEvent(Struct, kw_only=True, array_like=True):
    """New tokens for one request, and the reason it finished if it did.

    ``finish_reason``: None while running, else "stop" (EOS / stop token), "length"
    (max_tokens or context), "abort" or "error". ``cached_tokens``: prompt tokens whose KV
    was reused (sent with the first event). ``failure``: why, when finish_reason is
    "error". ``prompt_logprobs``: the whole prompt's, with the first event (when asked).
    """

    rid: str
    token_ids: list[int]
    logprobs: list[float] | None = None
    top_logprobs: list[list[tuple[int, float]]] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    cached_tokens: int = 0
    failure: Failure | None = None
    prompt_logprobs: PromptLogprobs | None = None


class TokenBatch(Struct, tag=True):
    """All token events of one step, in one message. ``stamps``: when the step's tokens
    were where (``houchu.transport.token_path``); None for events of no step (a
    refused request, a restart)."""

    events: list[TokenEvent]
    stamps: StepStamps | None = None


# ---------------------------------------------------------------- tokenizer -> gateway


class TokenLogprob(Struct, array_like=True):
    """One generated token's text and log-probability, with its top alternatives."""

    token: str
    token_id: int
    logprob: float
    bytes_: list[int]
    top: list[tuple[str, int, float]] = field(default_factory=list)


class PromptTokenLogprob(Struct, array_like=True):
    """One prompt token's text and log-probability (None for the first token), its rank
    among all tokens (None for the first), and the top alternatives."""

    token: str
    token_id: int
    logprob: float | None
    rank: int | None
    bytes_: list[int]
    top: list[tuple[str, int, float]] = field(default_factory=list)


class TextDelta(Struct, tag=True, kw_only=True):
    """Text released for a request. The last one for a request has ``finish_reason`` set.

    ``text`` is never half a UTF-8 character and never part of a stop string.
    ``token_ids``: the ids generated since the previous delta (a token whose text is held
    back travels with the delta that releases it; the EOS / stop token that ends the
    request is not included).
    ``completion_tokens`` counts tokens emitted so far (EOS/stop tokens excluded).
    ``stop_reason`` (vLLM's, with ``finish_reason`` "stop"): the stop string that ended
    the output, or the id of the ``stop_token_ids`` token that did; None otherwise.
    The first delta carries ``prompt_text`` (``SamplingParams.echo``: the prompt as text)
    and ``prompt_logprobs`` (``SamplingParams.prompt_logprobs``: every prompt token).
    ``stamps``: the timings of the step that released this text, the tokenizer's
    included (``houchu.transport.token_path``); None when no step's batch carried any.
    """

    rid: str
    text: str
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[TokenLogprob] | None = None
    finish_reason: str | None = None
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    prompt_text: str | None = None
    prompt_logprobs: list[PromptTokenLogprob] | None = None
    stop_reason: int | str | None = None
    stamps: StepStamps | None = None


class RequestFailed(Struct, tag=True, kw_only=True):
    """A request rejected or failed, and why (the ``Failure`` its client gets)."""

    rid: str
    failure: Failure


# ---------------------------------------------------------------- stats


class StatsQuery(Struct, tag=True):
    """Ask the scheduler for its counters; the reply goes to the gateway. With ``rid``,
    the reply's ``request_known`` says whether the scheduler holds that request (1) or
    not (0)."""

    query_id: int
    rid: str | None = None


class StatsReply(Struct, tag=True, kw_only=True):
    """Scheduler counters (``/stats``: ``EngineStats.flat``)."""

    query_id: int
    stats: EngineStats


GatewayInbox = TextDelta | RequestFailed | StatsReply | RunnerInfo | Shutdown | ActorDown | ActorUp
TokenizerInbox = (
    GenerateRequest | AbortRequest | TokenBatch | RunnerInfo | Shutdown | ActorDown | ActorUp
)
SchedulerInbox = (
    TokenizedRequest
    | AbortRequest
    | FinishRequest
    | StepResult
    | RunnerInfo
    | StatsQuery
    | Shutdown
    | HostSlotGrant
    | TierLookupResult
    | TierStats
    | ActorDown
    | ActorUp
)
RunnerInbox = StepPlan | Shutdown | ActorDown | ActorUp
LauncherInbox = ActorReady | ActorFailed | Heartbeat | ActorStuck


def encoder() -> msgspec.msgpack.Encoder:
    """The one encoder every channel uses (msgpack, no pickle)."""
    return msgspec.msgpack.Encoder()
