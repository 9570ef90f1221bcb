"""Reading the lever ledger: what each lever saved and spent, in total or over a window.

The all-time view reads ``ledger_totals`` (sums kept by the recorder, never pruned); a
window reads the raw ``lever_samples`` of the last ``window_s`` seconds. Both return one
row per (lever, verb, saved unit, spent unit) with sum, mean and max of saved and spent.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine, func, select
from sqlalchemy.orm import Session

from houchu.storage.models import CounterRow, LedgerTotalRow, LeverRow

#: Longest window a ledger query accepts (seconds): 30 days.
MAX_WINDOW_S = 30 * 86400.0


def _row(
    lever: str,
    verb: str,
    saved_unit: str,
    spent_unit: str,
    saved: float,
    spent: float,
    saved_max: float,
    spent_max: float,
    samples: int,
    first_t: float,
    last_t: float,
) -> dict[str, Any]:
    n = max(samples, 1)
    return {
        "lever": lever,
        "verb": verb,
        "saved_unit": saved_unit,
        "spent_unit": spent_unit,
        "saved": float(saved or 0.0),
        "spent": float(spent or 0.0),
        "saved_mean": float(saved or 0.0) / n,
        "spent_mean": float(spent or 0.0) / n,
        "saved_max": float(saved_max or 0.0),
        "spent_max": float(spent_max or 0.0),
        "samples": int(samples),
        "first_t": first_t,
        "last_t": last_t,
    }


def ledger_rows(engine: Engine, now: float, window_s: float | None = None) -> list[dict[str, Any]]:
    """Ledger rows, all-time (``window_s`` None) or over the last ``window_s`` seconds.

    Raises:
        ValueError: ``window_s`` not in (0, MAX_WINDOW_S].
    """
    if window_s is not None and not 0 < window_s <= MAX_WINDOW_S:
        raise ValueError(f"window must be in (0, {MAX_WINDOW_S:.0f}] seconds, got {window_s}")
    with Session(engine) as session:
        if window_s is None:
            return [
                _row(
                    r.lever,
                    r.verb,
                    r.saved_unit,
                    r.spent_unit,
                    r.saved,
                    r.spent,
                    r.saved_max,
                    r.spent_max,
                    r.samples,
                    r.first_t,
                    r.last_t,
                )
                for r in session.scalars(select(LedgerTotalRow))
            ]
        L = LeverRow
        q = (
            select(
                L.lever,
                L.verb,
                L.saved_unit,
                L.spent_unit,
                func.sum(L.saved),
                func.sum(L.spent),
                func.max(L.saved),
                func.max(L.spent),
                func.count(),
                func.min(L.t),
                func.max(L.t),
            )
            .where(L.t >= now - window_s)
            .group_by(L.lever, L.verb, L.saved_unit, L.spent_unit)
        )
        return [_row(*r) for r in session.execute(q)]


def counters(engine: Engine) -> dict[str, float]:
    """The recorder's counters (records written, dropped, pruned, write errors)."""
    with Session(engine) as session:
        return {r.name: r.value for r in session.scalars(select(CounterRow))}
