"""Benchmark runs: stored by the load generator, shown by the dashboard.

``save_bench_run(db_url, name, settings, results)`` is what ``houchu bench`` calls after a
run; it opens (and migrates, if needed) the database, so it works with no server running.
"""

from __future__ import annotations

import json
import math
import time
from typing import Any

from sqlalchemy import Engine, delete, select
from sqlalchemy.orm import Session

from houchu.storage.db import open_db
from houchu.storage.models import BenchRunRow

MAX_NAME_CHARS = 200


class BenchRunError(ValueError):
    """Settings or results that cannot be stored (not JSON objects, bad name)."""


def _json_object(value: Any, what: str) -> dict[str, Any]:
    """``value`` as a plain JSON object (NaN / infinity become null).

    Raises BenchRunError if it is not a dict or holds values JSON cannot represent.
    """
    if not isinstance(value, dict):
        raise BenchRunError(f"{what} must be a dict, got {type(value).__name__}")
    try:
        text = json.dumps(value, default=_reject, allow_nan=True)
    except (TypeError, ValueError) as e:
        raise BenchRunError(f"{what} is not JSON-serializable: {e}") from None
    return _finite(json.loads(text))


def _reject(o: Any) -> Any:
    raise TypeError(f"{type(o).__name__} is not JSON-serializable")


def _finite(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return None
    if isinstance(v, dict):
        return {k: _finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_finite(x) for x in v]
    return v


def insert_bench_run(
    engine: Engine,
    name: str,
    settings: dict[str, Any],
    results: dict[str, Any],
    created: float | None = None,
) -> int:
    """Store one run in an open (migrated) database; returns its id.

    Raises:
        BenchRunError: empty or over-long name; settings/results not JSON objects.
        sqlalchemy.exc.SQLAlchemyError: the database failed.
    """
    if not isinstance(name, str) or not name.strip():
        raise BenchRunError("a benchmark run needs a non-empty name")
    if len(name) > MAX_NAME_CHARS:
        raise BenchRunError(f"benchmark run name is over {MAX_NAME_CHARS} characters")
    row = BenchRunRow(
        name=name.strip(),
        created=time.time() if created is None else created,
        settings=_json_object(settings, "settings"),
        results=_json_object(results, "results"),
    )
    with Session(engine) as session, session.begin():
        session.add(row)
        session.flush()
        return row.id


def save_bench_run(
    db_url: str | None, name: str, settings: dict[str, Any], results: dict[str, Any]
) -> int:
    """Store a load-generator run in the database at ``db_url`` (None: the default
    database, ``houchu.paths.cache_dir()/houchu.db``); returns the run's id.

    ``settings`` and ``results`` are JSON objects (dicts of str, numbers, lists, dicts);
    NaN and infinities are stored as null.

    Raises:
        BenchRunError: bad name, or settings/results that are not JSON objects.
        houchu.storage.db.DatabaseUrlError: ``db_url`` is not a database URL.
        sqlalchemy.exc.SQLAlchemyError: the database cannot be reached or written.
    """
    engine = open_db(db_url)
    try:
        return insert_bench_run(engine, name, settings, results)
    finally:
        engine.dispose()


def bench_run_dict(row: BenchRunRow) -> dict[str, Any]:
    """A run as the dashboard API returns it."""
    return {
        "id": row.id,
        "name": row.name,
        "created": row.created,
        "settings": row.settings or {},
        "results": row.results or {},
    }


def list_bench_runs(engine: Engine, limit: int = 100) -> list[dict[str, Any]]:
    """The newest ``limit`` runs, newest first."""
    with Session(engine) as session:
        rows = session.scalars(
            select(BenchRunRow).order_by(BenchRunRow.created.desc()).limit(limit)
        )
        return [bench_run_dict(r) for r in rows]


def get_bench_run(engine: Engine, run_id: int) -> dict[str, Any] | None:
    """One run by id, or None."""
    with Session(engine) as session:
        row = session.get(BenchRunRow, run_id)
        return None if row is None else bench_run_dict(row)


def delete_bench_run(engine: Engine, run_id: int) -> bool:
    """Delete one run; False if there was none with that id."""
    with Session(engine) as session, session.begin():
        return bool(session.execute(delete(BenchRunRow).where(BenchRunRow.id == run_id)).rowcount)
