"""vLLM's ``structured_outputs`` request object and the grammar texts it holds (part
of the request contract, ``houchu.api.schema.bodies``)."""

from __future__ import annotations

from typing import Annotated, Any

from msgspec import Meta, Struct

MAX_GRAMMAR_CHARS = 100_000  # the longest regex or grammar text (characters)

#: A JSON schema: an object, or a boolean (``true``: any JSON value; ``false``: a 400)
JsonSchema = dict[str, Any] | bool
GrammarText = Annotated[str, Meta(min_length=1, max_length=MAX_GRAMMAR_CHARS)]
WhitespacePattern = Annotated[
    str,
    Meta(
        min_length=1,
        max_length=MAX_GRAMMAR_CHARS,
        description="the regex of the whitespace around JSON's punctuation (vLLM)",
    ),
]
Choices = Annotated[list[str], Meta(min_length=1)]  # "" too (then empty output), as vLLM


class StructuredOutputs(Struct, kw_only=True, forbid_unknown_fields=True):
    """vLLM's ``structured_outputs``: exactly one of ``json`` (a JSON schema, or its
    text), ``json_object`` (true), ``regex``, ``choice`` or ``grammar`` (Lark, or
    EBNF/GBNF); ``whitespace_pattern``, ``disable_any_whitespace`` and
    ``disable_additional_properties`` with ``json`` or ``json_object``;
    ``disable_fallback`` is accepted (one grammar engine, nothing to fall back to)."""

    json: JsonSchema | str | None = None
    json_object: bool | None = None
    regex: GrammarText | None = None
    choice: Choices | None = None
    grammar: GrammarText | None = None
    whitespace_pattern: WhitespacePattern | None = None
    disable_any_whitespace: (
        Annotated[
            bool,
            Meta(description="true: JSON output with no whitespace at all, ',' and ':' (vLLM)"),
        ]
        | None
    ) = None
    disable_additional_properties: (
        Annotated[
            bool,
            Meta(
                description="true: an object schema (with properties) that does not say "
                "additionalProperties gets additionalProperties: false (vLLM)"
            ),
        ]
        | None
    ) = None
    disable_fallback: (
        Annotated[
            bool,
            Meta(
                description="accepted, no effect: houchu has one grammar engine "
                "(llguidance) and no fallback to another (vLLM)"
            ),
        ]
        | None
    ) = None
