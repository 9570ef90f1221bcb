"""A request's timeline: its stages as time intervals, and the moments marked on them.

Built from the request's lifecycle events (any actor, any arrival order) by walking them
in time order through a small state machine:

    arrived -> tokenize -> tokenized/queued -> queue -> scheduled/prefill_chunk -> prefill
    -> first_token -> decode -> finished | aborted | failed
    preempted -> preempted -> resumed -> prefill (recompute) -> decode

When the scheduler's events are missing (telemetry from an older scheduler), the wait
between tokenization and the first token is one stage, "queue+prefill". Times are
seconds since the epoch.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

#: Stage names, in the order a request meets them (the dashboard colours them).
STAGES = ("tokenize", "queue", "queue+prefill", "prefill", "decode", "preempted")
#: Event kind -> the stage that starts with it (None: the request is over).
_TRANSITIONS: dict[str, str | None] = {
    "arrived": "tokenize",
    "tokenized": "queue",
    "queued": "queue",
    "scheduled": "prefill",
    "first_token": "decode",
    "preempted": "preempted",
    "resumed": "prefill",
    "decode": "decode",  # decoding again after a resume's recompute
    "finished": None,
    "aborted": None,
    "failed": None,
}
_SCHEDULER_KINDS = {"queued", "scheduled", "prefill_chunk", "first_token"}
#: Events drawn as markers (the others only move the stage).
_MARKED = {"prefix_matched", "prefill_chunk", "first_token", "preempted", "resumed"}
_TERMINAL = {"finished", "aborted", "failed"}
#: An unfinished request with no event for this long (seconds) is drawn as lost: its
#: end was never recorded (the server stopped, or its telemetry was dropped).
STALE_AFTER_S = 900.0


@dataclass
class Segment:
    """One stage of a request, from ``start`` to ``end`` (seconds); ``open``: still going."""

    stage: str
    start: float
    end: float
    open: bool = False


@dataclass
class Marker:
    """A moment on a request's timeline: an event, or a lever that acted (``lever`` set)."""

    kind: str
    t: float
    label: str
    lever: str | None = None
    verb: str | None = None


def _label(kind: str, data: dict[str, Any]) -> str:
    match kind:
        case "prefix_matched":
            tier = data.get("tier", "device")
            return f"prefix hit: {data.get('cached_tokens', 0)} tokens reused ({tier})"
        case "prefill_chunk":
            return f"prefill chunk: {data.get('tokens', '?')} tokens from {data.get('start', 0)}"
        case "first_token":
            return "first token"
        case "preempted":
            return "preempted: KV freed, to be recomputed"
        case "resumed":
            recompute, cached = data.get("recompute_tokens"), data.get("cached_tokens", 0)
            if recompute is None:  # recorded before the event carried it
                return f"resumed ({cached} tokens cached)"
            return f"resumed ({recompute} tokens to recompute, {cached} cached)"
        case "finished":
            return f"finished ({data.get('finish_reason', '?')})"
        case "failed":
            return f"failed: {data.get('error', '')}"[:200]
    return kind


def build_timeline(
    events: list[dict[str, Any]], levers: list[dict[str, Any]], now: float
) -> tuple[list[Segment], list[Marker]]:
    """Stages and markers of one request.

    Args:
        events: dicts with ``kind``, ``t``, ``actor``, ``data``.
        levers: this request's lever samples (dicts with ``lever``, ``verb``, ``t``,
            ``saved``, ``saved_unit``).
        now: seconds since the epoch; an unfinished request's last stage ends here,
            unless its last event is more than ``STALE_AFTER_S`` old (then it ends at that
            event, with a "lost" marker).
    """
    evs = sorted(events, key=lambda e: e["t"])
    has_scheduler = any(e["kind"] in _SCHEDULER_KINDS for e in evs)
    evs = _with_tokenizer_first_token(evs)
    segments: list[Segment] = []
    markers: list[Marker] = []
    stage: str | None = None
    start = 0.0
    over = False
    for e in evs:
        kind, t, data = e["kind"], e["t"], e.get("data") or {}
        if kind in _MARKED:
            markers.append(Marker(kind, t, _label(kind, data)))
        if kind in _TERMINAL and not over:
            markers.append(Marker(kind, t, _label(kind, data)))
        nxt = _TRANSITIONS.get(kind, stage)
        if kind == "prefill_chunk" and stage in ("queue", None):
            nxt = "prefill"
        if kind == "queued" and stage in ("prefill", "decode", "preempted"):
            nxt = stage  # a late-arriving queued event does not move a request back
        if over:
            if segments and kind in _TERMINAL:
                segments[-1].end = max(segments[-1].end, t)
            continue
        if nxt != stage or kind in _TERMINAL:
            if stage is not None:
                segments.append(Segment(stage, start, t))
            stage, start = nxt, t
            if kind in _TERMINAL:
                over = True
    if not over and stage is not None:
        last = evs[-1]["t"]
        if now - last > STALE_AFTER_S:
            segments.append(Segment(stage, start, last))
            markers.append(Marker("lost", last, "no end recorded (server stopped?)"))
        else:
            segments.append(Segment(stage, start, max(now, start), open=True))
    if not has_scheduler:
        for s in segments:
            if s.stage == "queue":
                s.stage = "queue+prefill"
    markers.extend(_lever_markers(levers))
    return _merge(segments), sorted(markers, key=lambda m: m.t)


def _with_tokenizer_first_token(evs: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Add a first_token event from the tokenizer's ``first_token_t`` when the
    scheduler's is missing."""
    if any(e["kind"] == "first_token" for e in evs):
        return evs
    for e in evs:
        t = (e.get("data") or {}).get("first_token_t")
        if e["kind"] in _TERMINAL and isinstance(t, (int, float)) and t > 0:
            first = {"kind": "first_token", "t": float(t), "actor": e["actor"], "data": {}}
            return sorted([*evs, first], key=lambda x: x["t"])
    return evs


def _lever_markers(levers: list[dict[str, Any]]) -> list[Marker]:
    out = []
    for s in levers:
        saved = s.get("saved", 0)
        unit = s.get("saved_unit", "")
        out.append(
            Marker(
                "lever",
                s["t"],
                f"{s['lever']} ({s['verb']}): saved {saved:g} {unit}",
                s["lever"],
                s["verb"],
            )
        )
    return out


def _merge(segments: list[Segment]) -> list[Segment]:
    """Join touching segments of one stage."""
    out: list[Segment] = []
    for s in segments:
        if out and out[-1].stage == s.stage:
            out[-1].end, out[-1].open = s.end, s.open
            continue
        out.append(s)
    return out


def timeline_dict(segments: list[Segment], markers: list[Marker]) -> dict[str, list[dict]]:
    """Segments and markers as JSON-ready dicts."""
    return {
        "segments": [asdict(s) for s in segments],
        "markers": [asdict(m) for m in markers],
    }
