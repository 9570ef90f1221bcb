"""Structured output at the gateway: a request's output grammar from its fields.

The forms accepted (exactly one per request):

- OpenAI's ``response_format``: ``{"type": "json_object"}`` (any JSON object) or
  ``{"type": "json_schema", "json_schema": {"name", "schema", "strict"}}``; with
  ``strict: true`` a schema keyword the grammar engine cannot enforce is an error,
  otherwise it is ignored (llguidance's ``lenient`` JSON compile option);
- vLLM's ``structured_outputs`` (``json``, ``json_object``, ``regex``, ``choice``,
  ``grammar``) and its older ``guided_json``, ``guided_regex``, ``guided_choice``,
  ``guided_grammar``;
- SGLang's ``regex`` and ``ebnf``.

A grammar is Lark (llguidance's dialect) or EBNF as llama.cpp's GBNF writes it (told
apart by ``::=``). Each becomes one llguidance grammar (``llguidance.grammar_from``),
validated here with llguidance's own compiler, so a grammar that cannot compile is a 400
before the request reaches the engine. The runner compiles the same text into a token
matcher (``houchu.model.grammar.matcher``).
"""

from __future__ import annotations

import json
from functools import partial
from typing import Any

from llguidance import LLMatcher, grammar_from, regex_to_lark

from houchu.api.errors import ApiError
from houchu.api.requests.json_depth import depth_words, too_deep
from houchu.api.schema.bodies import (
    ResponseFormatJsonObject,
    ResponseFormatJsonSchema,
    SamplingFields,
    StructuredOutputs,
)
from houchu.api.structured import guard as grammar_guard
from houchu.api.structured.json_schema.integers import integer_words, out_of_range_integer
from houchu.api.structured.json_schema.numbers import wrong_number
from houchu.api.structured.json_schema.rewrites import closed_objects, no_value_nots
from houchu.api.structured.lark_rules import ebnf_to_lark, endless_rules
from houchu.api.structured.words import describe, endless
from houchu.transport.structured import GrammarKind, StructuredOutput

#: JSON is written as Python's ``json.dumps`` writes it (", " and ": ", no other
#: whitespace): a small model cannot wander into endless whitespace.
JSON_LAYOUT: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ", ",
    "key_separator": ": ",
}
#: vLLM's ``disable_any_whitespace``: no whitespace at all (``{"a":[1,2]}``).
COMPACT_LAYOUT: dict[str, Any] = {
    "whitespace_flexible": False,
    "item_separator": ",",
    "key_separator": ":",
}
#: Why a schema deeper than the grammar engine reads is refused.
SCHEMA_TOO_DEEP = (
    f"it {depth_words()}, the most the grammar engine (llguidance) reads in a schema "
    f"(a schema's own object is its first level)"
)
#: The schema of ``{"type": "json_object"}``: any JSON object.
ANY_OBJECT: dict[str, Any] = {"type": "object"}


def structured_output(req: SamplingFields) -> StructuredOutput | None:
    """The grammar ``req`` asks for, or None for free text.

    Raises:
        ApiError: (400) several forms at once, a schema that is neither a JSON object
            nor a boolean (or matches no value, ``false``, or holds an integer beyond 64
            bits), or a grammar, regex or schema llguidance cannot compile.
    """
    space = whitespace_pattern(req)
    so = req.structured_outputs
    compact = bool(so and so.disable_any_whitespace)
    closed = bool(so and so.disable_additional_properties)
    if compact and space is not None:
        raise ApiError(
            f"give 'structured_outputs.disable_any_whitespace' or '{space[0]}', not both",
            param=space[0],
            code="invalid_value",
        )
    layout = {"whitespace": space[1] if space else None, "compact": compact, "closed": closed}
    json_options = [
        name
        for name, given in (
            (space[0] if space else "", space is not None),
            ("structured_outputs.disable_any_whitespace", compact),
            ("structured_outputs.disable_additional_properties", closed),
        )
        if given
    ]
    forms = _forms(req, layout)
    if len(forms) > 1:
        names = ", ".join(f"'{param}'" for param, _, _ in forms)
        raise ApiError(
            f"give one structured output constraint, not several: {names}",
            param=forms[1][0],
            code="invalid_value",
        )
    if json_options and (not forms or forms[0][1] not in ("json_object", "json_schema")):
        given = f"not to '{forms[0][0]}'" if forms else "and none is given"
        raise ApiError(
            f"'{json_options[0]}' applies to a JSON structured output constraint "
            f"('response_format', 'guided_json', 'structured_outputs.json' or "
            f"'.json_object'), {given}",
            param=json_options[0],
            code="invalid_value",
        )
    if not forms:
        return None
    param, kind, build = forms[0]
    try:
        grammar = build()
    except (ValueError, TypeError) as exc:
        raise ApiError(
            f"'{param}' is not a valid {_what(kind)}: {exc}", param=param, code="invalid_grammar"
        ) from None
    grammar = checked(grammar, param, kind)
    if kind == "grammar":  # Lark text (GBNF converted): every rule must be able to finish
        rules = endless_rules(grammar)
        if rules:
            source = _grammar_source(req, param)
            raise ApiError(
                endless(param, rules, "::=" in source), param=param, code="invalid_grammar"
            )
    return StructuredOutput(kind=kind, grammar=grammar, param=param)


def checked(grammar: str, param: str, kind: GrammarKind) -> str:
    """``grammar`` when llguidance compiles it.

    Raises:
        ApiError: (400, code ``invalid_grammar``) with llguidance's message, in words
            (``houchu.api.structured.words.describe``: a JSON schema no value satisfies, a
            regex anchor the engine does not take).
    """
    try:
        is_error, messages = grammar_guard.validate(grammar)
    except (grammar_guard.EngineCrashed, TimeoutError) as e:
        why = str(e) or f"it took over {grammar_guard.VALIDATE_TIMEOUT_S:.0f} s to compile"
        raise ApiError(
            describe(param, _what(kind), why), param=param, code="invalid_grammar"
        ) from e
    if is_error:
        why = messages[0] if messages else "it does not compile"
        raise ApiError(describe(param, _what(kind), why), param=param, code="invalid_grammar")
    return grammar


def json_schema_grammar(
    schema: dict[str, Any] | bool | str,
    *,
    strict: bool = False,
    whitespace: str | None = None,
    compact: bool = False,
    closed: bool = False,
) -> str:
    """llguidance's grammar of a JSON schema (a dict, a boolean or its text). ``true``
    is JSON Schema's "any JSON value" (``{}``); ``false`` matches no value, written as
    ``{"allOf": [false]}`` so that ``checked`` refuses it in words (``describe``: it
    "matches no JSON value"). ``strict``: unknown or unsupported keywords are errors,
    else ignored. ``whitespace``: the regex of the whitespace allowed around JSON's
    punctuation (vLLM's ``guided_whitespace_pattern``, llguidance's
    ``whitespace_pattern``), else ``COMPACT_LAYOUT`` with ``compact`` (vLLM's
    ``disable_any_whitespace``), else ``JSON_LAYOUT``. ``closed``: vLLM's
    ``disable_additional_properties`` (``schema_rewrites.closed_objects``).

    The schema's depth is checked first (``houchu.api.requests.json_depth``), so the checks and
    rewrites after it, which recurse once or more per level, never overflow the stack.

    Raises:
        ValueError: the schema is neither a JSON object nor a boolean, nests more than
            ``MAX_JSON_DEPTH`` levels (the grammar engine's bound), holds an integer
            outside the 64 bits llguidance reads (``schema_integers``), or a number it
            would get wrong (``schema_numbers``: a ``const``/``enum`` value it writes as
            another number, a bound out of its range or rounded).
    """
    if isinstance(schema, str):
        try:
            schema = json.loads(schema)
        except RecursionError:  # deeper than Python's json reads: far too deep
            raise ValueError(SCHEMA_TOO_DEEP) from None
    if isinstance(schema, bool):
        schema = {} if schema else {"allOf": [False]}
    if not isinstance(schema, dict):
        raise ValueError("a JSON schema must be an object or a boolean")
    if too_deep(schema):
        raise ValueError(SCHEMA_TOO_DEEP)
    too_big = out_of_range_integer(schema)
    if too_big is not None:
        raise ValueError(integer_words(*too_big))
    inexact = wrong_number(schema)
    if inexact is not None:
        raise ValueError(inexact[1])
    layout = COMPACT_LAYOUT if compact else JSON_LAYOUT
    if whitespace is not None:
        layout = {"whitespace_pattern": whitespace, "item_separator": ",", "key_separator": ":"}
    if closed:
        schema = closed_objects(schema)
    return LLMatcher.grammar_from_json_schema(
        no_value_nots(schema), overrides={**layout, "lenient": not strict}
    )


def whitespace_pattern(req: SamplingFields) -> tuple[str, str] | None:
    """(the field, its regex) of vLLM's whitespace pattern for JSON output
    (``guided_whitespace_pattern``, or ``structured_outputs.whitespace_pattern``), or
    None when not given.

    Raises:
        ApiError: (400) both given, or a regex llguidance cannot compile.
    """
    so = req.structured_outputs
    given = [
        (param, value)
        for param, value in (
            ("guided_whitespace_pattern", req.guided_whitespace_pattern),
            ("structured_outputs.whitespace_pattern", so.whitespace_pattern if so else None),
        )
        if value is not None
    ]
    if len(given) > 1:
        raise ApiError(
            "give 'guided_whitespace_pattern' or 'structured_outputs.whitespace_pattern', not both",
            param=given[1][0],
            code="invalid_value",
        )
    if given:
        checked(grammar_from("regex", given[0][1]), given[0][0], "regex")
    return given[0] if given else None


def regex_grammar(pattern: str) -> str:
    """llguidance's grammar of a regex, with ``\\d`` read as ``[0-9]`` and ``\\D`` as
    ``[^0-9]``, as vLLM's grammar engines (xgrammar, outlines) and JSON Schema's
    ``pattern`` read them, rather than Rust's Unicode digits (``\\d`` would match "١" or
    "🯸"). llguidance's ``regex_to_lark`` rewrites them, escapes (``\\\\d``) and
    classes (``[\\d_]``) respected; ``\\w`` and ``\\s`` keep their Unicode meaning. A
    pattern that does not compile as given is returned as given, so its error is the
    user's pattern's (the rewrite would mend some, such as a final lone backslash)."""
    original = grammar_from("regex", pattern)
    ascii_digits = regex_to_lark(pattern, "d")
    if ascii_digits == pattern or _fails(original):
        return original
    return grammar_from("regex", ascii_digits)


def _fails(grammar: str) -> bool:
    """Whether ``grammar`` does not compile (or crashes the engine: ``checked`` says so)."""
    try:
        return grammar_guard.validate(grammar)[0]
    except (grammar_guard.EngineCrashed, TimeoutError):
        return True


#: The characters a regex (Rust's ``regex`` syntax, llguidance's) escapes with a backslash.
_REGEX_META = frozenset("\\.+*?()|[]{}^$#&-~")


def choice_grammar(choices: list[str]) -> str:
    """llguidance's grammar of "exactly one of ``choices``": one regex lexeme, the
    choices' alternation, so the lexer's DFA tells them apart. A Lark rule with one
    alternative per choice (``grammar_from("choice", ...)``) makes an Earley row of that
    many items, and llguidance stops such a grammar mid-generation above
    ``max_items_in_row`` (2000 by default); a lexeme has no such limit.

    An empty choice ("") is a legal alternative, as in vLLM (its choices become a
    grammar's alternatives): the output may then be empty (EOS first).

    Raises:
        ValueError: the list is empty.
    """
    if not choices:
        raise ValueError("give at least one choice")
    return grammar_from("regex", "|".join(_regex_literal(c) for c in choices))


def _regex_literal(text: str) -> str:
    """``text`` as a regex matching exactly it (control characters as ``\\x{..}``)."""
    out = []
    for ch in text:
        if ch in _REGEX_META:
            out.append("\\" + ch)
        elif ord(ch) < 0x20 or ord(ch) == 0x7F:
            out.append(f"\\x{{{ord(ch):02x}}}")
        else:
            out.append(ch)
    return "".join(out)


def _what(kind: GrammarKind) -> str:
    return {
        "json_object": "JSON object format",
        "json_schema": "JSON schema",
        "regex": "regular expression",
        "choice": "choice list",
        "grammar": "grammar",
        "tool_call": "tool definition",
    }[kind]


def _grammar_source(req: SamplingFields, param: str) -> str:
    """The text of the grammar ``param`` names (``structured_outputs.grammar`` or a
    top-level field)."""
    if param.startswith("structured_outputs."):
        assert req.structured_outputs is not None
        return getattr(req.structured_outputs, param.split(".", 1)[1]) or ""
    return getattr(req, param, None) or ""


def _grammar(text: str) -> str:
    """A Lark grammar, or GBNF/EBNF (``::=``) converted to Lark."""
    return ebnf_to_lark(text) if "::=" in text else grammar_from("lark", text)


def _forms(
    req: SamplingFields, layout: dict[str, Any] | None = None
) -> list[tuple[str, GrammarKind, Any]]:
    """(parameter, kind, grammar builder) of every constraint ``req`` gives; ``layout``:
    the JSON forms' ``json_schema_grammar`` options (``whitespace``, ``compact``,
    ``closed``)."""
    space = layout or {}
    out: list[tuple[str, GrammarKind, Any]] = []
    rf = req.response_format
    if isinstance(rf, ResponseFormatJsonObject):
        any_object = partial(json_schema_grammar, ANY_OBJECT, **space)
        out.append(("response_format", "json_object", any_object))
    elif isinstance(rf, ResponseFormatJsonSchema):
        spec = rf.json_schema
        schema = spec.schema if spec.schema is not None else ANY_OBJECT
        out.append(
            (
                "response_format",
                "json_schema",
                lambda: json_schema_grammar(schema, strict=bool(spec.strict), **space),
            )
        )
    so = req.structured_outputs
    if so is not None:
        out.extend(_vllm_forms(so, space))
    if req.guided_json is not None:
        guided = partial(json_schema_grammar, req.guided_json, **space)
        out.append(("guided_json", "json_schema", guided))
    for param, kind, value, build in (
        ("guided_regex", "regex", req.guided_regex, regex_grammar),
        ("guided_choice", "choice", req.guided_choice, choice_grammar),
        ("guided_grammar", "grammar", req.guided_grammar, _grammar),
        ("regex", "regex", req.regex, regex_grammar),
        ("ebnf", "grammar", req.ebnf, ebnf_to_lark),
    ):
        if value is not None:
            out.append((param, kind, lambda b=build, v=value: b(v)))
    return out


def _vllm_forms(so: StructuredOutputs, space: dict[str, Any]) -> list[tuple[str, GrammarKind, Any]]:
    """The constraints of vLLM's ``structured_outputs`` object (``space``: the JSON
    forms' ``json_schema_grammar`` options).

    Raises:
        ApiError: (400) it names no constraint, as vLLM refuses it (``{}``, only a
            whitespace pattern, or ``json_object: false``, which vLLM counts as given
            and then finds no constraint in).
    """
    out: list[tuple[str, GrammarKind, Any]] = []
    p = "structured_outputs"
    if so.json_object is False:
        raise ApiError(
            f"'{p}.json_object' must be true (false names no constraint); leave "
            f"'{p}' out for free text",
            param=f"{p}.json_object",
            code="invalid_value",
        )
    if so.json is not None:
        out.append((f"{p}.json", "json_schema", partial(json_schema_grammar, so.json, **space)))
    if so.json_object:
        any_object = partial(json_schema_grammar, ANY_OBJECT, **space)
        out.append((f"{p}.json_object", "json_object", any_object))
    if so.regex is not None:
        out.append((f"{p}.regex", "regex", lambda: regex_grammar(so.regex)))
    if so.choice is not None:
        out.append((f"{p}.choice", "choice", lambda: choice_grammar(so.choice)))
    if so.grammar is not None:
        out.append((f"{p}.grammar", "grammar", lambda: _grammar(so.grammar)))
    if not out:
        raise ApiError(
            f"'{p}' names no constraint: give one of 'json', 'json_object', 'regex', "
            f"'choice' or 'grammar' (leave '{p}' out for free text)",
            param=p,
            code="invalid_value",
        )
    return out
