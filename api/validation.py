"""Parse and validate client request bodies into ``GenerateRequest``s.

A body is decoded into its request type of ``api.schema``, the one definition of every
field and its bounds (the OpenAPI document is generated from the same types). That is
strict about types: a wrong-typed value (``"temperature": "hot"``, ``"max_tokens": 1.5``,
``true`` where an integer is expected) or an out-of-range one is an ``ApiError`` (HTTP
400) whose message and ``param`` name the parameter (``schema_errors``). A ``null``
value means "not given". Keys the gateway does not know (``metadata``, ...) are
ignored; known OpenAI features it does not implement (``functions``) are refused.
``suffix`` is kept for the gateway, which serves it only for a model with
fill-in-the-middle tokens (``houchu.api.tokenize.with_suffix``). Structured output
(``response_format`` and its extensions) is checked by ``houchu.api.structured``, tools
by ``houchu.api.tools``.

What the types cannot say is checked here: the served model's name, ``max_tokens``
within the runner's context window (``houchu.transport.limits``), the seed's top,
a batch of one prompt, token ids within the vocabulary, and the rules across fields.

Several choices (``n``, ``best_of``) become one ``GenerateRequest`` per choice
(``ParsedRequest.to_generates``), each with its own seed (the request's ``seed + i``,
as vLLM's parallel sampling does) and one prefill group, so the prompt is prefilled
once and the other choices start from its cached pages (``houchu.scheduler.groups``).

Defaults: ``max_tokens`` is 16 for completions (as in the OpenAI API) and 512 for chat
completions and WebSocket chat requests, capped at the context window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, TypeVar

import msgspec

from houchu.api.errors import ApiError
from houchu.api.schema import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    SEED_RANGE,
    ChatCompletionRequest,
    ChatMessageIn,
    CompletionRequest,
    HttpFields,
    SamplingFields,
    WsGenerateRequest,
)
from houchu.api.schema_errors import json_type, validation_error
from houchu.api.structured import structured_output
from houchu.api.tools import ToolSetup, tool_setup
from houchu.transport.limits import RunnerLimits
from houchu.transport.messages import (
    ROLE_ALIASES,
    ChatMessage,
    GenerateRequest,
    SamplingParams,
    ToolCallMessage,
)

__all__ = [
    "DEFAULT_CHAT_MAX_TOKENS",
    "DEFAULT_COMPLETION_MAX_TOKENS",
    "ParsedRequest",
    "chat_messages",
    "check_model",
    "decode_body",
    "parse_chat",
    "parse_completion",
    "parse_ws_generate",
]

Body = dict[str, Any]
R = TypeVar("R", bound=SamplingFields)

#: Request fields that become ``SamplingParams`` fields of the same name, as given.
_SAMPLING_FIELDS = (
    "temperature",
    "top_p",
    "min_p",
    "repetition_penalty",
    "frequency_penalty",
    "presence_penalty",
    "seed",
    "stop_token_ids",
    "ignore_eos",
    "allowed_token_ids",
    "min_tokens",
    "prompt_logprobs",
)
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
    tools: ToolSetup | None = None  # a chat request's tools and tool_choice
    n: int = 1
    best_of: int = 1
    prompt_logprobs: int | None = None  # vLLM's field, as the client gave it
    suffix: str | None = None  # a completion's text after the answer (fill-in-the-middle)

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
                    tools=None if self.tools is None else self.tools.template_tools,
                )
            )
        return out


def decode_body(raw: bytes) -> Body:
    """Decode a request body that must be a JSON object.

    Raises:
        ApiError: (400) it is empty, not JSON, nested too deeply, or not an object.
    """
    if not raw.strip():
        raise ApiError("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise ApiError(f"request body is not valid JSON: {exc}", code="invalid_json") from None
    except RecursionError:
        raise ApiError("request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(
            f"request body must be a JSON object, got {json_type(body)}", code="invalid_type"
        )
    return body


def parse_completion(
    body: Body, *, model_name: str, max_context: int, vocab_size: int = 0
) -> ParsedRequest:
    """Validate a ``POST /v1/completions`` body (``max_context``: the context window,
    tokens; ``vocab_size``: token ids are below it, 0: not checked). ``echo`` with
    ``logprobs`` asks for the prompt's logprobs with as many alternatives. Raises
    ``ApiError`` (400)."""
    req = _decode(body, CompletionRequest, model_name, vocab_size)
    prompt, prompt_ids = _prompt(req.prompt)
    top_n = req.logprobs
    max_tokens = _max_tokens(
        req.max_tokens, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS, max_context
    )
    stream, include_usage = _stream(req)
    n, best_of = _choices(req.n, req.best_of, stream)
    sampling = _sampling(req, max_tokens, logprobs=top_n is not None, top_n=top_n or 0)
    if req.suffix and req.echo:
        raise ApiError("'echo' cannot be used with 'suffix'", param="echo", code="invalid_value")
    if req.echo:
        lps = req.prompt_logprobs if top_n is None else max(top_n, req.prompt_logprobs or 0)
        sampling = msgspec.structs.replace(sampling, echo=True, prompt_logprobs=lps)
    return ParsedRequest(
        sampling=sampling,
        prompt=prompt,
        prompt_ids=prompt_ids,
        stream=stream,
        include_usage=include_usage,
        n=n,
        best_of=best_of,
        prompt_logprobs=req.prompt_logprobs,
        suffix=req.suffix or None,
    )


def parse_chat(
    body: Body, *, model_name: str, max_context: int, vocab_size: int = 0
) -> ParsedRequest:
    """Validate a ``POST /v1/chat/completions`` body (``max_context``: the context
    window, tokens; ``vocab_size``: token ids are below it, 0: not checked). Raises
    ``ApiError`` (400)."""
    req = _decode(body, ChatCompletionRequest, model_name, vocab_size)
    if req.top_logprobs and not req.logprobs:
        raise ApiError(
            "'top_logprobs' requires 'logprobs' to be true",
            param="top_logprobs",
            code="invalid_value",
        )
    if req.max_completion_tokens is not None:
        name, value = "max_completion_tokens", req.max_completion_tokens
    else:
        name, value = "max_tokens", req.max_tokens
    max_tokens = _max_tokens(value, name, DEFAULT_CHAT_MAX_TOKENS, max_context)
    stream, include_usage = _stream(req)
    logprobs = bool(req.logprobs)
    tools = tool_setup(req)
    n, _ = _choices(req.n, None, stream)
    return ParsedRequest(
        sampling=_sampling(
            req, max_tokens, logprobs=logprobs, top_n=req.top_logprobs or 0, tools=tools
        ),
        messages=chat_messages(req.messages),
        stream=stream,
        include_usage=include_usage,
        tools=tools,
        n=n,
        best_of=n,
        prompt_logprobs=req.prompt_logprobs,
    )


def parse_ws_generate(
    body: Body, *, model_name: str, max_context: int, vocab_size: int = 0
) -> ParsedRequest:
    """Validate a WebSocket generate frame (``id`` and ``type`` already removed).

    The frame has ``prompt`` or ``messages`` and the OpenAI sampling parameters;
    ``logprobs`` is a boolean, or an integer 0..20 meaning "true, with that many
    alternatives"; ``top_logprobs`` (0..20) also sets the number of alternatives.
    Raises ``ApiError`` (400).
    """
    req = _decode(body, WsGenerateRequest, model_name, vocab_size)
    if req.prompt is not None and req.messages is not None:
        raise ApiError("give either 'prompt' or 'messages', not both", param="messages")
    lp = req.logprobs
    logprobs, top_n = (bool(lp), 0) if lp is None or isinstance(lp, bool) else (True, lp)
    top_n = max(top_n, req.top_logprobs or 0)
    if req.messages is not None:
        messages, prompt, prompt_ids = chat_messages(req.messages), None, None
        default = DEFAULT_CHAT_MAX_TOKENS
    elif req.prompt is not None:
        messages, (prompt, prompt_ids) = None, _prompt(req.prompt)
        default = DEFAULT_COMPLETION_MAX_TOKENS
    else:
        raise ApiError(
            "missing required parameter 'prompt' (or 'messages')",
            param="prompt",
            code="missing_required_parameter",
        )
    if messages is None and (req.tools or req.tool_choice is not None):
        raise ApiError("'tools' need 'messages' (a chat request)", param="tools")
    max_tokens = _max_tokens(req.max_tokens, "max_tokens", default, max_context)
    tools = tool_setup(req)
    n, _ = _choices(req.n, None, True)
    return ParsedRequest(
        sampling=_sampling(req, max_tokens, logprobs=logprobs, top_n=top_n, tools=tools),
        prompt=prompt,
        prompt_ids=prompt_ids,
        messages=messages,
        tools=tools,
        n=n,
        best_of=n,
        prompt_logprobs=req.prompt_logprobs,
    )


# ------------------------------------------------------------------------- parts


def _decode(body: Body, kind: type[R], model_name: str, vocab_size: int = 0) -> R:
    """``body`` as a ``kind``: unknown keys and nulls dropped, a batch of one prompt
    unwrapped, the served model and token ids checked. Raises ``ApiError`` (400)."""
    known = set(kind.__struct_fields__)
    given = {k: v for k, v in body.items() if k in known and v is not None}
    if isinstance(given.get("prompt"), list):
        given["prompt"] = _one_prompt(given["prompt"])
    try:
        req = msgspec.convert(given, kind, strict=True)
    except msgspec.ValidationError as exc:
        raise validation_error(exc, kind, given) from None
    check_model(req.model, model_name)
    if req.seed is not None and req.seed > SEED_RANGE[1]:
        raise ApiError(
            f"'seed' must be between {SEED_RANGE[0]} and {SEED_RANGE[1]}, got {req.seed}",
            param="seed",
            code="invalid_value",
        )
    _check_token_ids(req, vocab_size)
    return req


def check_model(model: str | None, model_name: str) -> None:
    """``model``, when given, must be the served ``model_name``. Raises ``ApiError``
    (400, code ``model_not_found``)."""
    if model is not None and model != model_name:
        raise ApiError(
            f"The model '{model}' does not exist; this server serves '{model_name}'",
            param="model",
            code="model_not_found",
        )


def _check_token_ids(req: SamplingFields, vocab_size: int) -> None:
    """``logit_bias`` and ``allowed_token_ids`` name tokens of the vocabulary (0:
    unknown, not checked). Raises ``ApiError`` (400)."""
    if not vocab_size:
        return
    for name in ("logit_bias", "allowed_token_ids"):
        ids = getattr(req, name)
        bad = [t for t in (ids or ()) if int(t) >= vocab_size]
        if bad:
            raise ApiError(
                f"'{name}' names token id {bad[0]}, outside this model's vocabulary "
                f"[0, {vocab_size})",
                param=name,
                code="invalid_value",
            )


def _choices(n: int | None, best_of: int | None, stream: bool) -> tuple[int, int]:
    """(choices returned, choices generated). ``best_of`` must be at least ``n`` and,
    when larger, cannot stream (the best are known only at the end). Raises
    ``ApiError`` (400)."""
    n = n or 1
    best_of = best_of or n
    if best_of < n:
        raise ApiError(
            f"'best_of' ({best_of}) must be at least 'n' ({n})",
            param="best_of",
            code="invalid_value",
        )
    if best_of > n and stream:
        raise ApiError(
            "'best_of' larger than 'n' cannot be streamed", param="best_of", code="invalid_value"
        )
    return n, best_of


def _one_prompt(prompt: list[Any]) -> Any:
    """A batch of one prompt (``["text"]`` or ``[[ids]]``) is that prompt; a batch of
    several is refused; anything else (token ids) is kept."""
    if not prompt or not all(isinstance(p, str | list) for p in prompt):
        return prompt
    if len(prompt) > 1:
        raise ApiError(
            "'prompt' holds several prompts; send one prompt per request",
            param="prompt",
            code="unsupported_value",
        )
    return prompt[0]


def _prompt(prompt: str | list[int]) -> tuple[str | None, list[int] | None]:
    """(text, None) or (None, token ids)."""
    return (prompt, None) if isinstance(prompt, str) else (None, list(prompt))


def _sampling(
    req: SamplingFields,
    max_tokens: int,
    *,
    logprobs: bool,
    top_n: int,
    tools: ToolSetup | None = None,
) -> SamplingParams:
    """The engine's parameters: what the client gave, ``SamplingParams``'s defaults for
    the rest; the output grammar of a structured output constraint or of a forced tool
    call (not both: a 400)."""
    structured = structured_output(req)
    if tools is not None and tools.structured is not None:
        if structured is not None:
            raise ApiError(
                "a required or named 'tool_choice' cannot be combined with another "
                "structured output constraint",
                param="tool_choice",
                code="invalid_value",
            )
        structured = tools.structured
    given = {f: getattr(req, f) for f in _SAMPLING_FIELDS if getattr(req, f) is not None}
    if req.top_k is not None:
        given["top_k"] = max(req.top_k, 0)  # -1 (vLLM) and 0 (OpenAI) both mean off
    if req.top_p == 0.0:  # OpenAI's edge: the smallest set of mass >= 0 is the top token
        given["top_p"], given["top_k"] = 1.0, 1
    if req.stop is not None:
        given["stop"] = [req.stop] if isinstance(req.stop, str) else list(req.stop)
    if req.logit_bias:
        given["logit_bias"] = {int(k): v for k, v in req.logit_bias.items()}
    if req.bad_words:
        given["bad_words"] = list(req.bad_words)
    if (req.min_tokens or 0) > max_tokens:
        raise ApiError(
            f"'min_tokens' ({req.min_tokens}) must be at most the maximum tokens ({max_tokens})",
            param="min_tokens",
            code="invalid_value",
        )
    asked = (getattr(req, f, None) for f in ("max_tokens", "max_completion_tokens"))
    return SamplingParams(
        **given,
        max_tokens=max_tokens,
        max_tokens_is_default=all(v is None for v in asked),
        logprobs=logprobs,
        top_logprobs=top_n if logprobs else 0,
        structured=structured,
    )


def _max_tokens(value: int | None, name: str, default: int, max_context: int) -> int:
    """``value`` (the field ``name``), which must fit the context window; ``default``
    capped at the window when not given."""
    if value is None:
        return min(default, max_context)
    failure = RunnerLimits(max_context=max_context).context_failure(value, param=name)
    if failure is not None:
        raise ApiError.of(failure)
    return value


def _stream(req: HttpFields) -> tuple[bool, bool]:
    """(``stream``, ``stream_options.include_usage``); the options need ``stream``."""
    stream = bool(req.stream)
    if req.stream_options is None:
        return stream, False
    if not stream:
        raise ApiError(
            "'stream_options' is only allowed when 'stream' is true",
            param="stream_options",
            code="invalid_value",
        )
    return stream, bool(req.stream_options.include_usage)


def chat_messages(messages: list[ChatMessageIn]) -> list[ChatMessage]:
    """The wire's chat turns: roles resolved (``developer`` is ``system``), content
    parts joined by newlines, tool calls and tool results kept.

    Raises:
        ApiError: (400) a turn without content that is not an assistant's tool call.
    """
    out = []
    for i, m in enumerate(messages):
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ApiError(
                f"missing required parameter 'messages[{i}].content' (only an assistant "
                "turn with 'tool_calls' may leave it out)",
                param=f"messages[{i}].content",
                code="missing_required_parameter",
            )
        if m.content is None:
            content = ""
        elif isinstance(m.content, str):
            content = m.content
        else:
            content = "\n".join(p.text for p in m.content)
        calls = None
        if m.tool_calls:
            calls = [
                ToolCallMessage(id=c.id, name=c.function.name, arguments=c.function.arguments)
                for c in m.tool_calls
            ]
        role = ROLE_ALIASES.get(m.role, m.role)
        out.append(ChatMessage(role, content, calls, m.tool_call_id, m.name))
    return out
