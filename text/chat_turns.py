"""Chat messages as chat templates read them: role checks and the turn dictionaries.

A template (Jinja, rendered by transformers) reads a list of ``{"role", "content", ...}``
dictionaries; an assistant turn's tool calls as OpenAI ``tool_calls`` entries, a tool
turn's ``tool_call_id`` and ``name``.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from houchu.text.tokenizer.errors import TokenizerError
from houchu.transport.messages import CHAT_ROLES, ROLE_ALIASES, ChatMessage

# Roles a chat message may have: the wire's (``CHAT_ROLES``, "tool" among them).
# ``ROLE_ALIASES`` (``developer``, OpenAI's newer name for system) are rendered as the
# role they stand for.


def conversation(messages: Sequence[ChatMessage]) -> list[dict[str, Any]]:
    """The turns of ``messages`` as chat templates read them, aliases resolved.

    Raises :class:`TokenizerError` when there are no messages or a role is not one of
    system / user / assistant / tool (``developer`` counts as system).
    """
    if not messages:
        raise TokenizerError("a chat request needs at least one message")
    turns = []
    for index, message in enumerate(messages):
        role = ROLE_ALIASES.get(message.role, message.role)
        if role not in CHAT_ROLES:
            allowed = ", ".join(sorted({*CHAT_ROLES, *ROLE_ALIASES}))
            raise TokenizerError(
                f"messages[{index}].role is {message.role!r}; expected one of {allowed}"
            )
        turns.append(_turn(role, message))
    return turns


def _turn(role: str, message: ChatMessage) -> dict[str, Any]:
    """One turn as chat templates read it."""
    turn: dict[str, Any] = {"role": role, "content": message.content}
    if message.tool_calls:
        turn["tool_calls"] = [
            {
                "id": c.id,
                "type": "function",
                "function": {"name": c.name, "arguments": _arguments(c.arguments)},
            }
            for c in message.tool_calls
        ]
    if message.tool_call_id is not None:
        turn["tool_call_id"] = message.tool_call_id
    if message.name is not None:
        turn["name"] = message.name
    return turn


def _arguments(text: str) -> Any:
    """A call's arguments decoded from JSON (templates write them with ``tojson``), or
    the text itself when it is not JSON."""
    try:
        return json.loads(text)
    except ValueError:
        return text
