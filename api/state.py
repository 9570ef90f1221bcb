"""The gateway's shared state: the engine handle, served-model facts, the runner's
limits, in-flight count.

The handlers of every API module reach these through typed ``web.AppKey``s, so the same
code runs against the real ``EngineClient`` and against a fake engine in tests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from aiohttp import web

from houchu.api.errors import ApiError
from houchu.api.limits import Admission, GatewayLimits
from houchu.transport.failures import UNAVAILABLE
from houchu.transport.limits import LimitsWatch, RunnerLimits
from houchu.transport.messages import GenerateRequest, TextDelta

log = logging.getLogger(__name__)

#: Longest wait of a request for the runner's limits (its first ``RunnerInfo``, while the
#: model loads) before it is answered 503, seconds.
RUNNER_WAIT_S = 120.0
#: The same wait of an information route (``/v1/models``, ``/model_info``,
#: ``/server_info``): routers poll them with short timeouts while a replica loads, and a
#: prompt 503 takes the replica out of rotation instead of holding the poller, seconds.
INFO_WAIT_S = 1.0


class EngineLike(Protocol):
    """What the gateway needs from the engine (``EngineClient`` implements it).

    ``generate`` yields a request's deltas, the last with ``finish_reason`` set, and raises
    ``EngineError`` when the engine rejects or fails the request; closing the iterator
    early aborts the request. ``stats`` returns the scheduler's counters or raises
    ``EngineError`` (503) when the engine does not answer.
    """

    def generate(
        self, req: GenerateRequest, record: Mapping[str, float | int | str] | None = None
    ) -> AsyncIterator[TextDelta]:
        """Submit ``req`` and stream its text deltas; ``record``: its client request's
        parameters for the dashboard (None: those ``req`` carries)."""
        ...

    async def abort(self, rid: str) -> None:
        """Abort the request ``rid``."""
        ...

    async def stats(self) -> Mapping[str, float | int | str]:
        """The engine's counters."""
        ...


@dataclass
class GatewayState:
    """Facts about the served model and the gateway's own counters.

    Attributes:
        model_name: the model id clients must use (or omit).
        runner: the runner's limits (``max_context``: tokens per request, prompt +
            completion), known once its ``RunnerInfo`` arrived.
        created: unix seconds when the app was built (the model's ``created``).
        limits: the gateway's limits (admission, body size, slow readers, API key).
        admission: the count of accepted, unfinished requests (``in_flight``).
        engine_ready_once: ``/health`` has seen the engine ready (before that, an engine
            that does not answer is still starting).
        tool_call_parser: the ``--tool-call-parser`` (``houchu.text.tool_calls.parse``).
    """

    model_name: str
    runner: LimitsWatch
    created: int
    limits: GatewayLimits = field(default_factory=GatewayLimits)
    admission: Admission = field(init=False)
    engine_ready_once: bool = False
    tool_call_parser: str = "hermes"

    def __post_init__(self) -> None:
        self.admission = Admission(self.limits.max_in_flight)

    async def runner_limits(self, wait_s: float = RUNNER_WAIT_S) -> RunnerLimits:
        """The runner's limits; waits up to ``wait_s`` seconds for them while the model
        loads.

        Raises:
            ApiError: (503) they are still unknown after ``wait_s`` seconds.
        """
        try:
            return await self.runner.wait(wait_s)
        except asyncio.TimeoutError:
            raise ApiError(
                "the model runner is not ready yet; retry", status=503, code=UNAVAILABLE
            ) from None

    @property
    def in_flight(self) -> int:
        """Requests this gateway has accepted and not yet finished."""
        return self.admission.in_flight


ENGINE_KEY: web.AppKey[EngineLike] = web.AppKey("houchu_engine", EngineLike)
STATE_KEY: web.AppKey[GatewayState] = web.AppKey("houchu_gateway_state", GatewayState)


async def close_quietly(it: AsyncIterator[TextDelta]) -> None:
    """Close a delta iterator, which aborts its request if it has not finished.

    Closing an iterator that already finished (or never started) does nothing.
    """
    aclose = getattr(it, "aclose", None)
    if aclose is None:
        return
    try:
        await aclose()
    except Exception:  # the request is over for us either way
        log.warning("closing a generate iterator failed", exc_info=True)


@contextlib.asynccontextmanager
async def open_generation(
    app: web.Application, req: GenerateRequest
) -> AsyncIterator[AsyncIterator[TextDelta]]:
    """Start ``req`` on the engine; on exit close its iterator.

    The caller holds an admission slot (``GatewayState.admission``) around this block.
    Leaving the block early (client gone, handler cancelled, error) closes the iterator,
    so the engine aborts the request.
    """
    it = app[ENGINE_KEY].generate(req)
    try:
        yield it
    finally:
        await close_quietly(it)
