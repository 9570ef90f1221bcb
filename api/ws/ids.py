"""The ``id`` an error frame of the WebSocket API carries (``houchu.api.ws.routes``).

A client matches the server's frames to its requests by ``id``, so every error frame
answering a frame carries that frame's ``id`` whenever the frame had one the server can
read, even one it refuses as an id (too long, empty, a fraction), and even when the
frame itself cannot be decoded: nested too deeply for the decoder, not JSON further on,
or a lone surrogate escape. ``id_in_text`` reads such a frame's top-level ``"id"``
with a scan that keeps no stack; ``answer_id`` says which values an error frame can
carry back.
"""

from __future__ import annotations

import re
from json.decoder import scanstring
from typing import Any

#: Longest client id accepted (it becomes part of the engine request id).
MAX_ID_CHARS = 128
#: Steps (runs of brackets, strings, other text) ``id_in_text`` takes before it gives
#: up: an undecodable frame costs at most a few tens of milliseconds of the event loop.
MAX_SCAN_STEPS = 100_000

_SPACE = re.compile(r"[ \t\n\r]*")
_NUMBER = re.compile(r"-?(?:0|[1-9][0-9]*)(\.[0-9]+)?([eE][-+]?[0-9]+)?")
#: One step of skipping a value: a run of openers, a run of closers, a string's opening
#: quote, a comma, or a run of anything else.
_STEP = re.compile(r'[\[{]+|[\]}]+|"|,|[^"\[\]{},]+')


class _GaveUp(Exception):
    """The scan took ``MAX_SCAN_STEPS`` steps."""


def answer_id(value: Any) -> str | int | float | None:
    """The ``id`` an error frame answering a frame whose ``id`` is ``value`` carries: a
    string (unless it holds a lone surrogate, which JSON text cannot carry back) or a
    number, as the client wrote it; None for anything else (absent, null, a boolean, an
    array, an object)."""
    if isinstance(value, str):
        return None if any(0xD800 <= ord(c) < 0xE000 for c in value) else value
    if isinstance(value, int | float) and not isinstance(value, bool):
        return value
    return None


def id_in_text(data: str | bytes) -> Any:
    """The value of the top-level ``"id"`` of a frame msgspec could not decode (``data``:
    its text, or the bytes of a binary frame), when a scan reaches it: ``data`` opens a
    JSON object, the members before ``"id"`` have string keys (their values are skipped,
    not checked: brackets are counted outside strings, with no recursion, so any depth
    costs one pass), and the value is a string or a number. None otherwise (no such
    member, another value, text that breaks off before it, or more than
    ``MAX_SCAN_STEPS`` steps before it). The first ``"id"`` member is read (a decoder
    would keep the last)."""
    text = data.decode("utf-8", "replace") if isinstance(data, bytes) else data
    try:
        return _scan(text)
    except (ValueError, IndexError, _GaveUp):  # scanstring raises a ValueError
        return None


def _scan(text: str) -> Any:
    pos = _SPACE.match(text).end()  # type: ignore[union-attr]
    if text[pos] != "{":
        return None
    pos += 1
    budget = [MAX_SCAN_STEPS]
    while True:
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        if text[pos] != '"':
            return None
        key, pos = scanstring(text, pos + 1)
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        if text[pos] != ":":
            return None
        pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
        if key == "id":
            return _scalar(text, pos)
        pos = _SPACE.match(text, _skip(text, pos, budget)).end()  # type: ignore[union-attr]
        if text[pos] != ",":
            return None
        pos += 1


def _scalar(text: str, pos: int) -> str | int | float | None:
    """The string or number at ``pos``, or None for another value."""
    if text[pos] == '"':
        return scanstring(text, pos + 1)[0]
    m = _NUMBER.match(text, pos)
    if m is None:
        return None
    return float(m[0]) if m[1] or m[2] else int(m[0])


def _skip(text: str, pos: int, budget: list[int]) -> int:
    """The end of the value at ``pos`` (where a ``,`` or the object's ``}`` should
    follow). ``budget``: steps left (shared by the whole scan). Raises ``_GaveUp``,
    ``IndexError`` (the text ends first) or ``ValueError`` (a malformed string)."""
    depth = 0
    while True:
        budget[0] -= 1
        if budget[0] < 0:
            raise _GaveUp
        m = _STEP.match(text, pos)
        if m is None:
            raise IndexError("the text ends inside a value")
        step = m[0]
        if step == '"':
            pos = scanstring(text, pos + 1)[1]
            if depth == 0:
                return pos
            continue
        if step[0] in "[{":
            depth += len(step)
        elif step[0] in "]}":
            if len(step) >= depth:  # the value ends within this run (or had ended)
                return pos + depth
            depth -= len(step)
        elif depth == 0 and step == ",":
            return pos
        elif depth == 0 and step.strip():  # a scalar's text: it ends at the next step
            pos = m.end()
            return pos
        pos = m.end()
