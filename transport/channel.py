"""Typed asyncio ZeroMQ channels: one PULL inbox per actor, PUSH outboxes to peers.

An ``Inbox`` is generic in the union of messages its actor accepts; the msgspec decoder is
built once, so a malformed or unexpected message is rejected at the boundary
(``BadMessage``) instead of reaching actor code. An ``Outbox`` encodes with msgpack.
No pickle anywhere.
"""

from __future__ import annotations

from typing import Any, Generic, TypeVar

import msgspec
import zmq
import zmq.asyncio

T = TypeVar("T")

_HWM = 0  # unbounded queues: nothing accepted is dropped silently


class BadMessage(Exception):
    """A frame that does not decode to any message the inbox accepts."""


class Inbox(Generic[T]):
    """The receiving end of an actor: binds a PULL socket at ``address``.

    Args:
        ctx: the asyncio ZeroMQ context of this process.
        address: ``ipc://PATH``, ``inproc://NAME`` or ``tcp://HOST:PORT``.
        accepts: the message type or union of types this inbox decodes.
    """

    def __init__(self, ctx: zmq.asyncio.Context, address: str, accepts: Any) -> None:
        self.address = address
        self._sock = ctx.socket(zmq.PULL)
        self._sock.setsockopt(zmq.RCVHWM, _HWM)
        self._sock.setsockopt(zmq.LINGER, 0)
        self._sock.bind(address)
        self._decoder = msgspec.msgpack.Decoder(accepts)

    async def recv(self) -> T:
        """Wait for the next message. Raises BadMessage for an undecodable frame."""
        frame = await self._sock.recv()
        try:
            return self._decoder.decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise BadMessage(f"{self.address}: {e}") from e

    def recv_nowait(self) -> T | None:
        """Return the next message if one is queued, else None."""
        try:
            frame = self._sock.recv(flags=zmq.NOBLOCK)
            if hasattr(frame, "result"):  # zmq.asyncio returns a done Future
                frame = frame.result()
        except zmq.Again:
            return None
        try:
            return self._decoder.decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise BadMessage(f"{self.address}: {e}") from e

    async def poll(self, timeout_s: float) -> bool:
        """True when a message is ready within ``timeout_s`` seconds."""
        return bool(await self._sock.poll(int(timeout_s * 1000), zmq.POLLIN))

    def close(self) -> None:
        self._sock.close(linger=0)


class Outbox:
    """The sending end towards one peer: a PUSH socket connected to its inbox address."""

    def __init__(self, ctx: zmq.asyncio.Context, address: str) -> None:
        self.address = address
        self._ctx = ctx
        self._sock = self._connect()
        self._encoder = msgspec.msgpack.Encoder()

    def _connect(self) -> zmq.asyncio.Socket:
        sock = self._ctx.socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, _HWM)
        sock.setsockopt(zmq.LINGER, 1000)
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
