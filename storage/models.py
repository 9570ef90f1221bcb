"""The database schema: SQLAlchemy models of every record the recorder keeps.

Times are wall-clock seconds since the epoch (``time.time()``), durations are seconds,
sizes are tokens unless a column says otherwise. The schema is versioned by Alembic
(``storage/migrations``); a change here needs a new migration there (a unit test checks
that the models and the migrations agree).

Tables:

- ``requests``: one row per request, its summary (kept up to date as events arrive).
- ``events``: lifecycle events (``transport.telemetry.EVENT_KINDS``).
- ``steps``: forward passes, as the runner ran them (one row per step), with a MoE
  model's expert load.
- ``lever_samples``: what a lever saved and spent, per request or engine-wide.
- ``ledger_totals``: all-time sums of lever samples (not pruned by retention).
- ``counters``: the recorder's own counters (records written, dropped).
- ``bench_runs``: benchmark runs stored by the load generator.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import JSON, Float, Index, Integer, String, Text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    """Declarative base of houchu's tables."""


class RequestRow(Base):
    """One request's summary. ``status``: running, finished, aborted or failed."""

    __tablename__ = "requests"

    rid: Mapped[str] = mapped_column(String(128), primary_key=True)
    started_at: Mapped[float] = mapped_column(Float, index=True)  # first event seen
    arrived_at: Mapped[float | None] = mapped_column(Float)
    tokenized_at: Mapped[float | None] = mapped_column(Float)
    queued_at: Mapped[float | None] = mapped_column(Float)
    scheduled_at: Mapped[float | None] = mapped_column(Float)
    first_token_at: Mapped[float | None] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float)
    status: Mapped[str] = mapped_column(String(16), default="running")
    finish_reason: Mapped[str | None] = mapped_column(String(32))
    prompt_tokens: Mapped[int] = mapped_column(Integer, default=0)
    completion_tokens: Mapped[int] = mapped_column(Integer, default=0)
    cached_tokens: Mapped[int] = mapped_column(Integer, default=0)
    num_preemptions: Mapped[int] = mapped_column(Integer, default=0)
    ttft_s: Mapped[float | None] = mapped_column(Float)
    tpot_s: Mapped[float | None] = mapped_column(Float)
    e2e_s: Mapped[float | None] = mapped_column(Float)
    params: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    preview: Mapped[str | None] = mapped_column(String(200))
    error: Mapped[str | None] = mapped_column(Text)


class EventRow(Base):
    """One lifecycle event of one request; ``actor`` is the actor that emitted it."""

    __tablename__ = "events"
    __table_args__ = (Index("ix_events_rid_t", "rid", "t"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    rid: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    t: Mapped[float] = mapped_column(Float, index=True)
    actor: Mapped[str] = mapped_column(String(32))
    data: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)


class StepRow(Base):
    """One forward pass. ``phase``: prefill, decode or mixed; ``duration_s``: seconds;
    ``expert_load``: tokens per expert of each MoE layer (MoE models only);
    ``allreduce_s``: seconds in the step's collectives (tensor-parallel runners only)."""

    __tablename__ = "steps"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    actor: Mapped[str] = mapped_column(String(32))
    step_id: Mapped[int] = mapped_column(Integer)
    t: Mapped[float] = mapped_column(Float, index=True)
    duration_s: Mapped[float] = mapped_column(Float)
    batch_size: Mapped[int] = mapped_column(Integer)
    num_prefill_tokens: Mapped[int] = mapped_column(Integer)
    num_decode_tokens: Mapped[int] = mapped_column(Integer)
    phase: Mapped[str] = mapped_column(String(16))
    #: a MoE model's tokens per expert of each MoE layer, ``[layers][experts]`` (None:
    #: a dense model)
    expert_load: Mapped[list[list[int]] | None] = mapped_column(
        JSON(none_as_null=True), nullable=True
    )
    #: a tensor-parallel runner's seconds in this step's collectives (None: tp 1)
    allreduce_s: Mapped[float | None] = mapped_column(Float, nullable=True)


class LeverRow(Base):
    """What one lever saved and spent at ``t``; ``rid`` is None for engine-wide samples."""

    __tablename__ = "lever_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    lever: Mapped[str] = mapped_column(String(64))
    verb: Mapped[str] = mapped_column(String(32))
    saved: Mapped[float] = mapped_column(Float)
    saved_unit: Mapped[str] = mapped_column(String(32))
    spent: Mapped[float] = mapped_column(Float)
    spent_unit: Mapped[str] = mapped_column(String(32))
    t: Mapped[float] = mapped_column(Float, index=True)
    rid: Mapped[str | None] = mapped_column(String(128), index=True)
    actor: Mapped[str] = mapped_column(String(32))


class LedgerTotalRow(Base):
    """All-time sums of one lever's samples in one pair of units."""

    __tablename__ = "ledger_totals"

    lever: Mapped[str] = mapped_column(String(64), primary_key=True)
    verb: Mapped[str] = mapped_column(String(32), primary_key=True)
    saved_unit: Mapped[str] = mapped_column(String(32), primary_key=True)
    spent_unit: Mapped[str] = mapped_column(String(32), primary_key=True)
    saved: Mapped[float] = mapped_column(Float, default=0.0)
    spent: Mapped[float] = mapped_column(Float, default=0.0)
    saved_max: Mapped[float] = mapped_column(Float, default=0.0)
    spent_max: Mapped[float] = mapped_column(Float, default=0.0)
    samples: Mapped[int] = mapped_column(Integer, default=0)
    first_t: Mapped[float] = mapped_column(Float)
    last_t: Mapped[float] = mapped_column(Float)


class CounterRow(Base):
    """A named, monotonically increasing counter of the recorder."""

    __tablename__ = "counters"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    value: Mapped[float] = mapped_column(Float, default=0.0)


class BenchRunRow(Base):
    """One load-generator run: its settings and results, as given (JSON objects)."""

    __tablename__ = "bench_runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    name: Mapped[str] = mapped_column(String(200))
    created: Mapped[float] = mapped_column(Float, index=True)
    settings: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
    results: Mapped[dict[str, Any]] = mapped_column(JSON, default=dict)
