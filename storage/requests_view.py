"""Reading requests for the dashboard: recent timelines, and one request in detail.

All functions are synchronous (the dashboard runs them in a thread) and return JSON-ready
dicts. Times are seconds since the epoch; latencies are seconds.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from houchu.storage.models import EventRow, LeverRow, RequestRow
from houchu.storage.timeline import build_timeline, timeline_dict
from houchu.transport.levers import Lever

#: Most requests one timeline query returns.
MAX_LIMIT = 500
#: Request statuses a filter may name.
STATUSES = ("running", "finished", "aborted", "failed")


def summary_dict(row: RequestRow) -> dict[str, Any]:
    """A request's summary as the API returns it."""
    return {
        "rid": row.rid,
        "status": row.status,
        "finish_reason": row.finish_reason,
        "started_at": row.started_at,
        "arrived_at": row.arrived_at,
        "first_token_at": row.first_token_at,
        "finished_at": row.finished_at,
        "prompt_tokens": row.prompt_tokens,
        "completion_tokens": row.completion_tokens,
        "cached_tokens": row.cached_tokens,
        "num_preemptions": row.num_preemptions,
        "ttft_s": row.ttft_s,
        "tpot_s": row.tpot_s,
        "e2e_s": row.e2e_s,
        "preview": row.preview,
        "params": row.params or {},
        "choice": choice_dict(row.params or {}),
        "error": row.error,
    }


def choice_dict(params: dict[str, Any]) -> dict[str, Any] | None:
    """Which choice of a several-choice request (``n``, ``best_of``) this request is:
    ``parent`` (the client request's id), ``index`` (0-based), ``of`` (choices
    generated) and ``n`` (choices returned); None for a request of one choice."""
    parent = params.get("parent")
    if not isinstance(parent, str):
        return None
    of = params.get("choices")
    return {"parent": parent, "index": params.get("choice"), "of": of, "n": params.get("n", of)}


def structured_dict(row: RequestRow, levers: list[dict[str, Any]]) -> dict[str, Any] | None:
    """A structured-output request's grammar kind (``json_schema``, ``regex``, ``choice``,
    ``grammar``, ``json_object``, ``tool_call``) and mask time ``mask_s`` (seconds: its
    share of each step's mask computation, hidden or waited for; a share of a batched
    fill is estimated from the request's masks timed alone,
    ``houchu.model.grammar.fill``); None for a free one."""
    kind = (row.params or {}).get("grammar")
    if not isinstance(kind, str):
        return None
    mask_s = sum(
        s["saved"] + s["spent"] for s in levers if s["lever"] == Lever.STRUCTURED_OUTPUT_MASK
    )
    return {"kind": kind, "mask_s": mask_s}


def _event_dict(e: EventRow) -> dict[str, Any]:
    return {"kind": e.kind, "t": e.t, "actor": e.actor, "data": e.data or {}}


def _lever_dict(s: LeverRow) -> dict[str, Any]:
    return {
        "lever": s.lever,
        "verb": s.verb,
        "saved": s.saved,
        "saved_unit": s.saved_unit,
        "spent": s.spent,
        "spent_unit": s.spent_unit,
        "t": s.t,
        "actor": s.actor,
    }


def recent_requests(
    engine: Engine,
    now: float,
    limit: int = 40,
    since: float | None = None,
    status: str | None = None,
) -> list[dict[str, Any]]:
    """The newest ``limit`` requests (newest first), each with its timeline.

    Args:
        now: seconds since the epoch; unfinished stages end here.
        limit: 1..MAX_LIMIT.
        since: only requests first seen at or after this time.
        status: only requests in this status (one of STATUSES).
    Raises:
        ValueError: limit out of range or unknown status.
    """
    if not 1 <= limit <= MAX_LIMIT:
        raise ValueError(f"limit must be in [1, {MAX_LIMIT}], got {limit}")
    if status is not None and status not in STATUSES:
        raise ValueError(f"status must be one of {', '.join(STATUSES)}, got {status!r}")
    with Session(engine) as session:
        # a request's choices arrive at once: in their order (their ids end in the index)
        order = (RequestRow.started_at.desc(), RequestRow.rid)
        q = select(RequestRow).order_by(*order).limit(limit)
        if since is not None:
            q = q.where(RequestRow.started_at >= since)
        if status is not None:
            q = q.where(RequestRow.status == status)
        rows = list(session.scalars(q))
        rids = [r.rid for r in rows]
        events: dict[str, list[dict]] = defaultdict(list)
        levers: dict[str, list[dict]] = defaultdict(list)
        if rids:
            for e in session.scalars(select(EventRow).where(EventRow.rid.in_(rids))):
                events[e.rid].append(_event_dict(e))
            for s in session.scalars(select(LeverRow).where(LeverRow.rid.in_(rids))):
                levers[s.rid].append(_lever_dict(s))
        out = []
        for r in rows:
            segments, markers = build_timeline(events[r.rid], levers[r.rid], now)
            structured = structured_dict(r, levers[r.rid])
            out.append(
                {**summary_dict(r), **timeline_dict(segments, markers), "structured": structured}
            )
        return out


def request_detail(engine: Engine, rid: str, now: float) -> dict[str, Any] | None:
    """One request: summary, timeline, every event, and its own ledger; None if unknown."""
    with Session(engine) as session:
        row = session.get(RequestRow, rid)
        if row is None:
            return None
        events = [
            _event_dict(e)
            for e in session.scalars(
                select(EventRow).where(EventRow.rid == rid).order_by(EventRow.t)
            )
        ]
        levers = [
            _lever_dict(s)
            for s in session.scalars(
                select(LeverRow).where(LeverRow.rid == rid).order_by(LeverRow.t)
            )
        ]
        segments, markers = build_timeline(events, levers, now)
        return {
            **summary_dict(row),
            **timeline_dict(segments, markers),
            "events": events,
            "levers": levers,
            "ledger": request_ledger(levers),
            "structured": structured_dict(row, levers),
        }


def request_ledger(levers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One request's lever samples summed per (lever, verb, saved unit, spent unit)."""
    sums: dict[tuple[str, str, str, str], dict[str, Any]] = {}
    for s in levers:
        key = (s["lever"], s["verb"], s["saved_unit"], s["spent_unit"])
        agg = sums.setdefault(
            key,
            {
                "lever": key[0],
                "verb": key[1],
                "saved_unit": key[2],
                "spent_unit": key[3],
                "saved": 0.0,
                "spent": 0.0,
                "samples": 0,
            },
        )
        agg["saved"] += s["saved"]
        agg["spent"] += s["spent"]
        agg["samples"] += 1
    return list(sums.values())
