"""Writing telemetry batches: raw records, request summaries, ledger totals, counters.

``ingest(session, batches)`` runs in the recorder's writer thread, inside one
transaction. Records from different actors arrive in any order (each actor flushes on
its own clock), so a request's summary is recomputed from what is known so far each time
one of its events arrives; no order is assumed.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from sqlalchemy import insert, select
from sqlalchemy.orm import Session

from houchu.storage.models import (
    CounterRow,
    EventRow,
    LedgerTotalRow,
    LeverRow,
    RequestRow,
    StepRow,
)
from houchu.transport.telemetry import LifecycleEvent, TelemetryBatch

#: A terminal status replaces another only if it ranks higher: a request that finished
#: (e.g. by a stop string, which the scheduler sees as an abort) is finished.
STATUS_RANK = {"running": 0, "aborted": 1, "finished": 2, "failed": 3}
TERMINAL = {"finished", "aborted", "failed"}
#: Rows per IN (...) query (SQLite's default limit on bound parameters is far above).
_CHUNK = 500


@dataclass
class IngestCounts:
    """Records written by one ``ingest`` call."""

    events: int = 0
    steps: int = 0
    levers: int = 0
    requests: int = 0

    @property
    def total(self) -> int:
        return self.events + self.steps + self.levers


def _chunks(items: Sequence[str]) -> Iterable[Sequence[str]]:
    for i in range(0, len(items), _CHUNK):
        yield items[i : i + _CHUNK]


def ingest(session: Session, batches: Sequence[TelemetryBatch]) -> IngestCounts:
    """Write ``batches`` (raw rows, request summaries, ledger totals) in ``session``.

    The caller commits. Raises ``sqlalchemy.exc.SQLAlchemyError`` if the database fails.
    """
    counts = IngestCounts()
    events = [(b.actor, e) for b in batches for e in b.events]
    steps = [(b.actor, s) for b in batches for s in b.steps]
    levers = [(b.actor, s) for b in batches for s in b.levers]
    if events:
        session.execute(
            insert(EventRow),
            [dict(rid=e.rid, kind=e.kind, t=e.t, actor=e.actor, data=e.data) for _, e in events],
        )
        counts.requests = update_requests(session, [e for _, e in events])
    if steps:
        session.execute(
            insert(StepRow),
            [
                dict(
                    actor=a,
                    step_id=s.step_id,
                    t=s.t,
                    duration_s=s.duration_s,
                    batch_size=s.batch_size,
                    num_prefill_tokens=s.num_prefill_tokens,
                    num_decode_tokens=s.num_decode_tokens,
                    phase=s.phase,
                    expert_load=s.expert_load or None,
                    allreduce_s=s.allreduce_s,
                )
                for a, s in steps
            ],
        )
    if levers:
        session.execute(
            insert(LeverRow),
            [
                dict(
                    lever=s.lever,
                    verb=s.verb,
                    saved=s.saved,
                    saved_unit=s.saved_unit,
                    spent=s.spent,
                    spent_unit=s.spent_unit,
                    t=s.t,
                    rid=s.rid,
                    actor=a,
                )
                for a, s in levers
            ],
        )
        update_ledger_totals(session, [s for _, s in levers])
    counts.events, counts.steps, counts.levers = len(events), len(steps), len(levers)
    return counts


def update_requests(session: Session, events: Sequence[LifecycleEvent]) -> int:
    """Create or update the summary row of every request ``events`` mention."""
    by_rid: dict[str, list[LifecycleEvent]] = defaultdict(list)
    for e in events:
        by_rid[e.rid].append(e)
    rids = list(by_rid)
    rows: dict[str, RequestRow] = {}
    for chunk in _chunks(rids):
        for row in session.scalars(select(RequestRow).where(RequestRow.rid.in_(chunk))):
            rows[row.rid] = row
    for rid, evs in by_rid.items():
        row = rows.get(rid)
        if row is None:
            row = new_request_row(rid, min(e.t for e in evs))
            session.add(row)
        for e in sorted(evs, key=lambda e: e.t):
            apply_event(row, e)
        derive_latencies(row)
    return len(rids)


def new_request_row(rid: str, t: float) -> RequestRow:
    """An empty summary of request ``rid`` first seen at ``t`` (seconds)."""
    return RequestRow(
        rid=rid,
        started_at=t,
        status="running",
        prompt_tokens=0,
        completion_tokens=0,
        cached_tokens=0,
        num_preemptions=0,
        params={},
    )


def _first(current: float | None, t: float) -> float:
    return t if current is None else min(current, t)


def _int(data: dict, key: str, default: int = 0) -> int:
    v = data.get(key, default)
    return int(v) if isinstance(v, (int, float)) else default


def apply_event(row: RequestRow, e: LifecycleEvent) -> None:
    """Fold one lifecycle event into a request's summary (any order of arrival)."""
    d = e.data
    row.started_at = min(row.started_at, e.t)
    match e.kind:
        case "arrived":
            row.arrived_at = _first(row.arrived_at, e.t)
            params = {k: v for k, v in d.items() if k != "preview"}
            row.params = {**(row.params or {}), **params}
            if isinstance(d.get("preview"), str):
                row.preview = d["preview"][:200]
        case "tokenized":
            row.tokenized_at = _first(row.tokenized_at, e.t)
            row.prompt_tokens = max(row.prompt_tokens, _int(d, "prompt_tokens"))
        case "queued":
            row.queued_at = _first(row.queued_at, e.t)
            row.prompt_tokens = max(row.prompt_tokens, _int(d, "prompt_tokens"))
        case "prefix_matched":
            row.cached_tokens = max(row.cached_tokens, _int(d, "cached_tokens"))
        case "scheduled":
            row.scheduled_at = _first(row.scheduled_at, e.t)
        case "first_token":
            row.first_token_at = _first(row.first_token_at, e.t)
        case "preempted":
            row.num_preemptions += 1
        case kind if kind in TERMINAL:
            _apply_terminal(row, e)


def _apply_terminal(row: RequestRow, e: LifecycleEvent) -> None:
    d = e.data
    row.finished_at = e.t if row.finished_at is None else max(row.finished_at, e.t)
    if STATUS_RANK[e.kind] >= STATUS_RANK.get(row.status, 0):
        row.status = e.kind
        reason = d.get("finish_reason")
        if isinstance(reason, str):
            row.finish_reason = reason
        elif e.kind != "finished":
            row.finish_reason = "abort" if e.kind == "aborted" else "error"
    if isinstance(d.get("error"), str):
        row.error = d["error"][:2000]
    row.completion_tokens = max(row.completion_tokens, _int(d, "completion_tokens"))
    row.prompt_tokens = max(row.prompt_tokens, _int(d, "prompt_tokens"))
    row.cached_tokens = max(row.cached_tokens, _int(d, "cached_tokens"))
    first_t = d.get("first_token_t")
    if isinstance(first_t, (int, float)) and first_t > 0:
        row.first_token_at = _first(row.first_token_at, float(first_t))


def derive_latencies(row: RequestRow) -> None:
    """TTFT, TPOT and E2E (seconds) from the summary's timestamps, where known.

    TTFT = first token - arrival; E2E = finish - arrival; TPOT = (finish - first token) /
    (completion tokens - 1).
    """
    start = row.arrived_at if row.arrived_at is not None else row.started_at
    if row.first_token_at is not None:
        row.ttft_s = max(row.first_token_at - start, 0.0)
    if row.finished_at is not None and row.status != "running":
        row.e2e_s = max(row.finished_at - start, 0.0)
        if row.first_token_at is not None and row.completion_tokens > 1:
            row.tpot_s = max(row.finished_at - row.first_token_at, 0.0) / (
                row.completion_tokens - 1
            )


def update_ledger_totals(session: Session, samples: Sequence) -> None:
    """Add lever samples to the all-time ``ledger_totals`` rows."""
    groups: dict[tuple[str, str, str, str], list] = defaultdict(list)
    for s in samples:
        groups[(s.lever, s.verb, s.saved_unit, s.spent_unit)].append(s)
    for key, group in groups.items():
        row = session.get(LedgerTotalRow, key)
        if row is None:
            row = LedgerTotalRow(
                lever=key[0],
                verb=key[1],
                saved_unit=key[2],
                spent_unit=key[3],
                saved=0.0,
                spent=0.0,
                saved_max=0.0,
                spent_max=0.0,
                samples=0,
                first_t=min(s.t for s in group),
                last_t=0.0,
            )
            session.add(row)
        row.saved += sum(s.saved for s in group)
        row.spent += sum(s.spent for s in group)
        row.saved_max = max(row.saved_max, *(s.saved for s in group))
        row.spent_max = max(row.spent_max, *(s.spent for s in group))
        row.samples += len(group)
        row.first_t = min(row.first_t, *(s.t for s in group))
        row.last_t = max(row.last_t, *(s.t for s in group))


def add_counters(session: Session, deltas: dict[str, float]) -> None:
    """Add ``deltas`` to the named counters (created at 0)."""
    for name, delta in deltas.items():
        if not delta:
            continue
        row = session.get(CounterRow, name)
        if row is None:
            session.add(CounterRow(name=name, value=float(delta)))
        else:
            row.value += delta
