"""Reading live numbers from the database: step throughput, batch size, step time,
requests in flight, prefix hit rate, as recent values and as small time series.

Steps are recorded by the runner, one ``StepRecord`` per forward pass (its compute
time); the scheduler's round trip per step is one of its stats (``round_trip_ms``), not
stored here. Times are seconds since the epoch; rates are per second.
"""

from __future__ import annotations

import math
from typing import Any

from sqlalchemy import Engine, and_, func, or_, select
from sqlalchemy.orm import Session

from houchu.storage.expert_load_view import step_imbalance
from houchu.storage.models import RequestRow, StepRow
from houchu.storage.timeline import STALE_AFTER_S

#: Longest history a series query accepts (seconds).
MAX_HORIZON_S = 3600.0


def _steps(session: Session, since: float) -> list[StepRow]:
    return list(session.scalars(select(StepRow).where(StepRow.t >= since).order_by(StepRow.t)))


def _mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def step_series(
    engine: Engine, now: float, horizon_s: float = 120.0, bucket_s: float = 2.0
) -> dict[str, Any]:
    """Per-bucket series over the last ``horizon_s`` seconds.

    Returns ``{"t": [bucket start...], "prefill_tps", "decode_tps", "batch_size",
    "step_ms", "allreduce_ms", "in_flight", "expert_imbalance"}`` (None where a bucket
    had no step; the expert imbalance, the mean of its MoE steps', and the all-reduce
    milliseconds, the mean of its tensor-parallel steps', None without one).

    Raises:
        ValueError: ``horizon_s`` not in (0, MAX_HORIZON_S] or ``bucket_s`` not positive
            or more than 1000 buckets.
    """
    if not 0 < horizon_s <= MAX_HORIZON_S:
        raise ValueError(f"horizon must be in (0, {MAX_HORIZON_S:.0f}] seconds")
    if bucket_s <= 0 or horizon_s / bucket_s > 1000:
        raise ValueError("bucket must be positive and give at most 1000 buckets")
    n = int(math.ceil(horizon_s / bucket_s))
    end = math.floor(now / bucket_s) * bucket_s + bucket_s
    start = end - n * bucket_s
    with Session(engine) as session:
        steps = _steps(session, start)
        flights = _in_flight_spans(session, start)
    buckets: list[list[StepRow]] = [[] for _ in range(n)]
    for s in steps:
        buckets[min(int((s.t - start) // bucket_s), n - 1)].append(s)
    ts = [start + i * bucket_s for i in range(n)]
    return {
        "t": ts,
        "bucket_s": bucket_s,
        "prefill_tps": [sum(s.num_prefill_tokens for s in b) / bucket_s for b in buckets],
        "decode_tps": [sum(s.num_decode_tokens for s in b) / bucket_s for b in buckets],
        "batch_size": [_mean([s.batch_size for s in b]) for b in buckets],
        "step_ms": [_mean([s.duration_s * 1000 for s in b]) for b in buckets],
        "allreduce_ms": [_mean(_allreduce_ms(b)) for b in buckets],
        "in_flight": [
            sum(1 for a, z in flights if a <= t + bucket_s and (z is None or z >= t)) for t in ts
        ],
        "expert_imbalance": [_mean(_imbalances(b)) for b in buckets],
    }


def _imbalances(steps: list[StepRow]) -> list[float]:
    return [v for v in (step_imbalance(s.expert_load) for s in steps) if v is not None]


def _allreduce_ms(steps: list[StepRow]) -> list[float]:
    return [s.allreduce_s * 1000 for s in steps if s.allreduce_s is not None]


def recent_steps(engine: Engine, now: float, limit: int = 60) -> list[dict[str, Any]]:
    """The last ``limit`` steps of the last ``MAX_HORIZON_S`` seconds, oldest first, one
    dict each: ``step_id``, ``t`` (start, seconds since the epoch), ``phase``,
    ``batch_size``, ``step_ms`` (the runner's compute time) and ``allreduce_ms`` (its
    collectives, part of ``step_ms``; None for a tp 1 runner)."""
    with Session(engine) as session:
        rows = session.scalars(
            select(StepRow)
            .where(StepRow.t >= now - MAX_HORIZON_S)
            .order_by(StepRow.t.desc(), StepRow.id.desc())
            .limit(limit)
        ).all()
    return [
        {
            "step_id": s.step_id,
            "t": s.t,
            "phase": s.phase,
            "batch_size": s.batch_size,
            "step_ms": s.duration_s * 1000,
            "allreduce_ms": None if s.allreduce_s is None else s.allreduce_s * 1000,
        }
        for s in reversed(rows)
    ]


def _in_flight_spans(session: Session, since: float) -> list[tuple[float, float | None]]:
    R = RequestRow
    q = select(R.started_at, R.finished_at).where(
        or_(
            R.finished_at >= since,
            and_(R.finished_at.is_(None), R.started_at >= since - STALE_AFTER_S),
        )
    )
    return [(a, z) for a, z in session.execute(q)]


def recent_rates(engine: Engine, now: float, window_s: float = 10.0) -> dict[str, Any]:
    """Throughput, batch size and step time over the last ``window_s`` seconds; for a
    tensor-parallel runner, ``allreduce_ms`` (mean per step) and ``allreduce_share`` (of
    its steps' time), else None."""
    with Session(engine) as session:
        steps = _steps(session, now - window_s)
    return {
        "window_s": window_s,
        "steps_per_s": len(steps) / window_s,
        "prefill_tps": sum(s.num_prefill_tokens for s in steps) / window_s,
        "decode_tps": sum(s.num_decode_tokens for s in steps) / window_s,
        "batch_size": _mean([s.batch_size for s in steps]),
        "step_ms": _mean([s.duration_s * 1000 for s in steps]),
        "allreduce_ms": _mean(_allreduce_ms(steps)),
        "allreduce_share": _allreduce_share(steps),
    }


def _allreduce_share(steps: list[StepRow]) -> float | None:
    tp = [s for s in steps if s.allreduce_s is not None]
    busy = sum(s.duration_s for s in tp)
    return sum(s.allreduce_s for s in tp) / busy if tp and busy > 0 else None


def request_stats(engine: Engine, now: float, window_s: float = 300.0) -> dict[str, Any]:
    """Requests by status (all kept), and over the last ``window_s`` seconds: finished
    count, prefix hit rate (cached / prompt tokens), mean TTFT, TPOT and E2E (seconds)."""
    R = RequestRow
    with Session(engine) as session:
        by_status = dict(session.execute(select(R.status, func.count()).group_by(R.status)).all())
        recent = session.execute(
            select(
                func.count(),
                func.sum(R.prompt_tokens),
                func.sum(R.cached_tokens),
                func.avg(R.ttft_s),
                func.avg(R.tpot_s),
                func.avg(R.e2e_s),
            ).where(R.finished_at >= now - window_s, R.status != "running")
        ).one()
    n, prompt, cached, ttft, tpot, e2e = recent
    return {
        "by_status": {k: int(v) for k, v in by_status.items()},
        "window_s": window_s,
        "finished_recent": int(n or 0),
        "prefix_hit_rate": (float(cached or 0) / float(prompt)) if prompt else None,
        "ttft_s": ttft,
        "tpot_s": tpot,
        "e2e_s": e2e,
    }
