"""Tool calls in a model's output: parse the text into OpenAI ``tool_calls``, whole or
as it streams.

How a model writes a call depends on its family; the parser is chosen per server
(``--tool-call-parser``, named as vLLM names its parsers):

- ``hermes`` (Hermes, Qwen2.5 / Qwen3, SmolLM3):
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>``, any number of them;
- ``mistral``: ``[TOOL_CALLS]`` followed by a JSON array of ``{"name", "arguments"}``;
- ``llama3_json`` (Llama 3.1+): the whole reply is ``{"name": ..., "parameters": {...}}``
  (optionally after ``<|python_tag|>``), several separated by ``;``.

Two forms do not depend on the family, because structured output forces them
(``houchu.api.requests.tools``): a named ``tool_choice`` makes the reply the arguments object
itself (``ForcedCallParser``), and ``required`` makes it a JSON array of
``{"name", "parameters"}`` (``RequiredCallsParser``), as vLLM does.

A call whose JSON does not parse stays in the content. Streaming (``ToolCallStream``):
content is released as it comes except text that may start a call marker, which is held
back until it cannot; a call is released once complete (its name, then its arguments),
as OpenAI's deltas do (a first delta with ``id``, ``type`` and ``function.name``, then
``function.arguments`` fragments).
"""

from __future__ import annotations

import abc
import json
import re
from typing import Any

from houchu.text.tool_calls.streams import (
    BufferedStream,
    FirstCallStream,
    ForcedStream,
    HeldStream,
    MarkerStream,
    ToolCallStream,
)
from houchu.text.tool_calls.types import Parsed, ToolCall

#: The ``--tool-call-parser`` choices.
PARSERS = ("hermes", "mistral", "llama3_json")


def _call(
    obj: Any, args_key: str = "arguments", known: frozenset[str] | None = None
) -> ToolCall | None:
    """A call from a decoded ``{"name", args_key: {...}}`` object, else None; ``known``:
    the request's function names (None: any name), a call to another name is None."""
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    if known is not None and obj["name"] not in known:
        return None
    args = obj.get(args_key, obj.get("arguments", obj.get("parameters", {})))
    text = args if isinstance(args, str) else json.dumps(args, ensure_ascii=False)
    return ToolCall(obj["name"], text)


def _loads(text: str) -> Any:
    try:
        return json.loads(text)
    except ValueError:
        return None


class ToolCallParser(abc.ABC):
    """Parses a whole reply; ``stream()`` gives an incremental parser of the same form.

    ``known`` (the ``auto`` parsers): the names of the request's ``tools``. A call to a
    function not among them is not a call: its text stays in the content, where the
    client sees what the model wrote (a client cannot run a function it never offered;
    SGLang's parsers skip such calls too).
    """

    known: frozenset[str] | None = None

    @abc.abstractmethod
    def parse(self, text: str) -> Parsed:
        """Content and calls of a finished reply."""

    def stream(self) -> ToolCallStream:
        """A fresh incremental parser."""
        return BufferedStream(self)


class MarkerParser(ToolCallParser):
    """Calls between ``start`` and ``end`` markers (``end`` "": to the end of the reply)
    holding one JSON object each, or (``array``) a JSON array of them."""

    def __init__(
        self, start: str, end: str, *, array: bool = False, known: frozenset[str] | None = None
    ) -> None:
        self.start, self.end, self.array, self.known = start, end, array, known

    def parse(self, text: str) -> Parsed:
        content, calls, rest = [], [], text
        while True:
            i = rest.find(self.start)
            if i < 0:
                content.append(rest)
                break
            content.append(rest[:i])
            body_start = i + len(self.start)
            j = rest.find(self.end, body_start) if self.end else -1
            body = rest[body_start:] if j < 0 else rest[body_start:j]
            found = self._calls(body.strip())
            if found is None:  # not a call after all: keep the text
                content.append(rest[i:] if j < 0 else rest[i : j + len(self.end)])
            else:
                calls.extend(found)
            if j < 0:
                break
            rest = rest[j + len(self.end) :]
        joined = "".join(content)
        return Parsed(joined if joined.strip() or not calls else None, calls)

    def _calls(self, body: str) -> list[ToolCall] | None:
        obj = _loads(body)
        items = obj if self.array and isinstance(obj, list) else [obj]
        calls = [_call(o, known=self.known) for o in items]
        found = [c for c in calls if c is not None]
        return found if calls and len(found) == len(calls) else None

    def stream(self) -> ToolCallStream:
        return MarkerStream(self)


class Llama3JsonParser(ToolCallParser):
    """Llama 3.1's JSON calls: the reply (after an optional ``<|python_tag|>``) is one or
    more ``{"name", "parameters"}`` objects separated by ``;``; anything else is content."""

    TAG = "<|python_tag|>"

    def __init__(self, known: frozenset[str] | None = None) -> None:
        self.known = known

    def parse(self, text: str) -> Parsed:
        body = text.strip().removeprefix(self.TAG).strip()
        if not body.startswith("{"):
            return Parsed(text, [])
        calls = [
            _call(_loads(part), "parameters", self.known)
            for part in body.split(";")
            if part.strip()
        ]
        if not calls or any(c is None for c in calls):
            return Parsed(text, [])
        return Parsed(None, calls)  # type: ignore[arg-type]


class ForcedCallParser(ToolCallParser):
    """A named ``tool_choice``: the reply is the arguments of ``name``."""

    def __init__(self, name: str) -> None:
        self.name = name

    def parse(self, text: str) -> Parsed:
        return Parsed(None, [ToolCall(self.name, text)])

    def stream(self) -> ToolCallStream:
        return ForcedStream(self.name)


class RequiredCallsParser(ToolCallParser):
    """``tool_choice: "required"``: the reply is a JSON array of
    ``{"name", "parameters"}`` (the grammar sees to it).

    A reply cut short (``finish_reason: "length"``) is still its calls: the complete
    ones, then the cut one with its name and its arguments' text as far as it got, as a
    named ``tool_choice`` gives its cut arguments (``ForcedCallParser``). That is what
    OpenAI returns for a call cut by ``max_tokens`` (``tool_calls`` whose ``arguments``
    do not parse, ``finish_reason: "length"``) and what vLLM streams for both forced
    forms: a client that asked for a call gets a call, and the whole reply says what the
    streamed deltas said.

    The array's markup is never content, whole or streamed (``HeldStream``): a reply
    cut before the first call's name is complete (nothing to name a call by) has no
    content and no call, and an element that is not a call (which the grammar does not
    allow) is dropped.
    """

    #: A call's start, up to its complete name: ``{"name": "N"`` (the grammar writes
    #: ``name`` first, then ``parameters``).
    CALL_NAME = re.compile(r'\{\s*"name"\s*:\s*("(?:[^"\\]|\\.)*")')
    #: What comes between the name and the arguments (with any spaces between).
    BEFORE_ARGUMENTS = (",", '"parameters"', ":")

    def parse(self, text: str) -> Parsed:
        return Parsed(None, [c for c in self._calls(text) if c is not None])

    def stream(self) -> ToolCallStream:
        return HeldStream(self)

    def _calls(self, text: str) -> list[ToolCall | None]:
        """The array's calls, the last maybe cut (None for an element not a call)."""
        body = text.lstrip()
        if not body.startswith("["):
            return []
        decoder, pos = json.JSONDecoder(), 1
        calls: list[ToolCall | None] = []
        while True:
            while pos < len(body) and body[pos] in " \t\r\n,":
                pos += 1
            if pos >= len(body) or body[pos] == "]":
                return calls
            try:
                obj, pos = decoder.raw_decode(body, pos)
            except ValueError:  # the cut element
                cut = self._cut_call(body, pos)
                if cut is not None:
                    calls.append(cut)
                return calls
            calls.append(_call(obj, "parameters"))

    def _cut_call(self, body: str, pos: int) -> ToolCall | None:
        """The call cut at the end of ``body`` (its element starts at ``pos``): its name
        once the name is complete, and its arguments' text as far as it got ("" when
        the cut came before them, e.g. right after the name); None before that."""
        head = self.CALL_NAME.match(body, pos)
        if head is None:
            return None
        name, rest = json.loads(head.group(1)), body[head.end() :]
        for part in self.BEFORE_ARGUMENTS:  # ``, "parameters": ``, spaces between
            rest = rest.lstrip()
            if part.startswith(rest):  # cut within it (or right before): no arguments yet
                return ToolCall(name, "")
            if not rest.startswith(part):
                return None
            rest = rest[len(part) :]
        return ToolCall(name, rest.lstrip())


class FirstCallParser(ToolCallParser):
    """``parallel_tool_calls: false`` (OpenAI: at most one call per reply): the reply as
    ``inner`` parses it, with its first call only, and nothing after that call (whole
    and streamed): a second call, complete or cut by ``max_tokens``, never reaches the
    reply, not even as content."""

    def __init__(self, inner: ToolCallParser) -> None:
        self.inner = inner

    def parse(self, text: str) -> Parsed:
        parsed = self.inner.parse(text)
        end = getattr(self.inner, "end", "")
        at = 0
        while parsed.calls and end and (at := text.find(end, at)) >= 0:
            at += len(end)  # the reply ends where its first call does
            head = self.inner.parse(text[:at])
            if head.calls:
                return Parsed(head.content, head.calls[:1])
        return Parsed(parsed.content, parsed.calls[:1])

    def stream(self) -> ToolCallStream:
        return FirstCallStream(self.inner.stream(), getattr(self.inner, "end", ""))


def make_parser(name: str, known: frozenset[str] | None = None) -> ToolCallParser:
    """The ``--tool-call-parser`` named ``name`` (one of ``PARSERS``); ``known``: the
    request's function names (``ToolCallParser``), None for any name.

    Raises:
        ValueError: an unknown name.
    """
    if name == "hermes":
        return MarkerParser("<tool_call>", "</tool_call>", known=known)
    if name == "mistral":
        return MarkerParser("[TOOL_CALLS]", "", array=True, known=known)
    if name == "llama3_json":
        return Llama3JsonParser(known)
    raise ValueError(f"unknown tool call parser {name!r}; expected one of {', '.join(PARSERS)}")
