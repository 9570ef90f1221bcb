"""vLLM's chat-template fields of a chat request, checked at the gateway.

- ``chat_template_kwargs``: extra variables the chat template is rendered with
  (transformers' ``apply_chat_template(**kwargs)``), such as Qwen3's
  ``enable_thinking``. A key that names one of ``apply_chat_template``'s own parameters
  or a variable the renderer sets (``messages``, ``tools``, ``chat_template``,
  ``tokenize``, ...) is refused: it would change how the request is rendered, not what
  the template reads.
- ``add_generation_prompt`` (default true): the prompt ends with the assistant's turn
  header, so the model writes a new reply.
- ``continue_final_message`` (default false): the last message is left open (no
  end-of-turn after it, no generation prompt) and the model continues it, as a
  prefilled assistant reply. With it ``add_generation_prompt`` defaults to false; both
  true is a 400, as in vLLM (vLLM also refuses it when ``add_generation_prompt`` is left
  at its default; a client written for vLLM sends ``false`` and gets the same answer).

The tokenizer actor renders the template with them (``houchu.text.tokenizer.core``); so
does ``POST /tokenize``.
"""

from __future__ import annotations

from typing import Any

from houchu.api.errors import ApiError
from houchu.api.requests.json_depth import MAX_JSON_DEPTH, depth_words, too_deep

#: ``apply_chat_template``'s own parameters and the variables its renderer sets.
RESERVED_KWARGS = frozenset(
    {
        "conversation",
        "messages",
        "tools",
        "documents",
        "chat_template",
        "add_generation_prompt",
        "continue_final_message",
        "tokenize",
        "sanitize_control_tokens",
        "padding",
        "truncation",
        "max_length",
        "return_tensors",
        "return_dict",
        "return_assistant_tokens_mask",
        "tokenizer_kwargs",
    }
)
#: The request fields that give two of them.
_OWN_FIELDS = ("add_generation_prompt", "continue_final_message")


def template_options(
    kwargs: dict[str, Any] | None,
    add_generation_prompt: bool | None,
    continue_final_message: bool | None,
) -> dict[str, Any]:
    """The ``GenerateRequest`` fields of a chat request's template options:
    ``{"chat_template_kwargs", "add_generation_prompt", "continue_final_message"}``.

    Raises:
        ApiError: (400) a reserved ``chat_template_kwargs`` key, ``chat_template_kwargs``
            nesting more than ``MAX_JSON_DEPTH`` levels, or ``continue_final_message``
            and ``add_generation_prompt`` both true.
    """
    for key in kwargs or {}:
        if key in RESERVED_KWARGS:
            hint = (
                f"give '{key}' as a request field"
                if key in _OWN_FIELDS
                else "it is a parameter of the template renderer, not a template variable"
            )
            raise ApiError(
                f"'chat_template_kwargs' key {key!r} is reserved: {hint}",
                param="chat_template_kwargs",
                code="invalid_value",
            )
    if too_deep(kwargs):  # before any walk: the checks below and the template recurse
        raise ApiError(
            f"'chat_template_kwargs' {depth_words()} (at most {MAX_JSON_DEPTH}, as a JSON "
            "schema may)",
            param="chat_template_kwargs",
            code="invalid_value",
        )
    _check_integers(kwargs, "chat_template_kwargs")
    cont = bool(continue_final_message)
    header = (not cont) if add_generation_prompt is None else add_generation_prompt
    if cont and header:
        raise ApiError(
            "'continue_final_message' and 'add_generation_prompt' cannot both be true: "
            "the final message is continued, so no new turn is started (set "
            "'add_generation_prompt' to false)",
            param="continue_final_message",
            code="invalid_value",
        )
    return {
        "chat_template_kwargs": dict(kwargs) if kwargs else None,
        "add_generation_prompt": header,
        "continue_final_message": cont,
    }


def _check_integers(value: Any, param: str) -> None:
    """Raise ``ApiError`` (400) for an integer anywhere in ``value`` (nested lists and
    objects) outside int64/uint64: the request travels between houchu's actors as
    msgpack, whose integers stop there."""
    if isinstance(value, dict):
        for v in value.values():
            _check_integers(v, param)
    elif isinstance(value, list):
        for v in value:
            _check_integers(v, param)
    elif isinstance(value, int) and not isinstance(value, bool):
        if not -(2**63) <= value <= 2**64 - 1:
            raise ApiError(
                f"'{param}' holds the integer {value}, outside the 64-bit range houchu "
                f"carries (-2**63 to 2**64 - 1)",
                param=param,
                code="invalid_value",
            )


def refuse_on_prompt(req: Any) -> None:
    """A prompt (not ``messages``) has no chat template: its template fields are a 400
    (as ``tools`` are), not ignored.

    Raises:
        ApiError: (400, ``unsupported_value``) naming the first one given.
    """
    for name in ("chat_template_kwargs", "add_generation_prompt", "continue_final_message"):
        if getattr(req, name, None) is not None:
            raise ApiError(
                f"'{name}' is accepted on chat requests only (with 'messages')",
                param=name,
                code="unsupported_value",
            )
