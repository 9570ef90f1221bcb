"""Parse and validate client request bodies into ``GenerateRequest``s.

Validation is strict about types: a wrong-typed value (``"temperature": "hot"``,
``"max_tokens": 1.5``, ``true`` where an integer is expected) or an out-of-range one is an
``ApiError`` (HTTP 400) whose message and ``param`` name the parameter. A ``null`` value
means "not given". Keys the gateway does not know (``user``, ``metadata``, ...) are
ignored; known OpenAI features it does not implement (``n > 1``, ``echo``, ``best_of``,
``logit_bias``, ``tools``, JSON ``response_format``) are refused.

Defaults: ``max_tokens`` is 16 for completions (as in the OpenAI API) and 512 for chat
completions and WebSocket chat requests (the OpenAI chat API defaults to "until the
context is full"; 512 bounds a forgotten limit), capped at the context window.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

import msgspec

from houchu.dashboard.errors import ApiError
from houchu.dashboard.params import (
    Body,
    get_bool,
    get_float,
    get_int,
    get_int_list,
    is_int,
    json_type,
    reject_unless,
    type_error,
)
from houchu.transport.messages import ChatMessage, GenerateRequest, SamplingParams

DEFAULT_COMPLETION_MAX_TOKENS = 16
DEFAULT_CHAT_MAX_TOKENS = 512
MAX_STOP_STRINGS = 4
MAX_STOP_CHARS = 1024  # per stop string: each is searched in every new piece of text
MAX_COMPLETION_LOGPROBS = 5
MAX_TOP_LOGPROBS = 20
MAX_TOKEN_ID = 2**31 - 1
#: Largest ``top_k`` (any value above the vocabulary size keeps every token).
MAX_TOP_K = 2**31 - 1
SEED_RANGE = (-(2**63), 2**64 - 1)
CHAT_ROLES = frozenset({"system", "user", "assistant"})
#: Newer OpenAI clients send "developer" where older ones send "system".
ROLE_ALIASES = {"developer": "system"}


@dataclass(frozen=True)
class ParsedRequest:
    """A validated request, ready to be given a request id.

    Exactly one of ``prompt``, ``prompt_ids``, ``messages`` is set. The number of
    alternatives per token the client asked for is ``sampling.top_logprobs``.
    """

    sampling: SamplingParams
    prompt: str | None = None
    prompt_ids: list[int] | None = None
    messages: list[ChatMessage] | None = None
    stream: bool = False
    include_usage: bool = False

    def to_generate(self, rid: str) -> GenerateRequest:
        """The wire request, stamped with ``rid`` and the arrival time."""
        return GenerateRequest(
            rid=rid,
            prompt=self.prompt,
            prompt_ids=self.prompt_ids,
            messages=self.messages,
            sampling=self.sampling,
            arrival_time=time.time(),
        )


def decode_body(raw: bytes) -> dict[str, Any]:
    """Decode a request body that must be a JSON object."""
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


def parse_completion(body: Body, *, model_name: str, max_context: int) -> ParsedRequest:
    """Validate a ``POST /v1/completions`` body."""
    _check_common(body, model_name)
    if get_bool(body, "echo", False):
        raise ApiError("'echo' is not supported", param="echo", code="unsupported_value")
    reject_unless(body, "best_of", lambda v: v == 1 and v is not True, "best_of must be 1")
    reject_unless(body, "suffix", lambda v: v == "", "suffix is not supported")
    prompt, prompt_ids = _prompt(body)
    top_n = get_int(body, "logprobs", None, 0, MAX_COMPLETION_LOGPROBS)
    max_tokens = _max_tokens(body, ("max_tokens",), DEFAULT_COMPLETION_MAX_TOKENS, max_context)
    stream, include_usage = _stream(body)
    return ParsedRequest(
        sampling=_sampling(body, max_tokens, logprobs=top_n is not None, top_n=top_n or 0),
        prompt=prompt,
        prompt_ids=prompt_ids,
        stream=stream,
        include_usage=include_usage,
    )


def parse_chat(body: Body, *, model_name: str, max_context: int) -> ParsedRequest:
    """Validate a ``POST /v1/chat/completions`` body."""
    _check_common(body, model_name)
    messages = _messages(body)
    logprobs = get_bool(body, "logprobs", False)
    top_n = get_int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS)
    if top_n and not logprobs:
        raise ApiError(
            "'top_logprobs' requires 'logprobs' to be true",
            param="top_logprobs",
            code="invalid_value",
        )
    names = ("max_completion_tokens", "max_tokens")
    max_tokens = _max_tokens(body, names, DEFAULT_CHAT_MAX_TOKENS, max_context)
    stream, include_usage = _stream(body)
    return ParsedRequest(
        sampling=_sampling(body, max_tokens, logprobs=logprobs, top_n=top_n),
        messages=messages,
        stream=stream,
        include_usage=include_usage,
    )


def parse_ws_generate(body: Body, *, model_name: str, max_context: int) -> ParsedRequest:
    """Validate a WebSocket generate frame (``id`` and ``type`` already removed).

    The frame has ``prompt`` or ``messages`` and the OpenAI sampling parameters;
    ``logprobs`` is a boolean, or an integer 0..20 meaning "true, with that many
    alternatives"; ``top_logprobs`` (0..20) also sets the number of alternatives.
    """
    _check_common(body, model_name)
    has_prompt, has_messages = body.get("prompt") is not None, body.get("messages") is not None
    if has_prompt and has_messages:
        raise ApiError("give either 'prompt' or 'messages', not both", param="messages")
    if not has_prompt and not has_messages:
        raise ApiError(
            "missing required parameter 'prompt' (or 'messages')",
            param="prompt",
            code="missing_required_parameter",
        )
    lp = body.get("logprobs")
    if isinstance(lp, bool) or lp is None:
        logprobs, top_n = bool(lp), 0
    else:
        top_n, logprobs = get_int(body, "logprobs", 0, 0, MAX_TOP_LOGPROBS), True
    top_n = max(top_n, get_int(body, "top_logprobs", 0, 0, MAX_TOP_LOGPROBS))
    if has_messages:
        messages, prompt, prompt_ids = _messages(body), None, None
        default = DEFAULT_CHAT_MAX_TOKENS
    else:
        messages, (prompt, prompt_ids) = None, _prompt(body)
        default = DEFAULT_COMPLETION_MAX_TOKENS
    max_tokens = _max_tokens(body, ("max_tokens",), default, max_context)
    return ParsedRequest(
        sampling=_sampling(body, max_tokens, logprobs=logprobs, top_n=top_n),
        prompt=prompt,
        prompt_ids=prompt_ids,
        messages=messages,
    )


# ------------------------------------------------------------------------- parts


def _check_common(body: Body, model_name: str) -> None:
    model = body.get("model")
    if model is not None:
        if not isinstance(model, str):
            raise type_error("model", "a string", model)
        if model != model_name:
            raise ApiError(
                f"The model '{model}' does not exist; this server serves '{model_name}'",
                param="model",
                code="model_not_found",
            )
    n = get_int(body, "n", 1, None, None)
    if n != 1:
        raise ApiError(
            f"'n' must be 1 (one choice per request), got {n}", param="n", code="unsupported_value"
        )
    reject_unless(body, "logit_bias", lambda v: v == {}, "logit_bias is not supported")
    reject_unless(body, "tools", lambda v: v == [], "tools are not supported")
    reject_unless(body, "functions", lambda v: v == [], "functions are not supported")
    reject_unless(body, "tool_choice", lambda v: v == "none", "tool_choice is not supported")
    reject_unless(
        body,
        "response_format",
        lambda v: v == {"type": "text"},
        "only response_format {'type': 'text'} is supported",
    )


def _sampling(body: Body, max_tokens: int, *, logprobs: bool, top_n: int) -> SamplingParams:
    top_k = get_int(body, "top_k", 0, -1, MAX_TOP_K)
    return SamplingParams(
        temperature=get_float(body, "temperature", 1.0, 0.0, 2.0),
        top_p=get_float(body, "top_p", 1.0, 0.0, 1.0, lo_open=True),
        top_k=max(top_k, 0),
        min_p=get_float(body, "min_p", 0.0, 0.0, 1.0),
        repetition_penalty=get_float(body, "repetition_penalty", 1.0, 0.0, 2.0, lo_open=True),
        frequency_penalty=get_float(body, "frequency_penalty", 0.0, -2.0, 2.0),
        presence_penalty=get_float(body, "presence_penalty", 0.0, -2.0, 2.0),
        seed=get_int(body, "seed", None, *SEED_RANGE),
        max_tokens=max_tokens,
        stop=_stop(body),
        stop_token_ids=get_int_list(body, "stop_token_ids", 0, MAX_TOKEN_ID),
        ignore_eos=get_bool(body, "ignore_eos", False),
        logprobs=logprobs,
        top_logprobs=top_n if logprobs else 0,
    )


def _max_tokens(body: Body, names: tuple[str, ...], default: int, max_context: int) -> int:
    for name in names:
        value = get_int(body, name, None, 1, None)
        if value is None:
            continue
        if value > max_context:
            raise ApiError(
                f"'{name}' is {value}, more than the model's context window of "
                f"{max_context} tokens",
                param=name,
                code="invalid_value",
            )
        return value
    return min(default, max_context)


def _stream(body: Body) -> tuple[bool, bool]:
    stream = get_bool(body, "stream", False)
    opts = body.get("stream_options")
    if opts is None:
        return stream, False
    if not isinstance(opts, dict):
        raise type_error("stream_options", "an object", opts)
    if not stream:
        raise ApiError(
            "'stream_options' is only allowed when 'stream' is true",
            param="stream_options",
            code="invalid_value",
        )
    inc = opts.get("include_usage")
    if inc is not None and not isinstance(inc, bool):
        raise type_error("stream_options.include_usage", "a boolean", inc)
    return stream, bool(inc)


def _prompt(body: Body) -> tuple[str | None, list[int] | None]:
    p = body.get("prompt")
    if p is None:
        raise ApiError(
            "missing required parameter 'prompt'", param="prompt", code="missing_required_parameter"
        )
    if isinstance(p, list) and len(p) == 1 and isinstance(p[0], str | list):
        p = p[0]  # a batch of one: ["text"] or [[ids]]
    if isinstance(p, str):
        if not p:
            raise ApiError("'prompt' must not be empty", param="prompt", code="invalid_value")
        return p, None
    if isinstance(p, list):
        if not p:
            raise ApiError("'prompt' must not be empty", param="prompt", code="invalid_value")
        if all(is_int(x) for x in p):
            if not all(0 <= x <= MAX_TOKEN_ID for x in p):
                raise ApiError(
                    "'prompt' token ids must be non-negative", param="prompt", code="invalid_value"
                )
            return None, list(p)
        if all(isinstance(x, str | list) for x in p):
            raise ApiError(
                "'prompt' holds several prompts; send one prompt per request",
                param="prompt",
                code="unsupported_value",
            )
    raise type_error("prompt", "a string, a list with one string, or a list of token ids", p)


def _messages(body: Body) -> list[ChatMessage]:
    msgs = body.get("messages")
    if msgs is None:
        raise ApiError(
            "missing required parameter 'messages'",
            param="messages",
            code="missing_required_parameter",
        )
    if not isinstance(msgs, list):
        raise type_error("messages", "an array", msgs)
    if not msgs:
        raise ApiError("'messages' must not be empty", param="messages", code="invalid_value")
    out = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict):
            raise type_error(f"messages[{i}]", "an object", m)
        role = m.get("role")
        if not isinstance(role, str):
            raise type_error(f"messages[{i}].role", "a string", role)
        role = ROLE_ALIASES.get(role, role)
        if role not in CHAT_ROLES:
            raise ApiError(
                f"'messages[{i}].role' must be one of system, user, assistant; got '{role}'",
                param=f"messages[{i}].role",
                code="invalid_value",
            )
        out.append(ChatMessage(role, _content(m.get("content"), f"messages[{i}].content")))
    return out


def _content(content: Any, param: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise type_error(param, "a string or an array of text parts", content)
    texts = []
    for j, part in enumerate(content):
        where = f"{param}[{j}]"
        if not isinstance(part, dict):
            raise type_error(where, "an object", part)
        if part.get("type") != "text":
            raise ApiError(
                f"'{where}.type' must be 'text' (only text content is supported)",
                param=f"{where}.type",
                code="unsupported_value",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise type_error(f"{where}.text", "a string", text)
        texts.append(text)
    return "\n".join(texts)


def _stop(body: Body) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
        raise type_error("stop", "a string or an array of strings", stop)
    if len(stops) > MAX_STOP_STRINGS:
        raise ApiError(
            f"'stop' has {len(stops)} strings; at most {MAX_STOP_STRINGS} are allowed",
            param="stop",
            code="invalid_value",
        )
    if not all(stops):
        raise ApiError("'stop' strings must not be empty", param="stop", code="invalid_value")
    longest = max((len(s) for s in stops), default=0)
    if longest > MAX_STOP_CHARS:
        raise ApiError(
            f"a 'stop' string has {longest} characters; at most {MAX_STOP_CHARS} are allowed",
            param="stop",
            code="invalid_value",
        )
    return list(stops)
