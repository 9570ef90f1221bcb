"""Supervision options: the "supervision" group of ``houchu serve``'s flags."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta


class SupervisionOptions(msgspec.Struct, frozen=True, kw_only=True):
    """How the launcher's ``houchu.actors.supervisor.Supervisor`` restarts actors that die
    or hang; each field is the ``houchu serve`` flag of its name.

    Attributes:
        heartbeat_timeout: seconds an actor may go without a heartbeat (or be busy with
            one step) before it is killed and restarted.
        max_restarts: restarts of one actor allowed within ``restart_window`` seconds;
            one more death stops the server (or leaves the recorder, KV-tier manager or
            draft off).
        restart_window: seconds of ``max_restarts``.
    """

    heartbeat_timeout: Annotated[float, Meta(gt=0)] = 120.0
    max_restarts: Annotated[int, Meta(ge=0)] = 5
    restart_window: Annotated[float, Meta(gt=0)] = 60.0
