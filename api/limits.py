"""The gateway's limits: admission (overload), body size, slow readers.

- **Admission.** The gateway counts the requests it accepted and has not finished
  (queued in the engine or running, HTTP and WebSocket together). A request that would
  exceed ``max_in_flight`` is refused at once, before its body is read: HTTP 429 with
  ``Retry-After`` and an OpenAI-style error body, or a WebSocket error frame with
  ``"status": 429``. An accepted request always ends with a final answer or an error
  (the count drops when its handler finishes, whatever the outcome). The token bound
  lives where tokens are known: the scheduler refuses (429) a request whose prompt would
  push its waiting queue past ``--max-queued-tokens``.
- **Body size.** A request body or WebSocket frame above ``max_body_bytes`` is refused
  (413, or WebSocket close code 1009).
- **Slow readers.** ``StreamGuard`` watches one streaming response's socket: once more
  than ``stream_buffer_bytes`` bytes wait unsent in its user-space send buffer (the
  kernel's buffers are full: the client does not read), the connection is aborted,
  which ends the handler and aborts the request in the engine (its pages are freed).
  Writes never wait for such a client, so the other streams do not slow down.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Iterator
from dataclasses import dataclass

from houchu.api.errors import ApiError
from houchu.options.gateway_options import (
    DEFAULT_MAX_QUEUED_REQUESTS,
    DEFAULT_MAX_REQUEST_BYTES,
    DEFAULT_STREAM_BUFFER_BYTES,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GatewayLimits:
    """Limits of one gateway.

    Attributes:
        max_in_flight: accepted, unfinished requests (HTTP and WebSocket together).
        max_body_bytes: largest request body or WebSocket frame, bytes.
        stream_buffer_bytes: unsent bytes one stream may leave in its socket buffer.
        api_key: required as ``Authorization: Bearer <key>`` on the API routes (None:
            no key; see ``houchu.api.auth``).
    """

    max_in_flight: int = DEFAULT_MAX_QUEUED_REQUESTS
    max_body_bytes: int = DEFAULT_MAX_REQUEST_BYTES
    stream_buffer_bytes: int = DEFAULT_STREAM_BUFFER_BYTES
    api_key: str | None = None

    def __post_init__(self) -> None:
        for name in ("max_in_flight", "max_body_bytes", "stream_buffer_bytes"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be positive, got {getattr(self, name)}")
        if self.api_key == "":
            raise ValueError("api_key must not be empty (None: no key)")


class Admission:
    """The gateway's count of accepted, unfinished requests, bounded by ``limit``."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.in_flight = 0
        self.num_refused = 0

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one slot for the duration of the block.

        Raises:
            ApiError: (429, ``Retry-After``) every slot is taken.
        """
        if self.in_flight >= self.limit:
            self.num_refused += 1
            raise ApiError(
                f"the server is at capacity ({self.limit} requests queued or running); retry later",
                status=429,
                code="server_overloaded",
            )
        self.in_flight += 1
        try:
            yield
        finally:
            self.in_flight -= 1


class SlowReader(ConnectionResetError):
    """The client stopped reading its stream; the connection was aborted."""


class StreamGuard:
    """Bounds what one stream buffers for its client.

    Args:
        transport: the connection's transport (None: already gone).
        limit_bytes: unsent bytes allowed in the transport's send buffer.
        what: names the stream in the log.

    The socket's kernel send buffer is capped at ``limit_bytes`` (``SO_SNDBUF``; Linux
    doubles it, and otherwise grows it up to ``net.core.wmem_max``, megabytes per
    connection), so a stalled stream holds about three times ``limit_bytes`` in all. The
    transport's high-water mark is raised above ``limit_bytes`` so that a write never
    waits for the client; ``check`` before each write aborts the connection instead.
    """

    def __init__(
        self, transport: asyncio.BaseTransport | None, limit_bytes: int, what: str
    ) -> None:
        self._transport = transport
        self.limit_bytes = limit_bytes
        self._what = what
        if transport is not None:  # duck-typed: uvloop's transports are not asyncio's classes
            with contextlib.suppress(NotImplementedError, AttributeError):
                transport.set_write_buffer_limits(high=2 * limit_bytes + (1 << 16))
            sock = transport.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError, AttributeError):
                    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, limit_bytes)

    @property
    def buffered(self) -> int:
        """Bytes waiting in the send buffer (0 when the transport cannot tell)."""
        try:
            return self._transport.get_write_buffer_size()  # type: ignore[union-attr]
        except (NotImplementedError, AttributeError):
            return 0

    def check(self) -> None:
        """Abort the connection when the client has stopped reading.

        Raises:
            SlowReader: more than ``limit_bytes`` bytes are waiting (the connection is
                aborted; the caller stops streaming).
        """
        buffered = self.buffered
        if buffered <= self.limit_bytes:
            return
        log.warning(
            "%s: the client is not reading (%d bytes unsent, limit %d); aborting",
            self._what,
            buffered,
            self.limit_bytes,
        )
        if self._transport is not None:
            self._transport.abort()
        raise SlowReader(f"{self._what}: client is not reading")
