"""Structured output on the wire: the grammar a request's output must follow.

The gateway turns the API's forms (``response_format`` json_object / json_schema,
vLLM's ``structured_outputs`` and ``guided_*``, SGLang's ``regex`` / ``ebnf``, a named
or required tool call) into one llguidance grammar (``houchu.api.structured.request``); the
runner compiles it into a token matcher (``houchu.model.grammar.matcher``).
"""

from __future__ import annotations

from typing import Literal

from msgspec import Struct

#: What the client asked for, for the dashboard and logs: a JSON object, a JSON schema,
#: a regex, a choice list, a Lark / EBNF grammar, or a tool call.
GrammarKind = Literal["json_object", "json_schema", "regex", "choice", "grammar", "tool_call"]


class StructuredOutput(Struct, frozen=True, kw_only=True):
    """A request's output grammar.

    ``grammar``: llguidance's grammar text (its JSON form, from
    ``llguidance.LLMatcher.grammar_from_*``), already validated by the gateway.
    ``kind``: the form it came from (``GrammarKind``).
    ``param``: the request field it came from (``"response_format"``, ``"guided_regex"``,
    ``"tool_choice"``, ...), named by the error when the grammar engine cannot follow it.
    """

    kind: GrammarKind
    grammar: str
    param: str = ""
