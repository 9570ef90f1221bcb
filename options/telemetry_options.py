"""Telemetry options: the "telemetry" group of ``houchu serve``'s flags."""

from __future__ import annotations

from typing import Annotated

import msgspec
from msgspec import Meta


class TelemetryOptions(msgspec.Struct, frozen=True, kw_only=True):
    """The recorder (``houchu.actors.recorder``) and the dashboard's database; each field
    is the ``houchu serve`` flag of its name.

    Attributes:
        disable_telemetry: no recorder: no lifecycle events, step records or lever
            samples are stored.
        db_url: SQLAlchemy URL of the telemetry and benchmark database (None: SQLite at
            ``houchu.paths.cache_dir()/houchu.db``).
        retention_requests: the newest this many requests are kept (0: all).
        retention_days: telemetry older than this many days is pruned (0: none is).
    """

    disable_telemetry: bool = False
    db_url: str | None = None
    retention_requests: Annotated[int, Meta(ge=0)] = 10_000
    retention_days: Annotated[float, Meta(ge=0)] = 7.0

    @property
    def enabled(self) -> bool:
        """Whether the recorder runs and the actors send it telemetry."""
        return not self.disable_telemetry
