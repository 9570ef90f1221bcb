"""The values tool-call parsing produces (``houchu.text.tool_calls.parse``): a call, a parsed
reply, and what one piece of a streamed reply releases."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Any


@dataclass
class ToolCall:
    """One call: ``arguments`` is JSON text (as OpenAI sends it)."""

    name: str
    arguments: str
    id: str = field(default_factory=lambda: f"call_{uuid.uuid4().hex[:24]}")

    def to_openai(self, index: int | None = None) -> dict[str, Any]:
        """The OpenAI ``tool_calls`` entry (with ``index`` in a stream delta)."""
        out: dict[str, Any] = {} if index is None else {"index": index}
        out.update(
            {
                "id": self.id,
                "type": "function",
                "function": {"name": self.name, "arguments": self.arguments},
            }
        )
        return out


@dataclass
class Parsed:
    """A reply split into its content (None when there is none) and its calls."""

    content: str | None
    calls: list[ToolCall]


@dataclass
class StreamDelta:
    """What one piece of text releases: content, and tool-call deltas (OpenAI's
    ``delta.tool_calls`` entries, each with its ``index``)."""

    content: str = ""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
