"""Typed asyncio ZeroMQ channels: one PULL inbox per actor, PUSH outboxes to peers.

An ``Inbox`` is generic in the union of messages its actor accepts; the msgspec decoder is
built once, so a malformed or unexpected message is rejected at the boundary
(``BadMessage``) instead of reaching actor code. An ``Outbox`` encodes with msgpack.
No pickle anywhere.

A frame longer than ``MAX_MESSAGE_BYTES`` never reaches the inbox: ZeroMQ
(``maxmsgsize``) drops the connection of the peer that sent it, before reading it into
memory. tcp:// sockets are CURVE-authenticated (``houchu.transport.security``).
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
import zmq
import zmq.asyncio

from houchu.transport import security

T = TypeVar("T")

_HWM = 0  # unbounded queues: nothing accepted is dropped silently
#: Largest frame an inbox accepts, bytes (far above any real message: the gateway's
#: request body limit is at most a quarter of it, and bulk data never travels here).
MAX_MESSAGE_BYTES = 128 * 1024 * 1024


class BadMessage(Exception):
    """A frame that does not decode to any message the inbox accepts."""


class Inbox(Generic[T]):
    """The receiving end of an actor: binds a PULL socket at ``address``.

    Args:
        ctx: the asyncio ZeroMQ context of this process.
        address: ``ipc://PATH``, ``inproc://NAME`` or ``tcp://HOST:PORT``.
        accepts: the message type or union of types this inbox decodes.
        max_bytes: largest frame accepted (bytes); a longer one closes its sender's
            connection.

    Raises:
        security.InsecureTransport: ``address`` is tcp:// and no CURVE keys are registered.
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        address: str,
        accepts: Any,
        max_bytes: int = MAX_MESSAGE_BYTES,
    ) -> None:
        self.address = address
        self._ctx = ctx
        keys = security.keys_for(address)
        self._sock = ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, _HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.setsockopt(zmq.MAXMSGSIZE, max_bytes)
        self._curve = keys is not None
        if keys is not None:
            security.secure_server(ctx, self._sock, keys)
        self._sock.bind(address)
        self._decoder = msgspec.msgpack.Decoder(accepts)

    def _decode(self, frame: bytes) -> T:
        try:
            return self._decoder.decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise BadMessage(f"{self.address}: {e} ({len(frame)} bytes)") from e
        except RecursionError:  # msgpack nested deeper than the interpreter allows
            raise BadMessage(f"{self.address}: frame nested too deeply") from None

    async def recv(self) -> T:
        """Wait for the next message. Raises BadMessage for an undecodable frame."""
        return self._decode(await self._sock.recv())

    def recv_nowait(self) -> T | None:
        """Return the next message if one is queued, else None."""
        try:
            frame = self._sock.recv(flags=zmq.NOBLOCK)
            if hasattr(frame, "result"):  # zmq.asyncio returns a done Future
                frame = frame.result()
        except zmq.Again:
            return None
        return self._decode(frame)

    async def poll(self, timeout_s: float) -> bool:
        """True when a message is ready within ``timeout_s`` seconds."""
        return bool(await self._sock.poll(int(timeout_s * 1000), zmq.POLLIN))

    def close(self) -> None:
        if not self._sock.closed and self._curve:
            security.release_server(self._ctx)
        self._sock.close(linger=0)


class Outbox:
    """The sending end towards one peer: a PUSH socket connected to its inbox address.

    Raises:
        security.InsecureTransport: ``address`` is tcp:// and no CURVE keys are registered.
    """

    def __init__(self, ctx: zmq.asyncio.Context, address: str) -> None:
        self.address = address
        self._ctx = ctx
        self._sock = self._connect()
        self._encoder = msgspec.msgpack.Encoder()

    def _connect(self) -> zmq.asyncio.Socket:
        keys = security.keys_for(self.address)
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, _HWM)
        sock.setsockopt(zmq.LINGER, 1000)
        if keys is not None:
            security.secure_client(sock, keys)
        sock.connect(self.address)
        return sock

    def reconnect(self) -> None:
        """The peer's process was replaced: drop what is still queued for the dead one
        and connect afresh, so that only what is sent from now on reaches the new one."""
        self._sock.close(linger=0)
        self._sock = self._connect()

    async def send(self, msg: msgspec.Struct) -> None:
        """Queue ``msg`` for the peer (never blocks: the queue is unbounded)."""
        await self._sock.send(self._encoder.encode(msg))

    def close(self) -> None:
        self._sock.close()
