"""The integers a JSON schema may hold for the grammar engine.

llguidance takes a schema as a Python object and reads its numbers as 64-bit integers
(signed or unsigned) or doubles; a Python integer outside both ranges (JSON allows any
number of digits: ``"maximum": 123456789012345678901234567890``) makes it fail with
"Value is not JSON serializable". ``out_of_range_integer`` finds such an integer and
where it is, so the 400 can say so before the engine sees the schema. It recurses per
level: it is given only a schema whose depth ``houchu.api.structured.request.json_schema_grammar``
checked first (at most ``houchu.api.requests.json_depth.MAX_JSON_DEPTH`` levels).
"""

from __future__ import annotations

from typing import Any

#: The smallest integer llguidance reads (``i64``'s minimum).
MIN_INTEGER = -(2**63)
#: The largest integer llguidance reads (``u64``'s maximum).
MAX_INTEGER = 2**64 - 1


def out_of_range_integer(value: Any, at: str = "#") -> tuple[str, int] | None:
    """(the JSON Pointer of the first integer of ``value`` outside ``MIN_INTEGER ..
    MAX_INTEGER``, that integer), or None when every integer fits. ``value``: a decoded
    JSON value (dicts, lists, strings, numbers, booleans, None); ``at``: its pointer.
    Booleans are not integers here (``True`` is JSON's ``true``)."""
    if isinstance(value, int) and not isinstance(value, bool):
        return None if MIN_INTEGER <= value <= MAX_INTEGER else (at, value)
    if isinstance(value, dict):
        items = ((pointer_token(str(k)), v) for k, v in value.items())
    elif isinstance(value, list):
        items = ((str(i), v) for i, v in enumerate(value))
    else:
        return None
    for key, item in items:
        found = out_of_range_integer(item, f"{at}/{key}")
        if found is not None:
            return found
    return None


def integer_words(at: str, value: int) -> str:
    """Why the schema is refused, for ``out_of_range_integer``'s answer."""
    bits = value.bit_length()
    shown = f"the integer {value}" if bits <= 128 else f"an integer of {bits} bits"
    return (
        f"{shown} at {at} does not fit in 64 bits: integers in a JSON schema "
        f"must lie in {MIN_INTEGER} .. {MAX_INTEGER} for the grammar engine (llguidance)"
    )


def pointer_token(key: str) -> str:
    """``key`` as a JSON Pointer token (RFC 6901: ``~`` as ``~0``, ``/`` as ``~1``)."""
    return key.replace("~", "~0").replace("/", "~1")
