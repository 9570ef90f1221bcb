"""Where the actors' inboxes live: ipc:// in a private run directory, or tcp:// with CURVE.

``place_actors(config, run_dir)`` is what the launcher calls once per run: it returns the
configuration with its ``launch.endpoints`` filled in for ``--actor-transport``:

- ``"ipc"`` (the default): ``ipc://RUN_DIR/NAME.sock``; ``RUN_DIR`` must be a directory
  only its owner can enter (mode 0700, as ``tempfile.mkdtemp`` makes it), so no other
  user can connect to an actor.
- ``"tcp"``: ``tcp://ACTOR_HOST:PORT`` on free ports, with a fresh pair of ZeroMQ CURVE
  key pairs (``houchu.transport.security``) that travel to the actors in the
  configuration; a peer without them cannot talk to any actor.
"""

from __future__ import annotations

import os
import socket
import stat
from pathlib import Path

from houchu.options.serve_config import ServeConfig
from houchu.transport.endpoints import ACTORS, Endpoints
from houchu.transport.security import CurveKeys

TRANSPORTS = ("ipc", "tcp")


class PlacementError(RuntimeError):
    """The run directory is not private, or the transport is unknown."""


def check_private_dir(path: Path) -> None:
    """Raise PlacementError unless ``path`` is a directory owned by this user with no
    access for group or others (mode 0700 or stricter)."""
    st = path.stat()
    if not stat.S_ISDIR(st.st_mode):
        raise PlacementError(f"{path} is not a directory")
    if st.st_uid != os.getuid():
        raise PlacementError(f"{path} belongs to uid {st.st_uid}, not to this user")
    if st.st_mode & 0o077:
        raise PlacementError(
            f"{path} has mode {stat.S_IMODE(st.st_mode):o}; actor sockets need 0700"
        )


def check_placement(config: ServeConfig) -> None:
    """Raise PlacementError unless the endpoints are of ``--actor-transport`` (so a
    launcher that did not place the actors fails loudly instead of ignoring the option)."""
    transport = config.placement.actor_transport
    want = {"ipc": ("ipc://", "inproc://"), "tcp": ("tcp://",)}.get(transport)
    if want is None:
        raise PlacementError(f"unknown actor transport {transport!r}")
    wrong = [a for a in config.endpoints.addresses.values() if not a.startswith(want)]
    if wrong:
        raise PlacementError(
            f"--actor-transport {transport} but the actors were placed at "
            f"{wrong[0]} (the launcher must place them with place_actors)"
        )


def free_ports(host: str, n: int) -> list[int]:
    """``n`` distinct TCP ports free on ``host`` right now (the OS picks them)."""
    socks = []
    try:
        for _ in range(n):
            s = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
            s.bind((host, 0))
            socks.append(s)
        return [s.getsockname()[1] for s in socks]
    finally:
        for s in socks:
            s.close()


def check_port_free(host: str, port: int) -> None:
    """Raise PlacementError when the HTTP port ``port`` on ``host`` cannot be bound
    (another program listens there, or ``host`` is not an address of this machine).

    Binds with ``SO_REUSEADDR``, as the gateway's server does, so a port left in
    TIME_WAIT by a server that just stopped counts as free. Port 0 (any) is not checked.
    Checked before any actor starts, so the error comes in a moment, not after the model
    has loaded.
    """
    if port == 0:
        return
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    try:
        infos = socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise PlacementError(f"cannot listen on {host}:{port}: {e.strerror}") from e
    for fam, kind, proto, _, address in infos:
        with socket.socket(fam, kind, proto) as s:
            s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind(address)
            except OSError as e:
                hint = " (another server? choose another --port)" if e.errno == 98 else ""
                raise PlacementError(f"cannot listen on {host}:{port}: {e.strerror}{hint}") from e


def place_actors(config: ServeConfig, run_dir: Path) -> ServeConfig:
    """``config`` with endpoints for its ``--actor-transport`` (``config.launch``).

    Args:
        config: the serving configuration.
        run_dir: the run's private directory (checked to be 0700 for ipc://).

    Raises:
        PlacementError: unknown transport, or ``run_dir`` is not private.
        houchu.transport.security.InsecureTransport: tcp without CURVE support in libzmq.
    """
    p = config.placement
    if p.actor_transport == "ipc":
        check_private_dir(run_dir)
        endpoints = Endpoints.ipc(run_dir)
    elif p.actor_transport == "tcp":
        keys = CurveKeys.generate()
        ports = dict(zip(ACTORS, free_ports(p.actor_host, len(ACTORS)), strict=True))
        endpoints = Endpoints.tcp(p.actor_host, ports, keys)
    else:
        raise PlacementError(
            f"unknown actor transport {p.actor_transport!r}; expected one of {TRANSPORTS}"
        )
    return config.with_launch(endpoints=endpoints)
