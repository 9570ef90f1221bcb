"""Typed getters for JSON request parameters, with errors that name the parameter.

A ``null`` (or absent) value means "not given" and yields the default. ``true`` is not an
integer and an integer is not a boolean, whatever Python thinks.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from houchu.dashboard.errors import ApiError

Body = Mapping[str, Any]


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
    if isinstance(value, list):
        return "array"
    return "object"


def is_int(value: Any) -> bool:
    """Whether ``value`` is a JSON integer (not a boolean)."""
    return isinstance(value, int) and not isinstance(value, bool)


def type_error(name: str, expected: str, value: Any) -> ApiError:
    """A 400 ``invalid_type`` error naming parameter ``name``."""
    return ApiError(
        f"'{name}' must be {expected}, got {json_type(value)}", param=name, code="invalid_type"
    )


def range_error(name: str, value: Any, lo: Any, hi: Any, lo_open: bool = False) -> ApiError:
    """A 400 ``invalid_value`` error: ``name`` is outside ``[lo, hi]`` (``(lo, hi]``)."""
    if hi is None:
        bound = f"greater than {lo}" if lo_open else f"at least {lo}"
    else:
        bound = f"in ({lo}, {hi}]" if lo_open else f"between {lo} and {hi}"
    return ApiError(f"'{name}' must be {bound}, got {value}", param=name, code="invalid_value")


def get_int(body: Body, name: str, default: Any, lo: int | None, hi: int | None) -> Any:
    """An integer parameter in ``[lo, hi]`` (a ``None`` bound is open), or ``default``."""
    value = body.get(name)
    if value is None:
        return default
    if not is_int(value):
        raise type_error(name, "an integer", value)
    if (lo is not None and value < lo) or (hi is not None and value > hi):
        raise range_error(name, value, lo, hi)
    return value


def get_float(
    body: Body, name: str, default: float, lo: float, hi: float, *, lo_open: bool = False
) -> float:
    """A number in ``[lo, hi]`` (``(lo, hi]`` when ``lo_open``), or ``default``."""
    value = body.get(name)
    if value is None:
        return default
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise type_error(name, "a number", value)
    ok = (lo < value if lo_open else lo <= value) and value <= hi
    if not ok:
        raise range_error(name, value, lo, hi, lo_open)
    return float(value)


def get_bool(body: Body, name: str, default: bool) -> bool:
    """A boolean parameter, or ``default``."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, bool):
        raise type_error(name, "a boolean", value)
    return value


def get_int_list(body: Body, name: str, lo: int, hi: int) -> list[int]:
    """An array of integers each in ``[lo, hi]``; absent means empty."""
    value = body.get(name)
    if value is None:
        return []
    if not isinstance(value, list) or not all(is_int(x) for x in value):
        raise type_error(name, "an array of integers", value)
    for x in value:
        if not lo <= x <= hi:
            raise range_error(name, x, lo, hi)
    return list(value)


def reject_unless(body: Body, name: str, harmless: Callable[[Any], bool], why: str) -> None:
    """Refuse a known-but-unsupported parameter unless absent or at its neutral value."""
    value = body.get(name)
    if value is None:
        return
    try:
        ok = harmless(value)
    except Exception:
        ok = False
    if not ok:
        raise ApiError(why, param=name, code="unsupported_value")
