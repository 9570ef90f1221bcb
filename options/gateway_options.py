"""The gateway's options: the "HTTP gateway" group of ``houchu serve``'s flags."""

from __future__ import annotations

from typing import Annotated, Literal

import msgspec
from msgspec import Meta

from houchu.transport.channel import MAX_MESSAGE_BYTES

#: Accepted, unfinished requests the gateway holds (queued or running).
DEFAULT_MAX_QUEUED_REQUESTS = 512
#: Largest request body / WebSocket frame, bytes.
DEFAULT_MAX_REQUEST_BYTES = 8 * 1024 * 1024
#: Bytes a stream may leave unread in its socket's send buffer before it is aborted.
DEFAULT_STREAM_BUFFER_BYTES = 1024 * 1024
#: Largest --max-request-mb: a request must fit well inside one actor message.
MAX_REQUEST_MB = MAX_MESSAGE_BYTES // 4 // 2**20


class GatewayOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The HTTP / WebSocket gateway (``houchu.actors.gateway``) and its limits
    (``houchu.api.limits``); each field is the ``houchu serve`` flag of its name.

    Attributes:
        host: address to listen on.
        port: HTTP and WebSocket port.
        served_model_name: the name clients use in the ``model`` field (None: the model
            file or folder name, ``ServeConfig.model_name``).
        api_key: when set, ``Authorization: Bearer <key>`` is required on the API routes
            (401); never empty.
        request_timeout: seconds without progress before a request fails.
        max_queued_requests: accepted, unfinished requests (HTTP and WebSocket; beyond it
            429 with ``Retry-After``).
        max_request_mb: largest request body or WebSocket frame, MiB (413 beyond it).
        stream_buffer_kb: unsent KiB a stream may leave in its socket buffer for a client
            that does not read before it is aborted.
        tool_call_parser: how a reply to ``tool_choice: "auto"`` is parsed into tool
            calls (the model family's format, ``houchu.text.tool_calls.parse``).
    """

    host: str = "127.0.0.1"
    port: Annotated[int, Meta(ge=1, le=65535)] = 8000
    served_model_name: str | None = None
    api_key: str | None = None
    request_timeout: Annotated[float, Meta(gt=0)] = 300.0
    max_queued_requests: Annotated[int, Meta(ge=1)] = DEFAULT_MAX_QUEUED_REQUESTS
    max_request_mb: Annotated[float, Meta(gt=0, le=MAX_REQUEST_MB)] = (
        DEFAULT_MAX_REQUEST_BYTES / 2**20
    )
    stream_buffer_kb: Annotated[int, Meta(ge=1)] = DEFAULT_STREAM_BUFFER_BYTES >> 10
    tool_call_parser: Literal["hermes", "mistral", "llama3_json"] = "hermes"

    @property
    def max_request_bytes(self) -> int:
        """``max_request_mb`` in bytes."""
        return int(self.max_request_mb * 2**20)

    @property
    def stream_buffer_bytes(self) -> int:
        """``stream_buffer_kb`` in bytes."""
        return self.stream_buffer_kb << 10
