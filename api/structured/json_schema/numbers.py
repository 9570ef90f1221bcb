"""The numbers of a JSON schema that the grammar engine (llguidance) would get wrong.

llguidance reads every number of a schema as a 64-bit double (an ``f64``), and writes a
number of ``const`` or ``enum`` in its own decimal form (no exponent: ``1e-07`` as
``0.0000001``). Found by experiment (llguidance 1.9):

- an integer in ``const``/``enum`` beyond 2^53 in magnitude comes out rounded
  (``9007199254740993`` is written ``9007199254740992``, ``2**63`` as
  ``9223372036854776000``), every integer within +-2^53 exactly;
- a decimal comes out exactly or not by no simple rule (``0.1``, ``3.14``, ``1e-07``
  and ``0.30000000000000004`` exactly; ``123456789.12345679`` as ``123456789.1234568``,
  ``1e-25`` as ``0.00000000000000000000000009999999999999999``), so each one is tried:
  the engine's own grammar of ``{"const": x}`` writes one text, which must be the
  decimal number of ``x``'s shortest form (``repr``; ``engine_text``: about 0.2 ms,
  cached);
- a bound (``minimum``, ``maximum``, ``exclusiveMinimum``, ``exclusiveMaximum``) is
  rounded to a double too (``"minimum": 500000000000000001`` lets ``500000000000000000``
  through), and the engine fails to compile one outside its range ("Failed to generate
  regex for integer range"): a lower bound must lie in (-2^63, 10^18), an upper bound in
  (-10^18, 2^63), as doubles (an integer upper bound of 2^63 or more compiles, but the
  engine then stops at 2^63 - 1);
- ``multipleOf`` must be greater than 0 (JSON Schema); the engine refuses 0 but takes a
  negative one.

``wrong_number`` finds the first such number and where it is (a JSON Pointer), so the
400 can name it before the engine sees the schema. It recurses per level: it is given
only a schema whose depth ``houchu.api.structured.request.json_schema_grammar`` checked first (at
most ``houchu.api.requests.json_depth.MAX_JSON_DEPTH`` levels).
"""

from __future__ import annotations

import math
from decimal import Decimal
from functools import lru_cache
from typing import Any

from llguidance import LLMatcher, LLTokenizer

from houchu.api.structured.json_schema.integers import pointer_token
from houchu.api.structured.json_schema.rewrites import NAMED_SUBSCHEMAS

#: Integers within +-2^53 are exact doubles, and the engine writes them exactly.
EXACT_INTEGER = 2**53
#: The open range of a lower bound (minimum, exclusiveMinimum), as a double.
LOWER_BOUND_RANGE = (-(2.0**63), 1e18)
#: The open range of an upper bound (maximum, exclusiveMaximum), as a double.
UPPER_BOUND_RANGE = (-1e18, 2.0**63)
_LOWER = frozenset({"minimum", "exclusiveMinimum"})
_UPPER = frozenset({"maximum", "exclusiveMaximum"})
#: Keywords whose value is no schema and holds no value the output must match.
_ANNOTATIONS = frozenset({"title", "description", "$comment", "default", "examples"})
_BYTES = LLTokenizer("byte")


def wrong_number(schema: Any, at: str = "#") -> tuple[str, str] | None:
    """(the JSON Pointer of the first number of ``schema`` the engine would get wrong,
    why in words), or None. ``schema``: a decoded JSON schema (dicts, lists, strings,
    numbers, booleans, None; every integer within 64 bits, ``schema_integers``); ``at``:
    its pointer. Numbers are checked in ``const`` and ``enum`` values (nested ones too)
    and in the bounds of a schema that may be a number (no ``type``, or one naming
    ``integer`` or ``number``); annotations (``default``, ``examples``) are not."""
    if isinstance(schema, list):
        for i, item in enumerate(schema):
            found = wrong_number(item, f"{at}/{i}")
            if found is not None:
                return found
        return None
    if not isinstance(schema, dict):
        return None
    numeric = _may_be_number(schema.get("type"))
    for key, value in schema.items():
        here = f"{at}/{pointer_token(str(key))}"
        found: tuple[str, str] | None = None
        if key == "const":
            found = _wrong_value(value, here)
        elif key == "enum" and isinstance(value, list):
            found = next(
                (f for i, v in enumerate(value) if (f := _wrong_value(v, f"{here}/{i}"))), None
            )
        elif key in _LOWER | _UPPER and numeric and _is_number(value):
            found = _wrong_bound(key, value, here)
        elif key == "multipleOf" and numeric and _is_number(value) and value <= 0:
            # JSON Schema: strictly positive; the engine took a negative one as given
            found = here, f"'multipleOf' {value} at {here} must be greater than 0"
        elif key in NAMED_SUBSCHEMAS and isinstance(value, dict):
            found = next(
                (
                    f
                    for name, sub in value.items()
                    if (f := wrong_number(sub, f"{here}/{pointer_token(str(name))}"))
                ),
                None,
            )
        elif key not in _ANNOTATIONS:
            found = wrong_number(value, here)
        if found is not None:
            return found
    return None


@lru_cache(maxsize=4096, typed=True)
def engine_text(number: int | float) -> str:
    """The text the engine writes for ``{"const": number}`` (``number``: an integer
    within 64 bits, or a finite double; e.g. ``1e-07`` -> ``"0.0000001"``). An integer
    and the equal double are written differently (``3989335255603082`` exactly,
    ``3989335255603082.0`` as ``3989335255603081.5``): the cache keys on both."""
    grammar = LLMatcher.grammar_from_json_schema({"const": number})
    matcher = LLMatcher(_BYTES, grammar, log_level=0)
    return bytes(matcher.compute_ff_tokens()).decode()


def _wrong_value(value: Any, at: str) -> tuple[str, str] | None:
    """The first number in a ``const``/``enum`` value (at ``at``) that the engine would
    write as another number, with why."""
    if isinstance(value, dict | list):
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            found = _wrong_value(item, f"{at}/{pointer_token(str(key))}")
            if found is not None:
                return found
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if abs(value) <= EXACT_INTEGER:
            return None
        # not asked of the engine: llguidance 1.9 crashes the process (SIGSEGV) on a
        # const integer that rounds to -2^63
        return at, (
            f"the integer {value} at {at} is beyond 2^53: the grammar engine (llguidance) "
            f"reads numbers as 64-bit doubles, which do not hold every integer beyond "
            f"2^53, so an integer in 'const' or 'enum' must lie within -{EXACT_INTEGER} .. "
            f"{EXACT_INTEGER}"
        )
    if isinstance(value, float):
        if not math.isfinite(value):  # (JSON has none; a schema's text may, for json.loads)
            return at, f"the number {value!r} at {at} is not finite: JSON has no such number"
        written = engine_text(value)
        if Decimal(written) == Decimal(repr(value)):  # the same decimal number
            return None
        return at, (
            f"the number {value!r} at {at} would be written as {written}, another number: "
            "the grammar engine (llguidance) reads numbers as 64-bit doubles and writes "
            "some of them inexactly; give this one with fewer digits, or as a string"
        )
    return None


def _wrong_bound(key: str, value: float, at: str) -> tuple[str, str] | None:
    """Why the bound ``key: value`` (at ``at``) is refused, or None when the engine
    reads it exactly and within its range."""
    low, high = LOWER_BOUND_RANGE if key in _LOWER else UPPER_BOUND_RANGE
    as_double = float(value)
    if not low < as_double < high:
        shown = "-2^63" if low < -1e18 else "-10^18"
        top = "10^18" if high <= 1e18 else "2^63"
        return at, (
            f"'{key}' {value} at {at} is out of the grammar engine's range (llguidance): "
            f"'{key}' must lie strictly between {shown} and {top}"
        )
    if isinstance(value, int) and as_double != value:
        return at, (
            f"'{key}' {value} at {at} would be read as {int(as_double)}: the grammar engine "
            "(llguidance) reads numbers as 64-bit doubles, so an integer bound beyond 2^53 "
            "must be one exactly (every integer within +-2^53 is)"
        )
    return None


def _may_be_number(kind: Any) -> bool:
    """Whether a schema of ``type`` ``kind`` (absent: None) may be a number."""
    if kind is None:
        return True
    kinds = kind if isinstance(kind, list) else [kind]
    return "integer" in kinds or "number" in kinds


def _is_number(value: Any) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)
