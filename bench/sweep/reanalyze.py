"""Answering again from a stored sweep record (``houchu levers --reanalyze FILE``): the
plan is rebuilt from the record's settings, the measurements are its runs, so a record
from another machine or an older version is read with this version's analysis. A
partial record (a sweep interrupted, not yet resumed) is answered from the cells it
holds; its ``sweep`` block lists the cells missing.
"""

from __future__ import annotations

import re
from dataclasses import asdict
from typing import Any

from houchu.bench.model.limits import Limits
from houchu.bench.sweep.answers import analyze
from houchu.bench.sweep.levers import Machine
from houchu.bench.sweep.plan import Load, build_plan
from houchu.bench.sweep.records import SweepResult
from houchu.bench.sweep.schedule import sweep_state

_LINE = re.compile(
    r"copy ([\d.]+) GB/s, fp32 matmul ([\d.]+) GFLOP/s, bf16 matmul ([\d.]+) GFLOP/s"
    r"[^,]*, int8 matmul ([\d.]+) GOP/s"
)


def record_limits(record: dict[str, Any]) -> Limits | None:
    """The limits a record was measured against: ``limits_values``, else read from its
    ``limits`` line (as printed, 3 digits)."""
    if record.get("limits_values"):
        return Limits(**record["limits_values"])
    m = _LINE.search(record.get("limits") or "")
    if not m:
        return None
    bw, fp32, bf16, int8 = (float(x) for x in m.groups())
    return Limits(bw, fp32 * 1e9, bf16 * 1e9, int8 * 1e9)


def reanalyze(
    record: dict[str, Any],
    serve_flags: frozenset[str],
    native: frozenset[str],
    target_load: float | None = None,
) -> dict[str, Any]:
    """``record`` with its ``answers`` computed again from its runs (``serve_flags``:
    this build's ``houchu serve`` flags; ``native``: the matmul formats of the CPU the
    record was measured on, for the roofline), the matrix and the recommendation at
    ``target_load`` (None: the record's own).

    Raises:
        ValueError: the record is not a ``houchu levers`` record, or ``target_load`` is
            not one of its loads.
    """
    s = record.get("settings") or {}
    if s.get("backend") != "houchu levers" or "runs" not in record:
        raise ValueError("not a houchu levers record (no settings.backend 'houchu levers' or runs)")
    loads = [Load(s["load_kind"], float(x)) for x in s["loads"]]
    # the recorded levers ran where they were measured: judge them applicable
    ran = Machine("cuda", frozenset({"avx512_vnni"}), serve_flags, s.get("draft_model"))
    pairs = ",".join(s["pairs"]) or "none"
    plan = build_plan(s["levers"], pairs, loads, s["repeats"], ran, s.get("defaults", False))
    old = record["answers"]
    plan.not_applicable = dict(old.get("not_applicable", {}))
    plan.skipped_pairs = dict(old.get("pairs_not_measured", {}))
    measured = SweepResult.from_record(record)
    runs, facts = measured.runs, measured.facts
    quality = {lv["lever"]: lv["accuracy"] for lv in old["levers"] if lv["accuracy"]}
    lim = record_limits(record)
    objective = old.get("objective", "output_throughput")
    target = old["target_load"] if target_load is None else target_load
    if target not in [ld.value for ld in loads]:
        raise ValueError(f"--target-load {target:g} is not one of the record's loads")
    answers = analyze(plan, runs, facts, lim, native, quality, target, objective)
    state = record.get("sweep") or {}
    complete = bool(state.get("complete", True))  # records before checkpoints: whole
    out = {**record, "answers": answers}
    out["sweep"] = sweep_state(plan, runs, complete, list(state.get("parts") or []))
    if lim is not None:
        out["limits_values"] = asdict(lim)
    return out
