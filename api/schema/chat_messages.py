"""The chat turns of a request body as the wire carries them."""

from __future__ import annotations

from houchu.api.errors import ApiError
from houchu.api.schema.bodies import ChatMessageIn
from houchu.transport.messages import ROLE_ALIASES, ChatMessage, ToolCallMessage


def chat_messages(messages: list[ChatMessageIn]) -> list[ChatMessage]:
    """The wire's chat turns: roles resolved (``developer`` is ``system``), content
    parts joined by newlines, tool calls and tool results kept.

    Raises:
        ApiError: (400) a turn without content that is not an assistant's tool call, or
            a ``tool`` turn without the ``tool_call_id`` it answers (OpenAI's rule).
    """
    out = []
    for i, m in enumerate(messages):
        if m.role == "tool" and not m.tool_call_id:
            raise ApiError(
                f"missing required parameter 'messages[{i}].tool_call_id' (a 'tool' turn "
                "answers the tool call of that id)",
                param=f"messages[{i}].tool_call_id",
                code="missing_required_parameter",
            )
        if m.content is None and not (m.role == "assistant" and m.tool_calls):
            raise ApiError(
                f"missing required parameter 'messages[{i}].content' (only an assistant "
                "turn with 'tool_calls' may leave it out)",
                param=f"messages[{i}].content",
                code="missing_required_parameter",
            )
        if m.content is None:
            content = ""
        elif isinstance(m.content, str):
            content = m.content
        else:
            content = "\n".join(p.text for p in m.content)
        calls = None
        if m.tool_calls:
            calls = [
                ToolCallMessage(id=c.id, name=c.function.name, arguments=c.function.arguments)
                for c in m.tool_calls
            ]
        role = ROLE_ALIASES.get(m.role, m.role)
        out.append(ChatMessage(role, content, calls, m.tool_call_id, m.name))
    return out
