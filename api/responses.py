"""msgspec types of the HTTP API's answers, for the OpenAPI document (``openapi``).

The handlers build these answers as plain dicts (``openai_format``); these types describe
them so that ``msgspec.json.schema_components`` generates their JSON Schemas.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import Struct


class PromptTokensDetails(Struct):
    cached_tokens: int


class Usage(Struct):
    """Token counts of one request; ``cached_tokens`` came from the prefix cache."""

    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails


#: vLLM's ``prompt_logprobs``: per prompt token, null for the first, else
#: ``{token_id: {"logprob", "rank", "decoded_token"}}``.
PromptLogprobList = list[dict[str, dict[str, Any]] | None]


class CompletionLogprobs(Struct):
    """The completions API's ``logprobs`` (OpenAI's legacy format), one entry per token,
    the prompt's first with ``echo``: its text, its log-probability (null for the
    prompt's first token), its ``logprobs`` most likely alternatives and itself
    (token -> log-probability; null where the log-probability is) and its character
    offset in the choice's ``text``."""

    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class TopLogprob(Struct):
    """One alternative of a chat token: its text, log-probability and UTF-8 bytes."""

    token: str
    logprob: float
    bytes: list[int]


class ChatTokenLogprob(Struct):
    """One generated chat token: its text, log-probability, UTF-8 bytes and the
    ``top_logprobs`` most likely alternatives."""

    token: str
    logprob: float
    bytes: list[int]
    top_logprobs: list[TopLogprob]


class ChatLogprobs(Struct):
    """The chat API's ``logprobs``: one entry per generated token."""

    content: list[ChatTokenLogprob] | None


class CompletionChoice(Struct, omit_defaults=True):
    """One choice; with ``echo`` its ``text`` and ``logprobs`` start with the prompt's
    (the first prompt token's ``token_logprobs`` and ``top_logprobs`` are null)."""

    index: int
    text: str
    finish_reason: str | None
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: PromptLogprobList | None = None


class Completion(Struct):
    """The answer of ``POST /v1/completions`` without ``stream``: ``n`` choices (the
    best ``n`` of ``best_of``); ``usage`` counts the prompt once and every generated
    choice's tokens."""

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
    logprobs: ChatLogprobs | None = None


class ChatCompletion(Struct, omit_defaults=True):
    """The answer of ``POST /v1/chat/completions`` without ``stream``: ``n`` choices;
    ``usage`` counts the prompt once and every choice's tokens; ``prompt_logprobs`` when
    asked for (vLLM's field)."""

    id: str
    object: Literal["chat.completion"]
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_logprobs: PromptLogprobList | None = None


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


class TokenizeResponse(Struct):
    """``POST /tokenize``: the token ids, their count and the context window
    (``max_model_len``, tokens); ``token_strs`` when asked for."""

    tokens: list[int]
    count: int
    max_model_len: int
    token_strs: list[str] | None


class DetokenizeResponse(Struct):
    """``POST /detokenize``: the text of the tokens."""

    prompt: str
