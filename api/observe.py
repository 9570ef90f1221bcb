"""What the gateway sees of each request: the "arrived" event, and client-side metrics.

``EngineClient.generate`` calls ``arrived`` when a request is submitted, ``delta`` for
each delta, and ``ended`` once when it is over. Everything here is in-memory and cheap
(no I/O, no await): telemetry is buffered by ``Telemetry``, metrics are counters.
"""

from __future__ import annotations

import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from houchu.api.requests.record_params import PRIVATE_KEYS, Value, choice_record, shape_record
from houchu.transport.messages import GenerateRequest, TextDelta

if TYPE_CHECKING:  # no import cycle: metrics -> errors -> engine_client -> observe
    from houchu.api.metrics import GatewayMetrics
    from houchu.transport.telemetry import Telemetry

#: Characters of the prompt kept as the request's label on the dashboard.
PREVIEW_CHARS = 80


def request_params(req: GenerateRequest) -> dict[str, Value]:
    """The request's parameters and shape as its wire request carries them, as flat
    event data (``houchu.api.requests.record_params``); a choice of a several-choice request
    also names its ``parent``, ``choice`` index and ``choices`` count."""
    return {**shape_record(req.messages, req.sampling), **choice_record(req)}


def arrived_params(
    req: GenerateRequest, record: Mapping[str, Value] | None, private: bool = True
) -> dict[str, Value]:
    """What the "arrived" event of ``req`` records: the client request's own parameters
    ``record`` (``ParsedRequest.record``: ``n``, ``best_of``, tools, and the logprobs and
    echo every choice does not carry) when given, else ``request_params(req)``; either way
    the choice's own ``seed`` and its link to its ``parent``. ``private``: keep
    ``PRIVATE_KEYS`` (tool names)."""
    if record is None:
        out = request_params(req)
    else:
        out = {**record, **choice_record(req)}
        if req.sampling.seed is not None:  # choice i samples with seed + i
            out["seed"] = req.sampling.seed
    if not private:
        for key in PRIVATE_KEYS:
            out.pop(key, None)
    return out


def preview(req: GenerateRequest) -> str:
    """A short, one-line label of the request's prompt."""
    if req.messages:
        text = req.messages[-1].content
    elif req.prompt is not None:
        text = req.prompt
    elif req.prompt_ids is not None:
        text = f"<{len(req.prompt_ids)} token ids>"
    else:
        text = ""
    text = " ".join(text.split())
    return text if len(text) <= PREVIEW_CHARS else text[: PREVIEW_CHARS - 1] + "…"


@dataclass
class _Flight:
    arrived: float  # time.monotonic()
    first: float | None = None
    last: TextDelta | None = None


class RequestObserver:
    """Reports requests to the recorder (``telemetry``) and to Prometheus (``metrics``).

    Args:
        telemetry: the gateway's emitter, or None.
        metrics: the gateway's metrics, or None.
        record_previews: send the first characters of each prompt (``preview``) and the
            names of its tools (``PRIVATE_KEYS``) for the dashboard; off when an API key
            guards the APIs, since the dashboard stays open without the key.
    """

    def __init__(
        self,
        telemetry: Telemetry | None = None,
        metrics: GatewayMetrics | None = None,
        record_previews: bool = True,
    ) -> None:
        self.telemetry = telemetry
        self.metrics = metrics
        self.record_previews = record_previews
        self._flights: dict[str, _Flight] = {}

    def arrived(self, req: GenerateRequest, record: Mapping[str, Value] | None = None) -> None:
        """``req`` was submitted to the engine; ``record``: its client request's
        parameters (``ParsedRequest.record``), None: read from ``req``."""
        self._flights[req.rid] = _Flight(time.monotonic())
        if self.telemetry is not None:
            t = req.arrival_time or time.time()
            label = preview(req) if self.record_previews else ""
            params = arrived_params(req, record, self.record_previews)
            self.telemetry.event(req.rid, "arrived", t, preview=label, **params)
        if self.metrics is not None:
            self.metrics.in_flight.inc()

    def delta(self, rid: str, delta: TextDelta) -> None:
        """A delta of ``rid`` reached the gateway."""
        f = self._flights.get(rid)
        if f is None:
            return
        if f.first is None and (delta.text or delta.token_ids):
            f.first = time.monotonic()
        f.last = delta

    def ended(self, rid: str, outcome: str) -> None:
        """``rid`` is over: ``outcome`` is "finished", "aborted" or "failed"."""
        f = self._flights.pop(rid, None)
        if f is None or self.metrics is None:
            return
        m = self.metrics
        m.in_flight.dec()
        if outcome != "finished" or f.last is None:
            m.observe_ended(outcome if outcome != "finished" else "aborted")
            return
        now = time.monotonic()
        d = f.last
        m.observe_finished(
            ttft_s=None if f.first is None else f.first - f.arrived,
            e2e_s=now - f.arrived,
            prompt_tokens=d.prompt_tokens,
            completion_tokens=d.completion_tokens,
            cached_tokens=d.cached_tokens,
        )
