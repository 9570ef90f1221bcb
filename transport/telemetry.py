"""Telemetry: lifecycle events, step records and lever samples, on their way to the recorder.

Every actor owns one ``Telemetry`` emitter. Emitting appends to a local buffer (no I/O,
no await); a background task flushes the buffer as one ``TelemetryBatch`` every
``flush_interval_s`` seconds. Telemetry must never slow or block serving: the buffer is
bounded, and records beyond it are dropped and counted (``num_dropped``, reported in the
next batch so the recorder can account for them).
"""

from __future__ import annotations

import asyncio
import contextlib
import time

import msgspec
import zmq
import zmq.asyncio
from msgspec import Struct, field

from houchu.transport.levers import Lever, Unit, Verb, check_sample_names

# Lifecycle event kinds, in the order a request meets them.
EVENT_KINDS = (
    "arrived",  # gateway accepted the request
    "tokenized",  # tokenizer encoded the prompt (data: prompt_tokens)
    "queued",  # scheduler queued it
    "prefix_matched",  # scheduler matched a cached prefix (data: cached_tokens, tier)
    "scheduled",  # first admitted into the running batch
    "prefill_chunk",  # one prefill chunk computed (data: start, tokens)
    "first_token",  # first output token sampled
    "decode",  # decode progress (data: tokens so far); sampled, not every token
    "preempted",  # KV freed under memory pressure, to be recomputed
    "resumed",  # re-admitted after preemption
    "finished",  # data: finish_reason, completion_tokens
    "aborted",  # client went away
    "failed",  # data: error
)


class LifecycleEvent(Struct, array_like=True):
    """One moment of one request's life. ``t``: wall-clock seconds (time.time())."""

    rid: str
    kind: str
    t: float
    actor: str
    data: dict[str, float | int | str] = field(default_factory=dict)


class StepRecord(Struct, array_like=True):
    """One forward pass. ``t``: start, wall-clock seconds; ``duration_s``: seconds.

    ``num_prefill_tokens`` + ``num_decode_tokens`` tokens computed for ``batch_size``
    requests; ``phase`` is "prefill", "decode" or "mixed". ``expert_load``: for a MoE
    model, the tokens routed to each expert of each MoE layer in this step
    (list[list[int]], ``[layers][experts]``; ``houchu.model.expert_load``), else empty.
    ``allreduce_s``: for a tensor-parallel runner, the seconds rank 0 spent inside this
    step's collectives (the all-reduces and the logits' all-gather, waiting for the
    slowest rank included; ``houchu.runner.tensor_parallel.group.TPGroup``), else None.
    """

    step_id: int
    t: float
    duration_s: float
    batch_size: int
    num_prefill_tokens: int
    num_decode_tokens: int
    phase: str
    expert_load: list[list[int]] = field(default_factory=list)
    allreduce_s: float | None = None


class LeverSample(Struct, array_like=True):
    """What one lever saved and what it spent, in physical units, at time ``t``.

    ``lever``: a catalog lever (``houchu.transport.levers.Lever``); ``verb``: one of the
    verbs the catalog gives it; ``saved`` in ``saved_unit``, ``spent`` in ``spent_unit``
    (``Unit.NONE`` where no counter measures the cost); ``rid`` when the sample belongs to
    one request, else None (an engine-wide sample). Names given as strings become the
    enums; an unknown lever or verb, or a verb the lever does not report under, raises
    ``ValueError`` (``msgspec.ValidationError`` at decode).
    """

    lever: Lever
    verb: Verb
    saved: float
    saved_unit: Unit
    spent: float
    spent_unit: Unit
    t: float
    rid: str | None = None

    def __post_init__(self) -> None:
        self.lever, self.verb = check_sample_names(self.lever, self.verb)
        self.saved_unit, self.spent_unit = Unit(self.saved_unit), Unit(self.spent_unit)


class TelemetryBatch(Struct, tag=True, kw_only=True):
    """What one actor sends to the recorder at each flush."""

    actor: str
    events: list[LifecycleEvent] = field(default_factory=list)
    steps: list[StepRecord] = field(default_factory=list)
    levers: list[LeverSample] = field(default_factory=list)
    num_dropped: int = 0


class Telemetry:
    """An actor's buffered, non-blocking telemetry emitter.

    Args:
        ctx: the process's asyncio ZeroMQ context.
        address: the recorder's inbox address, or None to disable telemetry.
        actor: this actor's name.
        max_buffered: records kept between flushes; more are dropped and counted.
        flush_interval_s: seconds between flushes.
    """

    def __init__(
        self,
        ctx: zmq.asyncio.Context,
        address: str | None,
        actor: str,
        max_buffered: int = 20_000,
        flush_interval_s: float = 0.25,
    ) -> None:
        self.actor = actor
        self.enabled = address is not None
        self.address = address
        self._ctx = ctx
        self._sock = self._connect() if address is not None else None
        self._max = max_buffered
        self._interval = flush_interval_s
        self._encoder = msgspec.msgpack.Encoder()
        self._batch = TelemetryBatch(actor=actor)
        self._size = 0
        self.num_dropped = 0
        self._task: asyncio.Task[None] | None = None

    def _connect(self) -> zmq.Socket[bytes]:
        # A plain (non-asyncio) socket on the same context: a NOBLOCK send either
        # queues at once or raises zmq.Again, never awaits.
        assert self.address is not None  # only enabled telemetry connects
        sock: zmq.Socket[bytes] = zmq.Context.shadow(self._ctx.underlying).socket(zmq.PUSH)
        sock.setsockopt(zmq.SNDHWM, 1000)  # the recorder is behind: drop, don't block
        sock.setsockopt(zmq.LINGER, 0)
        sock.connect(self.address)
        return sock

    def reconnect(self) -> None:
        """The recorder was replaced: drop what was queued for the dead one and connect
        afresh to the same address."""
        if self._sock is not None:
            self._sock.close(linger=0)
            self._sock = self._connect()

    def start(self) -> None:
        """Start the periodic flush (call from the running event loop)."""
        if self.enabled and self._task is None:
            self._task = asyncio.create_task(self._flush_loop())

    def _room(self) -> bool:
        if not self.enabled:
            return False
        if self._size >= self._max:
            self.num_dropped += 1
            self._batch.num_dropped += 1
            return False
        self._size += 1
        return True

    def event(self, rid: str, kind: str, t: float | None = None, **data: float | int | str) -> None:
        """Record a lifecycle event of request ``rid`` (kinds: ``EVENT_KINDS``)."""
        if self._room():
            self._batch.events.append(LifecycleEvent(rid, kind, t or time.time(), self.actor, data))

    def step(self, record: StepRecord) -> None:
        """Record one forward pass."""
        if self._room():
            self._batch.steps.append(record)

    def lever(self, sample: LeverSample) -> None:
        """Record what a lever saved and spent."""
        if self._room():
            self._batch.levers.append(sample)

    def flush(self) -> None:
        """Send what is buffered now; drops the batch (counted) if the recorder is behind."""
        if self._sock is None or (self._size == 0 and self._batch.num_dropped == 0):
            return  # disabled (no socket), or nothing to send
        batch, self._batch, self._size = self._batch, TelemetryBatch(actor=self.actor), 0
        try:
            self._sock.send(self._encoder.encode(batch), flags=zmq.NOBLOCK)
        except zmq.Again:
            n = len(batch.events) + len(batch.steps) + len(batch.levers)
            self.num_dropped += n
            self._batch.num_dropped += batch.num_dropped + n

    async def _flush_loop(self) -> None:
        while True:
            await asyncio.sleep(self._interval)
            self.flush()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        self.flush()
        if self._sock is not None:
            self._sock.close(linger=200)
