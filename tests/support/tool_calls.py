"""Tool calls: the weather tool, its messages, and an engine that answers from a script."""

from __future__ import annotations

from collections.abc import AsyncIterator

from houchu.transport.messages import GenerateRequest, TextDelta
from tests.support.fake_api import PROMPT_TOKENS, FakeEngine

WEATHER = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
    },
}


MESSAGES = [{"role": "user", "content": "Weather in Oslo?"}]
HERMES_WEATHER = '<tool_call>{"name": "get_weather", "arguments": {"city": "Oslo"}}</tool_call>'


class ScriptedEngine(FakeEngine):
    """Answers every request with ``reply``, in pieces of ``step`` characters, ending by
    itself (``finish_reason`` "stop")."""

    def __init__(self, reply: str, step: int = 3) -> None:
        super().__init__()
        self.reply, self.step = reply, step

    async def generate(
        self, req: GenerateRequest, record: dict | None = None
    ) -> AsyncIterator[TextDelta]:
        """Yield the pieces of ``reply``."""
        self.requests.append(req)
        pieces = [self.reply[i : i + self.step] for i in range(0, len(self.reply), self.step)]
        for i, piece in enumerate(pieces):
            yield TextDelta(
                rid=req.rid,
                text=piece,
                token_ids=[100 + i],
                finish_reason="stop" if i == len(pieces) - 1 else None,
                prompt_tokens=PROMPT_TOKENS,
                completion_tokens=i + 1,
            )
