"""A msgspec ``ValidationError`` on a request body, as the ``ApiError`` a client gets.

msgspec says what failed and where (``... - at `$.messages[0].role```); the field's type
in ``api.schema`` says what was allowed. The answer is an HTTP 400 whose ``param`` and
message name the parameter:

- ``param`` is the path to the field (``messages[0].content[1].type``); an index into a
  list of plain values is left out (``stop``, not ``stop[0]``), and an error inside a
  refused feature names the feature (``response_format``, not ``response_format.type``).
- ``code``: ``invalid_type`` (a value of the wrong JSON type), ``invalid_value`` (out of
  bounds, or not an allowed value), ``missing_required_parameter``, or
  ``unsupported_value`` (a refused feature not at its neutral value).
"""

from __future__ import annotations

import re
import sys
from dataclasses import dataclass
from typing import Any

import msgspec
from msgspec import inspect as mi

from houchu.api.errors import ApiError
from houchu.api.schema.bodies import PATTERN_WORDS
from houchu.api.schema.refusals import UNSUPPORTED

#: How an error message names a type msgspec names.
_TYPE_NAMES = {
    "int": "an integer",
    "float": "a number",
    "str": "a string",
    "bool": "a boolean",
    "array": "an array",
    "object": "an object",
}
#: The JSON name of a value msgspec names.
_JSON_NAMES = {"int": "integer", "float": "number", "str": "string", "bool": "boolean"}
#: The msgspec type behind each name, for the bounds of a value out of bounds.
_KINDS: dict[str, tuple[type, ...]] = {
    "int": (mi.IntType,),
    "float": (mi.FloatType,),
    "str": (mi.StrType,),
    "array": (mi.ListType,),
    "object": (mi.DictType, mi.StructType),
}
_UNITS = {mi.StrType: "characters", mi.ListType: "items", mi.DictType: "keys"}
_STEP = re.compile(r"\.(\w+)|\[(\d+)\]")
_MISSING = object()

Alternatives = list[tuple[mi.Type, dict[str, Any]]]


def json_type(value: Any) -> str:
    """The JSON name of a decoded value's type (for error messages)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int):
        return "integer"
    if isinstance(value, float):
        return "number"
    if isinstance(value, str):
        return "string"
    return "array" if isinstance(value, list) else "object"


def type_error(name: str, expected: str, value: Any) -> ApiError:
    """A 400 ``invalid_type`` error: parameter ``name`` is not ``expected``."""
    return ApiError(
        f"'{name}' must be {expected}, got {json_type(value)}", param=name, code="invalid_type"
    )


@dataclass
class _Where:
    """Where an error is, in terms of the request type."""

    param: str  # the parameter the error names
    types: Alternatives  # what the value at the error's path may be, with its extras
    is_item: bool  # the error is at an item of a list of plain values
    feature: str | None = None  # the refused feature at or above the path
    why: str = ""  # why that feature is refused
    at_feature: bool = False  # the path ends at that feature


def validation_error(exc: msgspec.ValidationError, root: type, body: Any) -> ApiError:
    """The 400 for ``exc``, raised converting ``body`` to the request type ``root``."""
    text, _, at = str(exc).partition(" - at `")
    of_key = at.startswith("key` in `")  # a mapping's key (``logit_bias``'s token ids)
    keys = _keys(at.removeprefix("key` in `").rstrip("`").removeprefix("$"))
    missing = re.match(r"Object missing required field `(\w+)`", text)
    if missing:
        keys.append(missing[1])
    where = _locate(root, keys)
    param = where.param
    if missing:
        return ApiError(
            f"missing required parameter '{param}'",
            param=param,
            code="missing_required_parameter",
        )
    if of_key:
        return ApiError(f"'{param}' keys: {text}", param=param, code="invalid_value")
    subject = f"'{param}' items" if where.is_item else f"'{param}'"
    wrong = re.match(r"Expected `([^`]+)`, got `(\w+)`", text)
    names = [n for n in wrong[1].split(" | ") if n != "null"] if wrong else []
    if names and (where.feature is None or where.at_feature):  # none: a null-only field
        expected = " or ".join(_TYPE_NAMES.get(n, n) for n in names)
        got = _JSON_NAMES.get(wrong[2], wrong[2])
        return ApiError(
            f"{subject} must be {expected}, got {got}", param=param, code="invalid_type"
        )
    if where.feature is not None:
        feature = where.feature
        return ApiError(f"'{feature}' {where.why}", param=feature, code="unsupported_value")
    rule = _rule(text, where.types, _value_at(body, keys))
    return ApiError(f"{subject} {rule}", param=param, code="invalid_value")


def _keys(path: str) -> list[str | int]:
    """``.messages[0].role`` -> ``["messages", 0, "role"]`` (up to a step it cannot read)."""
    keys: list[str | int] = []
    pos = 0
    while (m := _STEP.match(path, pos)) is not None:
        keys.append(m[1] if m[1] is not None else int(m[2]))
        pos = m.end()
    return keys


def _flatten(t: mi.Type, extra: dict[str, Any] | None = None) -> Alternatives:
    """The types a value of ``t`` may have (a union's members, ``null`` left out), each
    with the ``Meta.extra`` of the annotations around it."""
    if isinstance(t, mi.UnionType):
        return [alt for member in t.types for alt in _flatten(member, extra)]
    if isinstance(t, mi.Metadata):
        return _flatten(t.type, {**(extra or {}), **(t.extra or {})})
    if isinstance(t, mi.NoneType):  # kept only to carry a refusal (a null-only field)
        return [(t, extra)] if extra and UNSUPPORTED in extra else []
    return [(t, extra or {})]


def _step(alts: Alternatives, key: str | int) -> Alternatives:
    """The types of the value at ``key`` (a field name or a list index) in ``alts``."""
    out: Alternatives = []
    for t, _ in alts:
        if isinstance(key, str) and isinstance(t, mi.StructType):
            out += [a for f in t.fields if f.encode_name == key for a in _flatten(f.type)]
        elif isinstance(key, str) and isinstance(t, mi.DictType):
            out += _flatten(t.value_type)
        elif isinstance(key, int) and isinstance(t, mi.ListType):
            out += _flatten(t.item_type)
    return out


def _locate(root: type, keys: list[str | int]) -> _Where:
    """Follow ``keys`` through the type ``root``: the parameter to name, and the types
    (and any refused feature) found on the way."""
    where = _Where(param="", types=_flatten(mi.type_info(root)), is_item=False)
    for key in keys:
        where.types = _step(where.types, key)
        if isinstance(key, str):
            where.param = f"{where.param}.{key}" if where.param else key
            where.is_item = False
        elif any(isinstance(t, mi.StructType) for t, _ in where.types):
            where.param += f"[{key}]"  # an item that is an object: named by its index
        else:
            where.is_item = True
        where.at_feature = False
        why = next((e[UNSUPPORTED] for _, e in where.types if UNSUPPORTED in e), None)
        if where.feature is None and why is not None:
            where.feature, where.why, where.at_feature = where.param, why, True
    return where


def _value_at(body: Any, keys: list[str | int]) -> Any:
    """The value at ``keys`` in ``body`` (``_MISSING`` when there is none)."""
    for key in keys:
        try:
            body = body[key]
        except (KeyError, IndexError, TypeError):
            return _MISSING
    return body


def _rule(text: str, types: Alternatives, value: Any) -> str:
    """What the value should have been, from msgspec's ``text`` and the field's types."""
    if text.startswith("Invalid enum value"):
        values = next((t.values for t, _ in types if isinstance(t, mi.LiteralType)), ())
        return f"must be {_one_of(values)}, got {_show(value)}"
    pattern = re.match(r"Expected `str` matching regex '(.*)'$", text)
    if pattern:
        words = next((e[PATTERN_WORDS] for _, e in types if PATTERN_WORDS in e), None)
        if words is not None:  # said in words: the regex means little to most clients
            return f"must be {words}, got {_show(value)}"
        return f"must match the pattern {pattern[1]}, got {_show(value)}"
    bound = re.match(r"Expected `(\w+)`( of length)? ", text)
    kinds = _KINDS.get(bound[1], ()) if bound else ()
    t = next((t for t, _ in types if isinstance(t, kinds)), None) if kinds else None
    if t is None:
        return f"is invalid ({text[:1].lower()}{text[1:]})"
    if bound[2]:
        return _length(t, value)
    return f"must be {_range(t)}, got {_show(value)}"


def _range(t: mi.IntType | mi.FloatType) -> str:
    """``between 0.0 and 2.0``, ``in (0.0, 1.0]``, ``at least 1``, ..."""
    lo, lo_open = (t.gt, True) if t.gt is not None else (t.ge, False)
    hi, hi_open = (t.lt, True) if t.lt is not None else (t.le, False)
    if hi == sys.float_info.max and lo is not None:  # the top says "finite"
        return f"a finite number {'greater than' if lo_open else 'at least'} {lo}"
    if lo is not None and hi is not None:
        if not (lo_open or hi_open):
            return f"between {lo} and {hi}"
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        return f"greater than {lo}" if lo_open else f"at least {lo}"
    return f"less than {hi}" if hi_open else f"at most {hi}"


def _length(t: mi.StrType | mi.ListType | mi.DictType, value: Any) -> str:
    """``must not be empty``, ``must have at most 4 items, got 5``, ..."""
    lo, hi, unit = t.min_length, t.max_length, _UNITS.get(type(t), "items")
    got = f", got {len(value)}" if hasattr(value, "__len__") else ""
    if hi == 0:
        return "must be empty"
    if hi is None:
        return "must not be empty" if lo == 1 else f"must have at least {lo} {unit}{got}"
    if lo:
        return f"must have {lo} to {hi} {unit}{got}"
    return f"must have at most {hi} {unit}{got}"


def _one_of(values: tuple[Any, ...]) -> str:
    """``'text'``, or ``one of 'system', 'user'``."""
    shown = ", ".join(_show(v) for v in values)
    return shown if len(values) == 1 else f"one of {shown}"


def _show(value: Any) -> str:
    """A short rendering of a JSON value for a message (strings in single quotes)."""
    if value is _MISSING:
        return "nothing"
    text = f"'{value}'" if isinstance(value, str) else msgspec.json.encode(value).decode()
    return text if len(text) <= 60 else f"{text[:57]}..."
