"""What a lever sweep reads back from a server's database: the ledger and the forward
steps between two wall-clock times, and the shapes of recorded requests to replay.

Recorded requests carry their token counts, parameters and arrival times; their prompt
text is not stored (only a short preview, and only without an API key), so a replay
from the database rebuilds prompts of the recorded lengths.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from houchu.storage.models import LeverRow, RequestRow, StepRow


def ledger_between(engine: Engine, t0: float, t1: float) -> dict[str, dict[str, float]]:
    """What each reported lever saved and spent between ``t0`` and ``t1`` (Unix
    seconds): ``{lever: {"saved UNIT": sum, "spent UNIT": sum}}`` (samples' own units)."""
    L = LeverRow
    q = (
        select(L.lever, L.saved_unit, L.spent_unit, func.sum(L.saved), func.sum(L.spent))
        .where(L.t >= t0, L.t <= t1)
        .group_by(L.lever, L.saved_unit, L.spent_unit)
    )
    out: dict[str, dict[str, float]] = {}
    with Session(engine) as session:
        for lever, su, pu, saved, spent in session.execute(q):
            row = out.setdefault(lever, {})
            if su:
                row[f"saved {su}"] = row.get(f"saved {su}", 0.0) + float(saved or 0.0)
            if pu:
                row[f"spent {pu}"] = row.get(f"spent {pu}", 0.0) + float(spent or 0.0)
    return out


def steps_between(engine: Engine, t0: float, t1: float) -> dict[str, float]:
    """The runner's forward steps that started between ``t0`` and ``t1``: ``steps``,
    ``seconds`` (summed durations), ``prefill_tokens``, ``decode_tokens``."""
    S = StepRow
    q = select(
        func.count(),
        func.sum(S.duration_s),
        func.sum(S.num_prefill_tokens),
        func.sum(S.num_decode_tokens),
    ).where(S.t >= t0, S.t <= t1)
    with Session(engine) as session:
        n, secs, pre, dec = session.execute(q).one()
    return {
        "steps": int(n or 0),
        "seconds": float(secs or 0.0),
        "prefill_tokens": int(pre or 0),
        "decode_tokens": int(dec or 0),
    }


def recorded_requests(engine: Engine, limit: int) -> list[dict[str, Any]]:
    """The newest ``limit`` finished requests, oldest first: ``arrived_at`` (Unix s),
    ``prompt_tokens``, ``completion_tokens``, ``params`` (their sampling settings)."""
    R = RequestRow
    q = (
        select(R.started_at, R.arrived_at, R.prompt_tokens, R.completion_tokens, R.params)
        .where(R.status == "finished", R.prompt_tokens > 0)
        .order_by(R.started_at.desc())
        .limit(limit)
    )
    with Session(engine) as session:
        rows = list(session.execute(q))
    return [
        {
            "arrived_at": float(arrived if arrived is not None else started),
            "prompt_tokens": int(prompt),
            "completion_tokens": int(completion),
            "params": dict(params or {}),
        }
        for started, arrived, prompt, completion, params in reversed(rows)
    ]
