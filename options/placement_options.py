"""Actor placement options: the "actor placement" group of ``houchu serve``'s flags."""

from __future__ import annotations

from typing import Literal

import msgspec


class PlacementOptions(msgspec.Struct, frozen=True, kw_only=True):
    """Where the actors' sockets live (``houchu.actors.placement``); each field is the
    ``houchu serve`` flag of its name.

    Attributes:
        actor_transport: "ipc" (sockets in a private run directory) or "tcp" (ports on
            ``actor_host``, with ZeroMQ CURVE keys generated at start-up).
        actor_host: address of the tcp actor sockets.
    """

    actor_transport: Literal["ipc", "tcp"] = "ipc"
    actor_host: str = "127.0.0.1"
