"""Where the bounds of ``houchu serve``'s options are checked, and how a broken one reads.

Each option's bounds (a range, a positive count, a non-empty list) are declared once, as
msgspec constraints on its field (``Annotated[int, Meta(ge=1)]``) in the option structs
of ``houchu.options``; its choices are the field's ``Literal``. msgspec checks them where
options are decoded or converted, never where a struct is built in Python:

- the CLI: ``houchu.options.checks.check_serve_args`` converts each group's parsed values
  to its struct first (``bound_error``: a one-line error naming the flag), and
  ``houchu.options.parser.config_from_args`` builds the configuration by conversion;
- each actor process decodes its ``ServeConfig`` from JSON (``ServeConfig.from_json``);
- in-process callers (tests, benches) that build a struct themselves check it with
  ``checked``: the model runner does, once, on the ``RunnerOptions`` it is given
  (``RunnerOptions.checked``), and then trusts them.

Checks that are not a field's own bounds (one flag against another, a file that must
exist, what this machine runs) live in ``houchu.options.checks``.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, TypeVar

import msgspec
from msgspec import Meta
from msgspec import inspect as mi

#: A count of at least one (pages, tokens, threads, ranks).
Positive = Annotated[int, Meta(ge=1)]

S = TypeVar("S", bound=msgspec.Struct)

_AT = re.compile(r" - at `\$\.(\w+)(\[\d+\])?`$")


def checked(options: S) -> S:
    """``options`` (a flat option struct built in Python) with its fields' bounds
    checked, as decoding checks them.

    Raises:
        msgspec.ValidationError: (a ``ValueError``) a field out of its bounds; the message
            names the field and its rule (``page_size must be >= 1, got 0 - at `$.page_size```).
    """
    values = msgspec.structs.asdict(options)
    try:
        return msgspec.convert(values, type(options))
    except msgspec.ValidationError as e:
        problem = bound_error(type(options), values)
        if problem is None or not problem[0]:
            raise
        name, rule = problem
        raise msgspec.ValidationError(f"{name} {rule} - at `$.{name}`") from e


def bound_error(struct: type[msgspec.Struct], values: dict[str, Any]) -> tuple[str, str] | None:
    """The first field of ``values`` outside its bounds in ``struct``, as ``(field, rule)``
    (``("port", "must be in 1..65535, got 0")``); None when they all hold."""
    try:
        msgspec.convert(values, struct)
    except msgspec.ValidationError as e:
        text = str(e)
        m = _AT.search(text)
        if m is None:  # not a field's bound: msgspec's own words
            return "", text
        name, item = m[1], m[2] is not None
        t = _field_type(struct, name, item)
        value = values.get(name)
        got = (",".join(map(str, value)) or "nothing") if isinstance(value, tuple) else value
        rule = _rule(t) if t is not None else None
        if rule is None:
            return name, f"{text[: m.start()]} (got {got})"
        return name, f"{'items ' if item else ''}{rule}, got {got}"
    return None


def _field_type(struct: type[msgspec.Struct], name: str, item: bool) -> mi.Type | None:
    """The constrained type of field ``name`` (of its items when ``item``), None left
    out of a union."""
    info = mi.type_info(struct)
    assert isinstance(info, mi.StructType)
    t: mi.Type | None = next((f.type for f in info.fields if f.name == name), None)
    t = _unwrap(t)
    if item and isinstance(t, (mi.ListType, mi.VarTupleType, mi.SetType, mi.FrozenSetType)):
        t = _unwrap(t.item_type)
    return t


def _unwrap(t: mi.Type | None) -> mi.Type | None:
    while isinstance(t, mi.Metadata):
        t = t.type
    if isinstance(t, mi.UnionType):
        members = [m for m in t.types if not isinstance(m, mi.NoneType)]
        t = _unwrap(members[0]) if len(members) == 1 else t
    return t


def field_bounds(struct: type[msgspec.Struct], name: str) -> str | None:
    """The bounds of field ``name`` of ``struct`` in words, for the options' reference
    (``>= 1``, ``in 1..65535``, ``in (0, 1]``, ``items >= 1``); None: it has none."""
    t = _field_type(struct, name, item=False)
    words = _bounds(t) if t is not None else None
    if isinstance(t, (mi.ListType, mi.VarTupleType)):
        items = _bounds(_unwrap(t.item_type))
        words = f"items {items}" if items else words
    return words


def _rule(t: mi.Type) -> str | None:
    """``must be >= 1``, ``must be positive``, ``must be in 1..65535``, ``must be in
    (0, 1]``, ``must not be empty``, ``must be one of off, auto, on``: the bounds of ``t``
    in words (None: none known)."""
    if isinstance(t, (mi.ListType, mi.VarTupleType)) and t.min_length:
        return "must not be empty" if t.min_length == 1 else f"needs {t.min_length} items"
    if isinstance(t, mi.LiteralType):
        return "must be one of " + ", ".join(map(str, t.values))
    words = _bounds(t)
    return None if words is None else f"must be {words}"


def _num(v: float | None) -> float | None:
    """A bound as written: ``1``, not ``1.0`` (msgspec may hold a float's as floats)."""
    return int(v) if isinstance(v, float) and v.is_integer() else v


def _bounds(t: mi.Type | None) -> str | None:
    """``>= 1``, ``positive``, ``in 1..65535``, ``in (0, 1]``, ``at most 4`` (None: a
    type without numeric bounds)."""
    if not isinstance(t, (mi.IntType, mi.FloatType)):
        return None
    lo, lo_open = (_num(t.gt), True) if t.gt is not None else (_num(t.ge), False)
    hi, hi_open = (_num(t.lt), True) if t.lt is not None else (_num(t.le), False)
    if lo is not None and hi is not None:
        if isinstance(t, mi.IntType):
            return f"in {lo + lo_open}..{hi - hi_open}"
        return f"in {'(' if lo_open else '['}{lo}, {hi}{')' if hi_open else ']'}"
    if lo is not None:
        if lo == 0 and lo_open:
            return "positive"
        return f"{'>' if lo_open else '>='} {lo}"
    if hi is not None:
        return f"{'<' if hi_open else 'at most'} {hi}"
    return None
