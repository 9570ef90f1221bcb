"""The checks and conversions every request parser shares: the body decoded into its
request type, the served model, token ids, choices, the prompt, ``max_tokens``,
streaming and the engine's ``SamplingParams`` (``houchu.api.requests.parse`` puts them
together per endpoint). Each raises ``ApiError`` (HTTP 400) naming the parameter."""

from __future__ import annotations

from typing import Any, TypeVar

import msgspec

from houchu.api.errors import ApiError
from houchu.api.requests.json_text import not_json_error
from houchu.api.requests.logit_bias import check_logit_bias
from houchu.api.requests.tools import ToolSetup
from houchu.api.schema.bodies import (
    SEED_RANGE,
    ChatCompletionRequest,
    HttpFields,
    SamplingFields,
    WsGenerateRequest,
)
from houchu.api.schema.errors import json_type, validation_error
from houchu.api.structured.request import structured_output
from houchu.text.token_conflicts import no_token_left
from houchu.transport.limits import RunnerLimits
from houchu.transport.messages import SamplingParams

Body = dict[str, Any]
R = TypeVar("R", bound=SamplingFields)

#: Request fields that become ``SamplingParams`` fields of the same name, as given.
SAMPLING_FIELDS = (
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
    "include_stop_str_in_output",
)

#: The fields a forced tool call ignores (``sampling_params``): stop strings and stop
#: token ids do not end it, so whether a stop's text is kept does not arise.
FORCED_CALL_DROPS = ("stop_token_ids", "include_stop_str_in_output")


def decode_body(raw: bytes) -> Body:
    """Decode a request body that must be a JSON object.

    Raises:
        ApiError: (400) it is empty, not JSON (a lone surrogate escape named as such,
            ``houchu.api.requests.json_text``), nested too deeply, or not an object.
    """
    if not raw.strip():
        raise ApiError("request body is empty; expected a JSON object", code="invalid_json")
    try:
        body = msgspec.json.decode(raw)
    except msgspec.DecodeError as exc:
        raise not_json_error(raw, exc, "request body")[0] from None
    except RecursionError:
        raise ApiError("request body is nested too deeply", code="invalid_json") from None
    if not isinstance(body, dict):
        raise ApiError(
            f"request body must be a JSON object, got {json_type(body)}", code="invalid_type"
        )
    return body


def decode_request(body: Body, kind: type[R], model_name: str, vocab_size: int = 0) -> R:
    """``body`` as a ``kind``: unknown keys and nulls dropped, a batch of one prompt
    unwrapped, the served model and token ids checked. Raises ``ApiError`` (400)."""
    known = set(kind.__struct_fields__)
    given = {k: v for k, v in body.items() if k in known and v is not None}
    if isinstance(given.get("prompt"), list):
        given["prompt"] = one_prompt(given["prompt"])
    check_logit_bias(given.get("logit_bias"), vocab_size)  # clearer than the schema's errors
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
    check_token_ids(req, vocab_size)
    return req


def check_model(model: str | None, model_name: str) -> None:
    """``model``, when given, must be the served ``model_name`` (an empty string means
    the served model, as vLLM reads it). Raises ``ApiError`` (404, code
    ``model_not_found``, type ``invalid_request_error``: OpenAI's and vLLM's answer to a
    model the server does not serve)."""
    if model and model != model_name:
        raise ApiError(
            f"The model `{model}` does not exist; this server serves `{model_name}`",
            status=404,
            param="model",
            code="model_not_found",
            type_="invalid_request_error",
        )


def check_token_ids(req: SamplingFields, vocab_size: int) -> None:
    """``allowed_token_ids`` and ``stop_token_ids`` name tokens of the vocabulary (0:
    unknown, not checked; ``logit_bias``'s keys: ``check_logit_bias``), and
    ``allowed_token_ids`` and ``logit_bias`` together leave some token to sample
    (``houchu.text.token_conflicts``; ``bad_words`` and ``min_tokens`` are checked with
    them by the tokenizer actor, which encodes the words). Raises ``ApiError`` (400)."""
    if not vocab_size:
        return
    for name in ("allowed_token_ids", "stop_token_ids"):
        ids = getattr(req, name)
        bad = [t for t in (ids or ()) if int(t) >= vocab_size]
        if bad:
            raise ApiError(
                f"'{name}' names token id {bad[0]}, outside this model's vocabulary "
                f"[0, {vocab_size})",
                param=name,
                code="invalid_value",
            )
    bias = {int(t): b for t, b in (req.logit_bias or {}).items()}
    failure = no_token_left(vocab_size, allowed=req.allowed_token_ids, logit_bias=bias)
    if failure is not None:
        raise ApiError.of(failure)


def choice_counts(n: int | None, best_of: int | None, stream: bool) -> tuple[int, int]:
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


def one_prompt(prompt: list[Any]) -> Any:
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


def prompt_of(prompt: str | list[int], vocab_size: int = 0) -> tuple[str | None, list[int] | None]:
    """(text, None) or (None, token ids); token ids must be in ``[0, vocab_size)`` (0:
    not checked). Raises ``ApiError`` (400) naming ``prompt``."""
    if isinstance(prompt, str):
        return prompt, None
    ids = list(prompt)
    bad = [t for t in ids if t < 0 or (vocab_size and t >= vocab_size)]
    if bad:
        raise ApiError(
            f"'prompt' holds token id {bad[0]}, outside this model's vocabulary "
            f"[0, {vocab_size or 'vocabulary size'})",
            param="prompt",
            code="invalid_value",
        )
    return None, ids


def sampling_params(
    req: SamplingFields,
    max_tokens: int,
    *,
    logprobs: bool,
    top_n: int,
    tools: ToolSetup | None = None,
) -> SamplingParams:
    """The engine's parameters: what the client gave, ``SamplingParams``'s defaults for
    the rest; the output grammar of a structured output constraint or of a forced tool
    call (not both: a 400).

    A forced tool call (``required`` or a named function) ends where its grammar ends
    (or at ``max_tokens``): its ``stop`` strings and ``stop_token_ids`` are dropped, so
    neither can cut the call short (a cut call would come back as a call whose
    arguments do not parse, or as the grammar's array markup). Beside any other
    grammar (``response_format``, ``guided_*``, ``structured_outputs``) they end the
    output early, as vLLM's do."""
    structured = structured_output(req)
    forced = tools.structured if tools is not None else None
    if forced is not None:
        if structured is not None:
            raise ApiError(
                "a required or named 'tool_choice' cannot be combined with another "
                "structured output constraint",
                param="tool_choice",
                code="invalid_value",
            )
        structured = forced
    if structured is not None:
        check_grammar_conflicts(req, structured.param)
    given = {f: getattr(req, f) for f in SAMPLING_FIELDS if getattr(req, f) is not None}
    if forced is not None:  # the grammar decides where a forced call ends
        for name in FORCED_CALL_DROPS:
            given.pop(name, None)
    if req.top_k is not None:
        given["top_k"] = max(req.top_k, 0)  # -1 (vLLM) and 0 (OpenAI) both mean off
    if req.top_p == 0.0:  # OpenAI's edge: the smallest set of mass >= 0 is the top token
        given["top_p"], given["top_k"] = 1.0, 1
    if req.stop is not None and forced is None:
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


def with_echo(
    sampling: SamplingParams, echo: bool, top_n: int | None, prompt_logprobs: int | None
) -> SamplingParams:
    """``sampling`` for a completion's ``echo`` (``POST /v1/completions`` and WebSocket
    prompt frames alike): the prompt's text comes back first and, with logprobs
    (``top_n`` alternatives; None: not asked for), its tokens' logprobs. The prompt's
    logprobs are computed as vLLM computes them: with vLLM's ``prompt_logprobs``
    alternatives when the client gave that field (``0``: the prompt token's own
    logprob, no alternative), else with ``top_n``. ``max_tokens`` 0 is served only
    with ``echo`` (the prompt alone, as evaluation harnesses score a text).

    Raises:
        ApiError: (400) ``max_tokens`` 0 without ``echo``.
    """
    if sampling.max_tokens == 0 and not echo:
        raise ApiError(
            "'max_tokens' must be at least 1 (0 is served with 'echo': the prompt alone)",
            param="max_tokens",
            code="invalid_value",
        )
    if not echo:
        return sampling
    lps = top_n if prompt_logprobs is None else prompt_logprobs
    return msgspec.structs.replace(sampling, echo=True, prompt_logprobs=lps)


def check_grammar_conflicts(req: SamplingFields, grammar_param: str) -> None:
    """Refuse the parameters an output grammar (given by ``grammar_param``) would
    override: ``min_tokens`` (the grammar's end, where it allows only EOS, would have to
    be passed), ``allowed_token_ids`` (the grammar's tokens, not these, would be
    sampled where the two do not meet) and ``bad_words`` that ban every choice of a
    choice list (``check_banned_choices``). vLLM applies them beside the grammar's mask
    and can leave a row with no token to sample; a 400 says so before any work.

    Raises:
        ApiError: (400, ``invalid_value``) naming both parameters.
    """
    for name, given in (
        ("min_tokens", (req.min_tokens or 0) > 0),
        ("allowed_token_ids", req.allowed_token_ids is not None),
    ):
        if given:
            raise ApiError(
                f"'{name}' cannot be combined with the structured output constraint "
                f"'{grammar_param}': the grammar alone decides which tokens may come and "
                "where the output ends",
                param=name,
                code="invalid_value",
            )
    check_banned_choices(req, grammar_param)


def check_banned_choices(req: SamplingFields, grammar_param: str) -> None:
    """Refuse a choice list whose every choice is a bad word: the grammar could only
    write a banned word (the bans are applied before the grammar's mask and, where they
    leave the grammar no token, the grammar wins, as with ``logit_bias``). A word is
    compared as ``bad_words`` encodes it: without its leading whitespace.

    Raises:
        ApiError: (400, ``invalid_value``, ``param`` "bad_words") naming the choices.
    """
    if grammar_param == "guided_choice":
        choices = req.guided_choice
    elif grammar_param == "structured_outputs.choice" and req.structured_outputs is not None:
        choices = req.structured_outputs.choice
    else:
        return
    words = {w.lstrip() for w in req.bad_words or ()}
    if choices and all(c.lstrip() in words for c in choices):
        listed = ", ".join(repr(c) for c in choices[:4]) + (", ..." if len(choices) > 4 else "")
        raise ApiError(
            f"'bad_words' bans every choice of '{grammar_param}' ({listed}): the grammar "
            "could only write a banned word",
            param="bad_words",
            code="invalid_value",
        )


def asked_max_tokens(req: ChatCompletionRequest | WsGenerateRequest) -> tuple[int | None, str]:
    """(the value, the field) that limits the output, as ``max_tokens_of`` takes them:
    ``max_completion_tokens`` when given (OpenAI's name; it wins over ``max_tokens``,
    as vLLM reads them), else ``max_tokens`` (None: neither given)."""
    if req.max_completion_tokens is not None:
        return req.max_completion_tokens, "max_completion_tokens"
    return req.max_tokens, "max_tokens"


def max_tokens_of(value: int | None, name: str, default: int, max_context: int) -> int:
    """``value`` (the field ``name``), which must fit the context window; ``default``
    capped at the window when not given."""
    if value is None:
        return min(default, max_context)
    failure = RunnerLimits(max_context=max_context).context_failure(value, param=name)
    if failure is not None:
        raise ApiError.of(failure)
    return value


def stream_flags(req: HttpFields) -> tuple[bool, bool, bool]:
    """(``stream``, ``stream_options.include_usage``, vLLM's
    ``stream_options.continuous_usage_stats``: usage in every chunk, which vLLM serves
    only beside ``include_usage``); the options need ``stream``."""
    stream = bool(req.stream)
    options = req.stream_options
    if options is None:
        return stream, False, False
    if not stream:
        raise ApiError(
            "'stream_options' is only allowed when 'stream' is true",
            param="stream_options",
            code="invalid_value",
        )
    usage = bool(options.include_usage)
    return stream, usage, usage and bool(options.continuous_usage_stats)
