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
(``response_format`` and its extensions) is checked by ``houchu.api.structured.request``, tools
by ``houchu.api.requests.tools``.

What the types cannot say is checked here: the served model's name, ``max_tokens``
within the runner's context window (``houchu.transport.limits``), the seed's top,
a batch of one prompt, token ids within the vocabulary, and the rules across fields
(the shared parts in ``houchu.api.requests.parts``).

Several choices (``n``, ``best_of``) become one ``GenerateRequest`` per choice
(``ParsedRequest.to_generates``), each with its own seed (the request's ``seed + i``,
as vLLM's parallel sampling does) and one prefill group, so the prompt is prefilled
once and the other choices start from its cached pages (``houchu.scheduler.groups``).

Defaults: ``max_tokens`` is 16 for completions (as in the OpenAI API) and 512 for chat
completions and WebSocket chat requests, capped at the context window.
"""

from __future__ import annotations

from houchu.api.errors import ApiError
from houchu.api.requests.chat_template import refuse_on_prompt, template_options
from houchu.api.requests.parsed import ParsedRequest
from houchu.api.requests.parts import (
    Body,
    asked_max_tokens,
    check_model,
    choice_counts,
    decode_body,
    decode_request,
    max_tokens_of,
    prompt_of,
    sampling_params,
    stream_flags,
    with_echo,
)
from houchu.api.requests.record_params import template_record
from houchu.api.requests.tools import refuse_tools_on_prompt, tool_setup
from houchu.api.schema.bodies import (
    DEFAULT_CHAT_MAX_TOKENS,
    DEFAULT_COMPLETION_MAX_TOKENS,
    ChatCompletionRequest,
    CompletionRequest,
    WsGenerateRequest,
)
from houchu.api.schema.chat_messages import chat_messages
from houchu.api.schema.refusals import PROMPT_ONLY

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


def parse_completion(
    body: Body, *, model_name: str, max_context: int, vocab_size: int = 0
) -> ParsedRequest:
    """Validate a ``POST /v1/completions`` body (``max_context``: the context window,
    tokens; ``vocab_size``: token ids are below it, 0: not checked). ``echo`` with
    ``logprobs`` asks for the prompt's logprobs with as many alternatives. Raises
    ``ApiError`` (400)."""
    req = decode_request(body, CompletionRequest, model_name, vocab_size)
    refuse_tools_on_prompt(req)  # even [] (the schema lets an empty list through)
    prompt, prompt_ids = prompt_of(req.prompt, vocab_size)
    top_n = req.logprobs
    max_tokens = max_tokens_of(
        req.max_tokens, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS, max_context
    )
    stream, include_usage, continuous_usage = stream_flags(req)
    n, best_of = choice_counts(req.n, req.best_of, stream)
    sampling = sampling_params(req, max_tokens, logprobs=top_n is not None, top_n=top_n or 0)
    if req.suffix and req.echo:
        raise ApiError("'echo' cannot be used with 'suffix'", param="echo", code="invalid_value")
    sampling = with_echo(sampling, bool(req.echo), top_n, req.prompt_logprobs)
    return ParsedRequest(
        sampling=sampling,
        prompt=prompt,
        prompt_ids=prompt_ids,
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
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
    req = decode_request(body, ChatCompletionRequest, model_name, vocab_size)
    if req.top_logprobs and not req.logprobs:
        raise ApiError(
            "'top_logprobs' requires 'logprobs' to be true",
            param="top_logprobs",
            code="invalid_value",
        )
    max_tokens = max_tokens_of(*asked_max_tokens(req), DEFAULT_CHAT_MAX_TOKENS, max_context)
    stream, include_usage, continuous_usage = stream_flags(req)
    logprobs = bool(req.logprobs)
    tools = tool_setup(req)
    n, _ = choice_counts(req.n, None, stream)
    fields = (req.chat_template_kwargs, req.add_generation_prompt, req.continue_final_message)
    template = template_options(*fields)
    return ParsedRequest(
        sampling=sampling_params(
            req, max_tokens, logprobs=logprobs, top_n=req.top_logprobs or 0, tools=tools
        ),
        messages=chat_messages(req.messages),
        template=template,
        template_sent=template_record(*fields),
        stream=stream,
        include_usage=include_usage,
        continuous_usage=continuous_usage,
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
    req = decode_request(body, WsGenerateRequest, model_name, vocab_size)
    if req.prompt is not None and req.messages is not None:
        raise ApiError(
            "give either 'prompt' or 'messages', not both", param="messages", code="invalid_value"
        )
    lp = req.logprobs
    logprobs, top_n = (bool(lp), 0) if lp is None or isinstance(lp, bool) else (True, lp)
    top_n = max(top_n, req.top_logprobs or 0)
    if req.messages is not None:
        messages, prompt, prompt_ids = chat_messages(req.messages), None, None
        default = DEFAULT_CHAT_MAX_TOKENS
    elif req.prompt is not None:
        messages, (prompt, prompt_ids) = None, prompt_of(req.prompt, vocab_size)
        default = DEFAULT_COMPLETION_MAX_TOKENS
    else:
        raise ApiError(
            "missing required parameter 'prompt' (or 'messages')",
            param="prompt",
            code="missing_required_parameter",
        )
    template = None
    fields = (req.chat_template_kwargs, req.add_generation_prompt, req.continue_final_message)
    if messages is None:
        refuse_tools_on_prompt(req)
        refuse_on_prompt(req)
    elif req.echo:
        raise ApiError(f"'echo' {PROMPT_ONLY}", param="echo", code="unsupported_value")
    else:
        template = template_options(*fields)
    max_tokens = max_tokens_of(*asked_max_tokens(req), default, max_context)
    tools = tool_setup(req)
    n, _ = choice_counts(req.n, None, True)
    sampling = sampling_params(req, max_tokens, logprobs=logprobs, top_n=top_n, tools=tools)
    return ParsedRequest(
        sampling=with_echo(
            sampling, bool(req.echo), top_n if logprobs else None, req.prompt_logprobs
        ),
        prompt=prompt,
        prompt_ids=prompt_ids,
        messages=messages,
        tools=tools,
        n=n,
        best_of=n,
        prompt_logprobs=req.prompt_logprobs,
        template=template,
        template_sent=template_record(*fields),
    )
