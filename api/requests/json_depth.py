"""How deeply a request's free-form JSON nests, measured without recursion.

A request's free-form JSON values (a JSON schema: ``response_format``, ``guided_json``,
``structured_outputs.json``, a tool's ``parameters``; ``chat_template_kwargs``) arrive
decoded, and msgspec decodes a body up to Python's recursion limit (about 1000 levels).
The code that reads such a value recurses at least once per level: the schema checks
and rewrites (``houchu.api.structured.json_schema.integers``, ``schema_numbers``, ``schema_rewrites``),
``chat_template``'s integer check, the chat template's ``tojson`` and the msgpack
between the actors. A value a few hundred levels deep overflowed one of them (a
``RecursionError``: an HTTP 500). ``nesting_depth`` measures a value with an explicit
stack, once, before any of them runs, and a value deeper than ``MAX_JSON_DEPTH`` is a
400 naming its field.

``MAX_JSON_DEPTH`` is the grammar engine's own bound on a JSON schema: llguidance reads
the schema with serde_json, whose recursion limit (128 levels) covers the schema inside
the 4 levels its grammar wraps it in, so a schema 124 levels deep compiles and one 125
deep does not ("recursion limit exceeded"; llguidance 1.x, found by experiment and kept
by ``tests/integration/test_api_json_depth.py``). The same bound holds ``chat_template_kwargs``:
deep enough for any template variable, far below the depth recursive code overflows at.
"""

from __future__ import annotations

from typing import Any

#: The most levels of JSON objects and arrays a request's free-form value may nest (a
#: value's own object or array is its first level; a string or number has none).
MAX_JSON_DEPTH = 124


def nesting_depth(value: Any, limit: int = MAX_JSON_DEPTH) -> int:
    """The levels of JSON objects and arrays (dicts and lists) of ``value``, a decoded
    JSON value: 0 for a scalar, 1 for ``{}`` or ``[1, 2]``, 2 for ``{"a": [1]}``. The walk
    stops at the first level deeper than ``limit`` and answers ``limit + 1`` (so a huge
    value costs no more than its first ``limit + 1`` levels). Iterative: any depth is
    safe to measure."""
    deepest = 0
    todo: list[tuple[Any, int]] = [(value, 1)]
    while todo:
        item, depth = todo.pop()
        if isinstance(item, dict):
            children = item.values()
        elif isinstance(item, list):
            children = item
        else:
            continue
        if depth > limit:
            return limit + 1
        deepest = max(deepest, depth)
        todo.extend((child, depth + 1) for child in children)
    return deepest


def too_deep(value: Any, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether ``value`` nests more than ``limit`` levels of objects and arrays."""
    return nesting_depth(value, limit) > limit


def depth_words(limit: int = MAX_JSON_DEPTH) -> str:
    """What a value too deep does, after its name: "nests more than 124 levels of JSON
    objects and arrays" (the caller says why that is the bound)."""
    return f"nests more than {limit} levels of JSON objects and arrays"
