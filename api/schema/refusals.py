"""Refused request fields: the ``Meta`` that marks a field the gateway refuses unless it
holds its neutral value (``unsupported``; ``houchu.api.schema.errors`` words the 400),
the reasons, and vLLM's sampling fields houchu does not serve (``VllmUnserved``:
refused, not ignored, so a client relying on them learns it at once)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct

#: Why vLLM's special-token text options are refused unless at their default.
NO_SPECIAL_TEXT = "is not served: the text never holds special tokens (only its default true)"
#: Why ``truncate_prompt_tokens`` is refused.
NO_TRUNCATION = (
    "is not served: houchu never cuts a prompt (one longer than the context window is a 400)"
)
#: Why ``tools`` are refused on a completion (a prompt, not ``messages``).
CHAT_ONLY = "are accepted on chat requests only"
CHAT_ONLY_ONE = "is accepted on chat requests only"
#: Why ``echo`` is refused on a WebSocket chat frame.
PROMPT_ONLY = "is served on prompt frames only (as on POST /v1/completions), not with 'messages'"
#: Why ``stream: false`` and ``stream_options`` are refused on a WebSocket frame.
WS_STREAMS = "is always true on WebSocket frames: every request streams its delta frames"
WS_STREAM_OPTIONS = (
    "is not served on WebSocket frames: every request streams, and its final frame "
    "always carries 'usage'"
)
#: ``Meta.extra`` key of a field the gateway refuses unless neutral; its value says why.
UNSUPPORTED = "unsupported"


def unsupported(why: str, **constraints: Any) -> Meta:
    """The ``Meta`` of a refused feature: ``why`` follows the field's name in the error
    (and is its description in the schema); ``constraints`` admit its neutral value."""
    return Meta(description=why, extra={UNSUPPORTED: why}, **constraints)


class VllmUnserved(Struct, kw_only=True, omit_defaults=True, forbid_unknown_fields=True):
    """vLLM's fields houchu does not serve, each accepted only at its default: the text
    options of special tokens (``skip_special_tokens``, ``spaces_between_special_tokens``:
    true), ``length_penalty`` (1: beam search only) and ``truncate_prompt_tokens`` (never:
    a prompt over the context window is a 400, not cut)."""

    skip_special_tokens: Annotated[Literal[True], unsupported(NO_SPECIAL_TEXT)] | None = None
    spaces_between_special_tokens: Annotated[Literal[True], unsupported(NO_SPECIAL_TEXT)] | None = (
        None
    )
    length_penalty: (
        Annotated[float, unsupported("is not served (beam search only)", ge=1.0, le=1.0)] | None
    ) = None
    truncate_prompt_tokens: Annotated[int, unsupported(NO_TRUNCATION, ge=0, le=-1)] | None = None
