"""The 400 for a request body or WebSocket frame that msgspec cannot decode, with the
cause said where msgspec's own message misleads.

A JSON string may hold a lone UTF-16 surrogate escape (``"\\ud800x"``): JSON's grammar
allows it, but it is no Unicode character, so the text cannot be a ``str`` of valid
Unicode. msgspec refuses it with a message about the input ("Input data was truncated",
"invalid utf-16 surrogate pair"); the error here names the escape and where it is.
Python's ``json`` module reads such strings (it keeps the lone surrogate), which is how
the escape and its place are found, on the error path only. Raw bytes that are not
UTF-8 (a surrogate encoded as CESU-8 does, ``ed a0 80``: Python's ``json`` would read it
as a lone surrogate) are named as bytes, with their offset, before that.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from houchu.api.errors import ApiError

_SURROGATES = range(0xD800, 0xE000)


def not_json_error(raw: bytes | str, exc: Exception, what: str) -> tuple[ApiError, Any]:
    """(the 400 for ``raw``, which msgspec could not decode with ``exc``; the document
    as Python's ``json`` reads it when that located the problem, else None). ``what``:
    the message's subject ("request body", "frame").

    Bytes that are not UTF-8 give ``<what> holds bytes that are not valid UTF-8 at byte
    offset 14: ed a0 80 ...``. A lone surrogate escape gives ``<what> holds a lone surrogate escape (\\ud800) in
    'guided_choice[0]', which is not valid Unicode text ...`` (``param``: the top-level
    key it is under); any other problem msgspec's message (``<what> is not valid JSON:
    ...``).
    """
    bad_bytes = _invalid_utf8(raw)
    if bad_bytes is not None:  # Python's json would read them as lone surrogates
        return ApiError(f"{what} {bad_bytes}", code="invalid_json"), None
    doc = _python_json(raw)
    found = None if doc is None else next(_lone_surrogates(doc, ""), None)
    if found is None:
        return ApiError(f"{what} is not valid JSON: {exc}", code="invalid_json"), None
    char, where, param = found
    message = (
        f"{what} holds a lone surrogate escape (\\u{ord(char):04x}) {where}, which is not "
        "valid Unicode text: a surrogate escape must be a high one (\\ud800-\\udbff) "
        "followed by a low one (\\udc00-\\udfff), as in \\ud83d\\ude00"
    )
    return ApiError(message, param=param, code="invalid_json"), doc


def _invalid_utf8(raw: bytes | str) -> str | None:
    """Where ``raw`` is not UTF-8, in words ("holds bytes that are not valid UTF-8 at
    byte offset 14: ed a0 80 ..."), or None (text, or valid UTF-8). Bytes ``ed a0..bf``
    are a UTF-16 surrogate encoded as UTF-8 (CESU-8), which UTF-8 forbids; the message
    says so."""
    if isinstance(raw, str):
        return None
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        shown = raw[exc.start : exc.start + 3].hex(" ")
        words = f"holds bytes that are not valid UTF-8 at byte offset {exc.start}: {shown}"
        if raw[exc.start] == 0xED and exc.start + 1 < len(raw) and raw[exc.start + 1] >= 0xA0:
            words += " (a UTF-16 surrogate encoded as UTF-8, as CESU-8 writes it)"
        return words + "; JSON text must be UTF-8"
    return None


def _python_json(raw: bytes | str) -> Any:
    """``raw`` as Python's ``json`` reads it (lone surrogates kept), or None."""
    try:
        return json.loads(raw)
    except (ValueError, RecursionError):  # UnicodeDecodeError is a ValueError
        return None


def _lone(text: str) -> str | None:
    """The first lone surrogate of ``text``, or None."""
    return next((c for c in text if ord(c) in _SURROGATES), None)


def _shown(text: str) -> str:
    """``text`` with any surrogate written as its escape (a message must be valid text)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8")


def _lone_surrogates(
    value: Any, path: str, top: str | None = None
) -> Iterator[tuple[str, str, str | None]]:
    """(the lone surrogate, where it is in words, the top-level key it is under or None)
    for each string or key of ``value`` (at ``path``, "" for the document, under the
    top-level key ``top``) holding one, in document order."""
    if isinstance(value, str):
        char = _lone(value)
        if char is not None:
            yield char, f"in '{path}'" if path else "in the document", top
    elif isinstance(value, dict):
        for key, item in value.items():
            char = _lone(key)
            if char is not None:
                yield char, f"in a key of '{path}'" if path else "in a top-level key", top
            inner = f"{path}.{_shown(key)}" if path else _shown(key)
            yield from _lone_surrogates(item, inner, top if path else _shown(key))
    elif isinstance(value, list):
        for i, item in enumerate(value):
            yield from _lone_surrogates(item, f"{path}[{i}]", top)
