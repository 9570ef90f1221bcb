"""Where the scheduler's lifecycle events and lever samples go.

The scheduler actor passes its ``transport.telemetry.Telemetry`` emitter; with telemetry
off (and in unit tests) the core keeps a ``NullTelemetry``. Forward passes are not the
scheduler's to report: the runner emits every ``StepRecord``.
"""

from __future__ import annotations

from typing import Protocol

from houchu.transport.telemetry import LeverSample


class TelemetrySink(Protocol):
    """Lifecycle events (kinds: ``transport.telemetry.EVENT_KINDS``) and lever samples.

    ``t``: wall-clock seconds (``time.time()``; None: now).
    """

    def event(
        self, rid: str, kind: str, t: float | None = None, **data: float | int | str
    ) -> None: ...
    def lever(self, sample: LeverSample) -> None: ...


class NullTelemetry:
    """A sink that keeps nothing (telemetry off, and unit tests)."""

    def event(self, rid: str, kind: str, t: float | None = None, **data: float | int | str) -> None:
        """Drop a lifecycle event."""

    def lever(self, sample: LeverSample) -> None:
        """Drop a lever sample."""
