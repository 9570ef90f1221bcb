"""ZeroMQ CURVE for actors placed on tcp:// addresses.

By default every actor inbox is an ``ipc://`` socket in a private run directory (mode
0700), so only the user who started ``houchu serve`` can connect. An inbox on ``tcp://``
is reachable from the network; there CURVE is mandatory:

- ``CurveKeys.generate()`` makes two key pairs per run (``zmq.curve_keypair``): the
  server pair every inbox uses, and the client pair every outbox uses. They travel to the
  actor processes inside the serving configuration (``Endpoints.curve``).
- An inbox sets ``curve_server`` with the server secret key, and a ZAP handler (pyzmq's
  ``AsyncioAuthenticator``, one per ZeroMQ context) admits only the run's client public
  key. An outbox sets the server's public key and the client pair.

So a peer without the keys cannot complete the handshake: a plain (non-CURVE) socket and
a CURVE socket with another key pair are both refused, and their frames never reach the
actor. ``Endpoints`` registers its keys here (``register``) when it is built or decoded,
so ``Inbox`` / ``Outbox`` find the keys of a tcp:// address without extra arguments; a
tcp:// address with no keys registered raises ``InsecureTransport``.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import weakref
from collections.abc import Iterable

import msgspec
import zmq
import zmq.asyncio
from zmq.auth.asyncio import AsyncioAuthenticator

log = logging.getLogger(__name__)


#: The ZAP domain of houchu's inboxes (the authenticator admits clients in it).
ZAP_DOMAIN = "houchu"


class InsecureTransport(RuntimeError):
    """A tcp:// socket was asked for without CURVE keys."""


class CurveKeys(msgspec.Struct, frozen=True):
    """The CURVE key pairs of one run, as Z85 text (40 characters each).

    ``server_*``: the key pair of every inbox (CURVE server). ``client_*``: the key pair of
    every outbox (CURVE client); inboxes accept only ``client_public``.
    """

    server_public: str
    server_secret: str
    client_public: str
    client_secret: str

    @classmethod
    def generate(cls) -> CurveKeys:
        """Fresh key pairs (``zmq.curve_keypair``). Raises InsecureTransport when libzmq
        was built without CURVE."""
        if not zmq.has("curve"):
            raise InsecureTransport("this libzmq has no CURVE support; tcp:// cannot be used")
        sp, ss = zmq.curve_keypair()
        cp, cs = zmq.curve_keypair()
        return cls(sp.decode(), ss.decode(), cp.decode(), cs.decode())


def is_tcp(address: str) -> bool:
    """Whether ``address`` is a tcp:// endpoint (which needs CURVE)."""
    return address.startswith("tcp://")


_KEYS: dict[str, CurveKeys] = {}


def register(addresses: Iterable[str], keys: CurveKeys | None) -> None:
    """Remember ``keys`` for the tcp:// ones among ``addresses`` (this process only)."""
    if keys is None:
        return
    for a in addresses:
        if is_tcp(a):
            _KEYS[a] = keys


def keys_for(address: str) -> CurveKeys | None:
    """The CURVE keys registered for ``address``, if any.

    Raises:
        InsecureTransport: ``address`` is tcp:// and no keys were registered for it.
    """
    if not is_tcp(address):
        return None
    keys = _KEYS.get(address)
    if keys is None:
        raise InsecureTransport(
            f"{address}: tcp:// actor sockets need ZeroMQ CURVE keys (Endpoints.curve)"
        )
    return keys


class _ClientKey:
    """ZAP credentials provider: admits exactly one client public key."""

    def __init__(self, public: str) -> None:
        self._public = public.encode()

    def callback(self, domain: str, key: bytes) -> bool:
        ok = hmac.compare_digest(key, self._public)
        if not ok:
            log.warning("refused a CURVE client with an unknown public key")
        return ok


class _Auth:
    """One ZAP handler per ZeroMQ context, alive while any CURVE inbox uses it."""

    def __init__(self, ctx: zmq.Context, keys: CurveKeys) -> None:
        self.auth = AsyncioAuthenticator(ctx)
        self.auth.start()
        self.auth.configure_curve_callback(ZAP_DOMAIN, _ClientKey(keys.client_public))
        self.users = 0


_AUTHS: weakref.WeakKeyDictionary[zmq.Context, _Auth] = weakref.WeakKeyDictionary()


def secure_server(ctx: zmq.asyncio.Context, sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make ``sock`` (not yet bound) a CURVE server that admits only the run's client.

    Must be called from a running event loop (the ZAP handler is an asyncio task).
    """
    asyncio.get_running_loop()  # RuntimeError here, not a silent unauthenticated socket
    auth = _AUTHS.get(ctx)
    if auth is None:
        auth = _AUTHS[ctx] = _Auth(ctx, keys)
    auth.users += 1
    sock.curve_secretkey = keys.server_secret.encode()
    sock.curve_publickey = keys.server_public.encode()
    sock.curve_server = True
    sock.zap_domain = ZAP_DOMAIN.encode()


def release_server(ctx: zmq.asyncio.Context) -> None:
    """A CURVE inbox of ``ctx`` closed; stop its ZAP handler after the last one."""
    auth = _AUTHS.get(ctx)
    if auth is None:
        return
    auth.users -= 1
    if auth.users <= 0:
        del _AUTHS[ctx]
        auth.auth.stop()


def secure_client(sock: zmq.Socket, keys: CurveKeys) -> None:
    """Make ``sock`` (not yet connected) a CURVE client of the run's inboxes."""
    sock.curve_serverkey = keys.server_public.encode()
    sock.curve_publickey = keys.client_public.encode()
    sock.curve_secretkey = keys.client_secret.encode()
