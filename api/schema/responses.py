"""msgspec types of the HTTP API's answers, for the OpenAPI document (``openapi``).

The handlers build these answers as plain dicts (``openai_format``); these types describe
them so that ``msgspec.json.schema_components`` generates their JSON Schemas: the whole
answers, and the chunks a stream sends (``ChatCompletionChunk``, ``CompletionChunk``),
as OpenAI documents them. A field that is sometimes left out is ``UNSET`` by default
(not required, never null); a field that is sometimes null says so.
"""

from __future__ import annotations

from typing import Any, Literal

from msgspec import UNSET, Struct, UnsetType

#: Why a choice ended: its end (EOS, a stop string or token, the grammar's end), its
#: ``max_tokens`` or the context window, its tool calls (chat with ``tools``), the
#: client or the engine aborting it, or (only in a stream's last chunk of the choice,
#: before the ``{"error": ...}`` event) an error after the stream had begun.
FinishReason = Literal["stop", "length", "tool_calls", "abort", "error"]
#: vLLM's ``stop_reason``: with ``finish_reason`` "stop", the stop string that ended the
#: choice (from ``stop``) or the token id (from ``stop_token_ids``); null otherwise (an
#: end-of-sequence token, the grammar's end, or another finish reason).
StopReason = int | str | None


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
    finish_reason: FinishReason
    stop_reason: StopReason
    logprobs: CompletionLogprobs | None = None
    prompt_logprobs: PromptLogprobList | UnsetType = UNSET


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


class CalledFunction(Struct):
    """The function a tool call names and its arguments (JSON text; a call cut by
    ``max_tokens`` has them as far as they got)."""

    name: str
    arguments: str


class ToolCall(Struct):
    """One call of a reply (``finish_reason`` "tool_calls" when the reply ended by
    itself)."""

    id: str
    type: Literal["function"]
    function: CalledFunction


class AssistantMessage(Struct, omit_defaults=True):
    """The reply: ``content`` is null when the reply is only tool calls."""

    role: Literal["assistant"]
    content: str | None
    tool_calls: list[ToolCall] | UnsetType = UNSET


class ChatChoice(Struct):
    index: int
    message: AssistantMessage
    finish_reason: FinishReason
    stop_reason: StopReason
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
    prompt_logprobs: PromptLogprobList | UnsetType = UNSET


class FunctionDelta(Struct, omit_defaults=True):
    """A piece of a streamed call's function: its ``name`` (first), then pieces of its
    ``arguments``, to be joined."""

    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallDelta(Struct, omit_defaults=True):
    """A piece of the call ``index``: its ``id``, ``type`` and name first, then its
    arguments."""

    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionDelta | UnsetType = UNSET


class ChatDelta(Struct, omit_defaults=True):
    """What a chunk adds to a choice: the ``role`` (its first chunk), ``content`` text,
    or ``tool_calls`` pieces; ``{}`` in the chunk that ends it."""

    role: Literal["assistant"] | UnsetType = UNSET
    content: str | None | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChatChunkChoice(Struct):
    """A piece of choice ``index``; ``finish_reason`` and vLLM's ``stop_reason`` in the
    chunk that ends it."""

    index: int
    delta: ChatDelta
    logprobs: ChatLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: StopReason | UnsetType = UNSET


class ChatCompletionChunk(Struct, omit_defaults=True):
    """One server-sent event of ``POST /v1/chat/completions`` with ``stream: true``
    (``data: {chunk}``; the stream ends with ``data: [DONE]``). With
    ``stream_options.include_usage`` every chunk has ``usage`` (null, or with
    ``continuous_usage_stats`` the counts so far) and a last chunk with no choices has
    the whole request's; vLLM's ``prompt_logprobs`` come in a chunk of their own, with
    no choices, before the first content."""

    id: str
    object: Literal["chat.completion.chunk"]
    created: int
    model: str
    choices: list[ChatChunkChoice]
    usage: Usage | None | UnsetType = UNSET
    prompt_logprobs: PromptLogprobList | UnsetType = UNSET


class CompletionChunkChoice(Struct, omit_defaults=True):
    """A piece of choice ``index``: its new text (with ``echo``, the prompt first) and
    its tokens' logprobs; ``finish_reason`` and vLLM's ``stop_reason`` in the chunk
    that ends it."""

    index: int
    text: str
    logprobs: CompletionLogprobs | None
    finish_reason: FinishReason | None
    stop_reason: StopReason | UnsetType = UNSET
    prompt_logprobs: PromptLogprobList | UnsetType = UNSET


class CompletionChunk(Struct, omit_defaults=True):
    """One server-sent event of ``POST /v1/completions`` with ``stream: true``
    (``object`` is ``text_completion``, as OpenAI's chunks); ``usage`` as in
    ``ChatCompletionChunk``."""

    id: str
    object: Literal["text_completion"]
    created: int
    model: str
    choices: list[CompletionChunkChoice]
    usage: Usage | None | UnsetType = UNSET


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
