"""Typed asyncio ZeroMQ channels: one PULL inbox per actor, PUSH outboxes to peers.

An ``Inbox`` is generic in the union of messages its actor accepts; the msgspec decoder is
built once, so a malformed or unexpected message is rejected at the boundary
(``BadMessage``) instead of reaching actor code. An ``Outbox`` encodes with msgpack.
No pickle anywhere.

Every generated token crosses four of these links (runner -> scheduler -> tokenizer ->
gateway, and the next plan back to the runner), so they take the short way: an inbox
watches its socket's file descriptor with the event loop once (``add_reader``) and
receives without blocking, an outbox sends without blocking (its queue is unbounded),
instead of pyzmq's asyncio futures and pollers per message, which took about twice the
CPU and the latency per hop (``houchu.api.token_path``).

A frame longer than ``MAX_MESSAGE_BYTES`` never reaches the inbox: ZeroMQ
(``maxmsgsize``) drops the connection of the peer that sent it, before reading it into
memory. tcp:// sockets are CURVE-authenticated (``houchu.transport.security``).
"""

from __future__ import annotations

import asyncio
from typing import Any, Generic, TypeVar

import msgspec
import zmq
import zmq.asyncio

from houchu.transport import security

T = TypeVar("T")
S = TypeVar("S", bound=zmq.Socket)

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
        # the same socket without pyzmq's asyncio layer: received from without blocking,
        # its file descriptor watched by the event loop (``_watch``)
        self._raw: zmq.Socket[bytes] = zmq.Socket.shadow(self._sock.underlying)
        self._loop: asyncio.AbstractEventLoop | None = None
        self._waiters: list[asyncio.Future[bool]] = []

    def _decode(self, frame: bytes) -> T:
        try:
            return self._decoder.decode(frame)
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            raise BadMessage(f"{self.address}: {e} ({len(frame)} bytes)") from e
        except RecursionError:  # msgpack nested deeper than the interpreter allows
            raise BadMessage(f"{self.address}: frame nested too deeply") from None

    def _watch(self) -> asyncio.AbstractEventLoop:
        """Have the running event loop watch the socket (once per loop): ZeroMQ signals
        on its file descriptor that its events may have changed (``_on_signal``)."""
        loop = asyncio.get_running_loop()
        if self._loop is not loop:
            if self._loop is not None and not self._loop.is_closed():
                self._loop.remove_reader(self._raw.FD)
            self._loop = loop
            loop.add_reader(self._raw.FD, self._on_signal)
        return loop

    def _on_signal(self) -> None:
        """The descriptor signalled: reading the events resets it (so the loop does not
        call again for the same signal); wake the waiters if a frame is queued."""
        if self._raw.closed:
            return
        if _has_frame(self._raw):
            waiters, self._waiters = self._waiters, []
            for w in waiters:
                if not w.done():
                    w.set_result(True)

    def _queued(self) -> bool:
        """A frame is queued now."""
        return _has_frame(self._raw)

    async def _wait(self, timeout_s: float | None) -> bool:
        """Until a frame is queued (True) or ``timeout_s`` seconds passed (False)."""
        loop = self._watch()
        if self._queued():
            return True
        if timeout_s is not None and timeout_s <= 0:
            return False
        waiter = loop.create_future()
        self._waiters.append(waiter)
        timer = None
        if timeout_s is not None:
            timer = loop.call_later(timeout_s, _resolve, waiter, False)
        try:
            return await waiter
        finally:
            if timer is not None:
                timer.cancel()
            if waiter in self._waiters:
                self._waiters.remove(waiter)

    def _frame_nowait(self) -> bytes | None:
        try:
            return self._raw.recv(zmq.NOBLOCK)
        except zmq.Again:
            return None

    async def recv(self) -> T:
        """Wait for the next message. Raises BadMessage for an undecodable frame."""
        while True:
            frame = self._frame_nowait()
            if frame is not None:
                return self._decode(frame)
            await self._wait(None)

    def recv_nowait(self) -> T | None:
        """Return the next message if one is queued, else None."""
        frame = self._frame_nowait()
        return None if frame is None else self._decode(frame)

    async def poll(self, timeout_s: float) -> bool:
        """True when a message is ready within ``timeout_s`` seconds."""
        return await self._wait(max(timeout_s, 0.0))

    def close(self) -> None:
        if self._loop is not None and not self._raw.closed and not self._loop.is_closed():
            self._loop.remove_reader(self._raw.FD)
        if not self._sock.closed and self._curve:
            security.release_server(self._ctx)
        self._sock.close(linger=0)


def _resolve(waiter: asyncio.Future[bool], value: bool) -> None:
    if not waiter.done():
        waiter.set_result(value)


def _has_frame(sock: zmq.Socket[bytes]) -> bool:
    """A frame is queued on ``sock`` to read now (its ``EVENTS``, an int option, has
    ``POLLIN``; pyzmq types every option as int or bytes)."""
    events = sock.getsockopt(zmq.EVENTS)
    return isinstance(events, int) and bool(events & zmq.POLLIN)


def push_socket(ctx: zmq.Context[S], address: str) -> S:
    """A PUSH socket on ``ctx`` (asyncio or plain) connected to the inbox at ``address``:
    the links' high-water mark, 1 s linger, CURVE where ``address`` is tcp://.

    Raises:
        security.InsecureTransport: ``address`` is tcp:// and no CURVE keys are registered.
    """
    keys = security.keys_for(address)
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.SNDHWM, _HWM)
    sock.setsockopt(zmq.LINGER, 1000)
    if keys is not None:
        security.secure_client(sock, keys)
    sock.connect(address)
    return sock


class Outbox:
    """The sending end towards one peer: a PUSH socket connected to its inbox address.

    Raises:
        security.InsecureTransport: ``address`` is tcp:// and no CURVE keys are registered.
    """

    def __init__(self, ctx: zmq.asyncio.Context, address: str) -> None:
        self.address = address
        self._ctx = ctx
        self._sock = self._connect()
        self._raw: zmq.Socket[bytes] = zmq.Socket.shadow(self._sock.underlying)
        self._encoder = msgspec.msgpack.Encoder()

    def _connect(self) -> zmq.asyncio.Socket:
        return push_socket(self._ctx, self.address)

    def reconnect(self) -> None:
        """The peer's process was replaced: drop what is still queued for the dead one
        and connect afresh, so that only what is sent from now on reaches the new one."""
        self._sock.close(linger=0)
        self._sock = self._connect()
        self._raw = zmq.Socket.shadow(self._sock.underlying)

    async def send(self, msg: msgspec.Struct) -> None:
        """Queue ``msg`` for the peer (never blocks: the queue is unbounded; should
        ZeroMQ refuse it at once all the same, it is sent the asyncio way)."""
        frame = self._encoder.encode(msg)
        try:
            self._raw.send(frame, zmq.NOBLOCK)
        except zmq.Again:
            await self._sock.send(frame)

    def close(self) -> None:
        self._sock.close()


class ThreadOutbox:
    """A sending end towards one peer for a thread without an event loop (the model
    runner's torch thread sends each step's result itself, without handing it to the
    loop first): a plain PUSH socket on the process's context, connected to the peer's
    inbox. Its queue is unbounded, so ``send`` never blocks. Use it from one thread at
    a time; ``reconnect`` only while no send can run.

    Raises:
        security.InsecureTransport: ``address`` is tcp:// and no CURVE keys are registered.
    """

    def __init__(self, ctx: zmq.asyncio.Context, address: str) -> None:
        self.address = address
        self._ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context.shadow(ctx.underlying)
        self._sock = self._connect()
        self._encoder = msgspec.msgpack.Encoder()

    def _connect(self) -> zmq.Socket:
        return push_socket(self._ctx, self.address)

    def reconnect(self) -> None:
        """As ``Outbox.reconnect``."""
        self._sock.close(linger=0)
        self._sock = self._connect()

    def send(self, msg: msgspec.Struct) -> None:
        """Queue ``msg`` for the peer."""
        self._sock.send(self._encoder.encode(msg))

    def close(self) -> None:
        self._sock.close()
