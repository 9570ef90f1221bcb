"""msgspec types of the HTTP API's bodies, for the OpenAPI document (``openapi``).

The gateway validates request bodies by hand (``validation``: strict types, errors that
name the parameter); these types describe the same contract, with the same bounds (the
constants are imported from ``validation``), so that ``msgspec.json.schema_components``
generates the JSON Schemas instead of anyone writing them by hand. ``None`` (JSON
``null``) means "not given", as in the validator.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import Meta, Struct

from houchu.dashboard.validation import (
    MAX_COMPLETION_LOGPROBS,
    MAX_STOP_CHARS,
    MAX_STOP_STRINGS,
    MAX_TOKEN_ID,
    MAX_TOP_K,
    MAX_TOP_LOGPROBS,
    SEED_RANGE,
)

TokenId = Annotated[int, Meta(ge=0, le=MAX_TOKEN_ID)]
PositiveInt = Annotated[int, Meta(ge=1)]
Temperature = Annotated[float, Meta(ge=0.0, le=2.0)]
TopP = Annotated[float, Meta(gt=0.0, le=1.0)]
Unit = Annotated[float, Meta(ge=0.0, le=1.0)]
Penalty = Annotated[float, Meta(ge=-2.0, le=2.0)]
RepetitionPenalty = Annotated[float, Meta(gt=0.0, le=2.0)]
# msgspec's schemas hold int64 bounds only; the validator's range is wider (uint64 top)
Seed = Annotated[int, Meta(description=f"an integer in [{SEED_RANGE[0]}, {SEED_RANGE[1]}]")]
StopString = Annotated[str, Meta(min_length=1, max_length=MAX_STOP_CHARS)]
Stop = StopString | Annotated[list[StopString], Meta(max_length=MAX_STOP_STRINGS)]
TopLogprobs = Annotated[int, Meta(ge=0, le=MAX_TOP_LOGPROBS)]


class StreamOptions(Struct, omit_defaults=True):
    """``stream_options`` (only with ``stream: true``)."""

    include_usage: bool | None = None


class _Sampling(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """Parameters both generation routes accept. (The server ignores keys it does not
    know; the document lists only the ones it reads.)"""

    model: str | None = None
    temperature: Temperature | None = None
    top_p: TopP | None = None
    top_k: Annotated[int, Meta(ge=-1, le=MAX_TOP_K)] | None = None
    min_p: Unit | None = None
    repetition_penalty: RepetitionPenalty | None = None
    frequency_penalty: Penalty | None = None
    presence_penalty: Penalty | None = None
    seed: Seed | None = None
    stop: Stop | None = None
    stop_token_ids: list[TokenId] | None = None
    ignore_eos: bool | None = None
    n: Literal[1] | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    user: str | None = None


class CompletionRequest(_Sampling, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """``POST /v1/completions``: one prompt (text, or token ids), up to ``max_tokens``
    tokens (default 16, at most the context window)."""

    # also a batch of one, ``["text"]``: added to the schema by ``schema_components``
    # (msgspec types cannot hold a union of two array types)
    prompt: Annotated[str, Meta(min_length=1)] | Annotated[list[TokenId], Meta(min_length=1)]
    max_tokens: PositiveInt | None = None
    logprobs: Annotated[int, Meta(ge=0, le=MAX_COMPLETION_LOGPROBS)] | None = None
    echo: Literal[False] | None = None
    best_of: Literal[1] | None = None


class TextPart(Struct):
    """One part of a message's content (only text is supported)."""

    type: Literal["text"]
    text: str


class ChatMessageIn(Struct):
    """One chat turn (``developer`` is read as ``system``)."""

    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]


class ChatCompletionRequest(
    _Sampling, kw_only=True, omit_defaults=True, forbid_unknown_fields=True
):
    """``POST /v1/chat/completions``: the conversation so far; the answer is at most
    ``max_completion_tokens`` (or ``max_tokens``; default 512) tokens."""

    messages: Annotated[list[ChatMessageIn], Meta(min_length=1)]
    max_tokens: PositiveInt | None = None
    max_completion_tokens: PositiveInt | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None


# ----------------------------------------------------------------------- responses


class PromptTokensDetails(Struct):
    cached_tokens: int


class Usage(Struct):
    """Token counts of one request; ``cached_tokens`` came from the prefix cache."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


class CompletionChoice(Struct):
    index: int
    text: str
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class Completion(Struct):
    """The answer of ``POST /v1/completions`` without ``stream``."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage


class AssistantMessage(Struct):
    role: Literal["assistant"]
    content: str


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: str | None
    logprobs: dict[str, Any] | None = None


class ChatCompletion(Struct):
    """The answer of ``POST /v1/chat/completions`` without ``stream``."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage


class Model(Struct):
    id: str
    object: Literal["model"]
    created: int
    owned_by: str
    root: str
    parent: None
    max_model_len: int


class ModelList(Struct):
    """``GET /v1/models``: the one served model."""

    object: Literal["list"]
    data: list[Model]


class ErrorDetail(Struct):
    message: str
    type: str
    param: str | None
    code: str | None


class ErrorResponse(Struct):
    """Every error: the OpenAI error shape."""

    error: ErrorDetail


class Health(Struct):
    """``/health``: "ok" (200), else "starting" or "unavailable" (503) with a detail."""

    status: Literal["ok", "starting", "unavailable"]
    detail: str | None = None


Stats = dict[str, int | float | str]

#: Every type the document names, in ``components/schemas``.
SCHEMA_TYPES: tuple[object, ...] = (
    CompletionRequest,
    ChatCompletionRequest,
    Completion,
    ChatCompletion,
    ModelList,
    ErrorResponse,
    Health,
)


REQUEST_TYPES = ("CompletionRequest", "ChatCompletionRequest")


def schema_components(
    model_name: str | None = None, max_context: int | None = None
) -> tuple[dict[str, dict], dict[str, dict]]:
    """(``{type name: $ref schema}``, ``components/schemas``) for ``SCHEMA_TYPES``.

    What the types cannot say is added to the generated schemas: the batch-of-one
    prompt, the seed's range, and, when given, the served ``model_name`` (the only value
    ``model`` may take) and the context window ``max_context`` (the largest
    ``max_tokens``).
    """
    refs, components = msgspec.json.schema_components(
        SCHEMA_TYPES, ref_template="#/components/schemas/{name}"
    )
    names = [t.__name__ for t in SCHEMA_TYPES]  # type: ignore[attr-defined]
    one_text = {"type": "array", "items": {"type": "string", "minLength": 1}}
    one_text.update(minItems=1, maxItems=1)
    components["CompletionRequest"]["properties"]["prompt"]["anyOf"].append(one_text)
    for name in REQUEST_TYPES:
        props = components[name]["properties"]
        props["seed"]["anyOf"][0].update(minimum=SEED_RANGE[0], maximum=SEED_RANGE[1])
        if model_name is not None:
            props["model"]["anyOf"][0] = {"type": "string", "enum": [model_name]}
        if max_context is not None:
            for key in ("max_tokens", "max_completion_tokens"):
                if key in props:
                    props[key]["anyOf"][0]["maximum"] = max_context
    return dict(zip(names, refs, strict=True)), components
