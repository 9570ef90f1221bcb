"""The tool types of the chat request bodies (``houchu.api.schema.bodies``): the functions a
request declares (``tools``), the one it may force (``tool_choice``), and the tool calls
of an assistant turn in the history. ``houchu.api.requests.tools`` checks what the types cannot
say (names, schemas, the choice among the tools)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from msgspec import Meta, Struct


class CalledFunction(Struct, kw_only=True):
    """The function an assistant's tool call named, and its arguments (JSON text)."""

    name: str
    arguments: str


class ToolCallIn(Struct, kw_only=True):
    """A tool call in an assistant turn of the history."""

    id: str
    type: Literal["function"] = "function"
    function: CalledFunction


#: Letters, digits, ``_``, ``.`` and ``-`` (checked by ``houchu.api.requests.tools``).
FunctionName = Annotated[str, Meta(min_length=1, max_length=64)]


class FunctionDef(Struct, kw_only=True):
    """A function the model may call: ``parameters`` is the JSON schema of its
    arguments (default, as OpenAI's: no parameters, the arguments are ``{}``);
    ``strict`` as in ``response_format``."""

    name: FunctionName
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(Struct, kw_only=True):
    """One entry of ``tools``."""

    type: Literal["function"]
    function: FunctionDef


class ChosenFunction(Struct, kw_only=True):
    name: str


class NamedToolChoice(Struct, kw_only=True):
    """``tool_choice: {"type": "function", "function": {"name": ...}}``: call it."""

    type: Literal["function"]
    function: ChosenFunction


ToolChoice = Literal["none", "auto", "required"] | NamedToolChoice
#: At least one tool (OpenAI refuses ``[]``: leave ``tools`` out for none).
Tools = Annotated[list[ToolDef], Meta(min_length=1, max_length=128)]
