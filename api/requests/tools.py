"""Tool calls at the gateway: ``tools`` and ``tool_choice`` checked, the chat template's
``tools``, the grammar that enforces ``required`` and a named function, and the parser
of the model's reply.

``tool_choice`` (default ``auto`` when ``tools`` are given, as OpenAI's):

- ``none``: the template is not given the tools and the reply is plain content;
- ``auto``: the template is given the tools; the reply is parsed by the server's
  ``--tool-call-parser`` (``houchu.text.tool_calls.parse``) into content and calls;
- ``required``: the reply is forced (structured output) to be a JSON array of
  ``{"name": <one of the tools>, "parameters": <its arguments>}``, at least one;
- ``{"type": "function", "function": {"name": N}}``: the reply is forced to be the
  arguments of ``N``, valid for its ``parameters`` schema.

The two forced forms are vLLM's. Each function's schema is compiled by llguidance when
the request arrives, so an invalid schema is a 400. A function declared without
``parameters`` has none (OpenAI's reading, ``NO_PARAMETERS``): its arguments are ``{}``;
one that declares them gives a JSON Schema of ``type: "object"`` (a 400 otherwise, as
OpenAI answers).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from houchu.api.errors import ApiError
from houchu.api.requests.json_depth import MAX_JSON_DEPTH, depth_words, too_deep
from houchu.api.schema.bodies import (
    ChatCompletionRequest,
    TokenizeRequest,
    WsGenerateRequest,
)
from houchu.api.schema.refusals import CHAT_ONLY, CHAT_ONLY_ONE
from houchu.api.schema.tools import NamedToolChoice, ToolDef
from houchu.api.structured.request import checked, json_schema_grammar
from houchu.text.tool_calls.parse import (
    FirstCallParser,
    ForcedCallParser,
    RequiredCallsParser,
    ToolCallParser,
    make_parser,
)
from houchu.transport.structured import StructuredOutput

_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
#: The arguments of a function declared without ``parameters``: OpenAI reads a missing
#: ``parameters`` as an empty parameter list, so the only arguments are ``{}``.
NO_PARAMETERS: dict[str, Any] = {"type": "object", "properties": {}, "additionalProperties": False}
#: The levels ``required``'s schema wraps each function's ``parameters`` in: the array,
#: its ``items``, the ``anyOf`` list, a call's object and its ``properties``.
REQUIRED_WRAP_DEPTH = 5


@dataclass(frozen=True)
class ToolSetup:
    """What a request's ``tools`` / ``tool_choice`` mean.

    Attributes:
        choice: "none", "auto", "required" or "named".
        name: the named function (``choice`` "named").
        template_tools: the ``tools`` the chat template is given (None: none).
        structured: the grammar that forces the reply (required / named), or None.
        single: ``parallel_tool_calls: false``: at most one call (``required``'s grammar
            allows one; with ``auto`` the first call the model writes is returned).
        names: the functions of ``tools``; with ``auto``, a call to another name stays
            content.
    """

    choice: str
    name: str | None
    template_tools: list[dict[str, Any]] | None
    structured: StructuredOutput | None
    single: bool = False
    names: frozenset[str] = frozenset()

    def parser(self, auto_parser: str) -> ToolCallParser | None:
        """The parser of the reply (None: plain content); ``auto_parser``: the server's
        ``--tool-call-parser``."""
        if self.choice == "named":
            assert self.name is not None
            return ForcedCallParser(self.name)
        if self.choice == "required":
            return RequiredCallsParser()
        if self.choice == "auto":
            parser = make_parser(auto_parser, self.names)
            return FirstCallParser(parser) if self.single else parser
        return None


def refuse_tools_on_prompt(req: Any) -> None:
    """A prompt (not ``messages``: a completion, a WebSocket prompt frame, ``/tokenize``
    of a ``prompt``) has no chat template to give tools to: ``tools`` (even ``[]``) and
    ``tool_choice`` are a 400, not ignored.

    Raises:
        ApiError: (400, ``unsupported_value``) naming the first one given.
    """
    for name, why in (("tools", CHAT_ONLY), ("tool_choice", CHAT_ONLY_ONE)):
        if getattr(req, name, None) is not None:
            raise ApiError(f"'{name}' {why}", param=name, code="unsupported_value")


def tool_setup(
    req: ChatCompletionRequest | WsGenerateRequest | TokenizeRequest,
) -> ToolSetup | None:
    """The tool setup of ``req``, or None when it gives no tools (``/tokenize`` has no
    ``tool_choice``: its tools go to the template, as with ``auto``).

    ``tool_choice`` without ``tools`` is a 400 (``auto``, ``required``, a named
    function), as OpenAI and vLLM answer it, except ``none``: vLLM accepts ``none``
    without tools (its ``check_tool_usage`` returns before asking for them) and some
    clients send it on every request, so it is accepted and means what it means beside
    tools (plain content). OpenAI refuses ``none`` too; houchu follows vLLM there.

    Raises:
        ApiError: (400) ``tool_choice`` other than ``none`` without ``tools``, a named
            function not in ``tools``, two tools of one name, a parameters schema that
            is not of ``type: "object"`` (``check_parameters``) or one llguidance cannot
            compile.
    """
    tools, choice = req.tools or [], getattr(req, "tool_choice", None)
    if not tools:
        if choice is None or choice == "none":
            return None
        raise ApiError(
            "'tool_choice' is only allowed when 'tools' are specified ('none' excepted)",
            param="tool_choice",
            code="invalid_value",
        )
    by_name: dict[str, ToolDef] = {}
    for i, tool in enumerate(tools):
        name = tool.function.name
        if not _NAME.fullmatch(name):
            raise ApiError(
                f"'tools[{i}].function.name' must be letters, digits, '_', '.' or '-', "
                f"got {name!r}",
                param=f"tools[{i}].function.name",
                code="invalid_value",
            )
        if name in by_name:
            raise ApiError(
                f"'tools[{i}].function.name' repeats the name {name!r}",
                param=f"tools[{i}].function.name",
                code="invalid_value",
            )
        check_parameters(tool, i)
        by_name[name] = tool
    grammars = {name: _arguments_grammar(t, i) for i, (name, t) in enumerate(by_name.items())}
    mode = "auto" if choice is None else choice
    named: str | None = None
    structured = None
    if isinstance(mode, NamedToolChoice):
        named = mode.function.name
        if named not in by_name:
            known = ", ".join(repr(n) for n in by_name)
            raise ApiError(
                f"'tool_choice' names the function {named!r}, which is not in 'tools' ({known})",
                param="tool_choice",
                code="invalid_value",
            )
        structured = StructuredOutput(
            kind="tool_call", grammar=grammars[named], param="tool_choice"
        )
        mode = "named"
    single = getattr(req, "parallel_tool_calls", None) is False
    if mode == "required":
        structured = StructuredOutput(
            kind="tool_call", grammar=_required_grammar(tools, single), param="tool_choice"
        )
    template = None if mode == "none" else [_template_tool(t) for t in tools]
    return ToolSetup(mode, named, template, structured, single, frozenset(by_name))


def check_parameters(tool: ToolDef, i: int) -> None:
    """``tools[i].function.parameters``, when it declares any, is a JSON Schema of
    ``type: "object"``: a function's arguments are a JSON object (OpenAI refuses any
    other schema with this code; ``parameters`` absent or ``{}`` declares none).

    Raises:
        ApiError: (400, ``invalid_function_parameters``) naming the type given.
    """
    params = tool.function.parameters
    if not params or params.get("type") == "object":
        return
    got = f"type {params['type']!r}" if "type" in params else "a schema without 'type'"
    param = f"tools[{i}].function.parameters"
    raise ApiError(
        f"'{param}' of the function {tool.function.name!r} must be a JSON Schema of "
        f'type "object" (a function\'s arguments are a JSON object), got {got}',
        param=param,
        code="invalid_function_parameters",
    )


def _schema(tool: ToolDef) -> dict[str, Any]:
    """The JSON schema of ``tool``'s arguments: ``NO_PARAMETERS`` when it declares none or
    an empty ``parameters: {}`` (the same: no parameter is declared; an empty JSON schema
    would let the arguments be any JSON value, a string among them)."""
    return tool.function.parameters or NO_PARAMETERS


def _arguments_grammar(tool: ToolDef, i: int) -> str:
    """The grammar of one function's arguments. Raises ApiError (400)."""
    param = f"tools[{i}].function.parameters"
    try:
        grammar = json_schema_grammar(_schema(tool), strict=bool(tool.function.strict))
    except (ValueError, TypeError) as exc:
        raise ApiError(
            f"'{param}' is not a valid JSON schema: {exc}", param=param, code="invalid_grammar"
        ) from None
    return checked(grammar, param, "json_schema")


def _required_grammar(tools: list[ToolDef], single: bool = False) -> str:
    """At least one call to any of ``tools`` (exactly one when ``single``), as a JSON
    array (vLLM's form).

    Raises:
        ApiError: (400, ``invalid_grammar``) a function's ``parameters`` too deep to sit
            ``REQUIRED_WRAP_DEPTH`` levels down in the array's schema.
    """
    room = MAX_JSON_DEPTH - REQUIRED_WRAP_DEPTH
    for i, tool in enumerate(tools):
        if too_deep(_schema(tool), room):
            param = f"tools[{i}].function.parameters"
            raise ApiError(
                f"'{param}' {depth_words(room)}: with tool_choice 'required' each "
                f"function's parameters sit {REQUIRED_WRAP_DEPTH} levels down in the "
                f"schema of the array of calls, and the grammar engine (llguidance) reads "
                f"at most {MAX_JSON_DEPTH} levels",
                param=param,
                code="invalid_grammar",
            )
    calls = [
        {
            "type": "object",
            "properties": {
                "name": {"type": "string", "enum": [t.function.name]},
                "parameters": _schema(t),
            },
            "required": ["name", "parameters"],
            "additionalProperties": False,
        }
        for t in tools
    ]
    schema: dict[str, Any] = {"type": "array", "minItems": 1, "items": {"anyOf": calls}}
    if single:
        schema["maxItems"] = 1
    return checked(json_schema_grammar(schema), "tools", "tool_call")


def _template_tool(tool: ToolDef) -> dict[str, Any]:
    """A ``tools`` entry as chat templates read it (OpenAI's shape)."""
    f = tool.function
    function: dict[str, Any] = {"name": f.name, "parameters": _schema(tool)}
    if f.description is not None:
        function["description"] = f.description
    return {"type": "function", "function": function}
