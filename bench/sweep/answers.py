"""A sweep's measurements turned into the answers: per lever the four questions, the
composition matrix, the recommendation and the noise report, as one JSON-ready dict.

Per lever and load level: the bottleneck its verb targets and the one binding in the
baseline and with the lever on (``houchu.bench.sweep.roofline``); what it saved and
spent from its own ledger counters during the measured runs; the memory (weight bytes
per step, KV pool tokens), startup time and accuracy it spent; its effect on TTFT, TPOT
and throughput; its break-even load (``houchu.bench.sweep.analysis``).
"""

from __future__ import annotations

import statistics
from typing import Any

from houchu.bench.model.limits import Limits
from houchu.bench.sweep.analysis import (
    CellSummary,
    break_even,
    compose,
    gain,
    noise_tolerance,
    recommend,
    summarize_cells,
)
from houchu.bench.sweep.plan import DEFAULTS, Config, SweepPlan
from houchu.bench.sweep.records import CellRun, ServerFacts
from houchu.bench.sweep.roofline import binding, compute_format
from houchu.storage.lever_names import current_lever

EFFECTS = (
    ("throughput", "output_throughput"),
    ("ttft", "median_ttft_ms"),
    ("tpot", "median_tpot_ms"),
)


def _binding_of(
    runs: list[CellRun], facts: ServerFacts | None, lim: Limits | None, native: frozenset[str]
) -> dict[str, Any] | None:
    """The binding constraint of the first repeat of a cell (None without facts)."""
    if not runs or facts is None or lim is None:
        return None
    b = binding(runs[0], facts, lim, compute_format(facts, native))
    return {
        "kind": b.kind,
        "compute_frac": b.compute_frac,
        "bandwidth_frac": b.bandwidth_frac,
        "step_ms": b.step_ms,
    }


def lever_ledger(cell: CellSummary | None, names: tuple[str, ...]) -> dict[str, float]:
    """The amounts a cell's ledger holds for catalog levers ``names`` (a name an older
    record holds counts under the catalog's, ``storage.lever_names.current_lever``),
    summed per ``saved UNIT`` / ``spent UNIT``."""
    out: dict[str, float] = {}
    if cell is None:
        return out
    for reported, amounts in cell.ledger.items():
        if current_lever(reported) in names:
            for k, v in amounts.items():
                out[k] = out.get(k, 0.0) + v
    return out


def _spent_static(on: ServerFacts | None, base: ServerFacts | None) -> dict[str, float]:
    if on is None or base is None:
        return {}
    return {
        "weight_bytes_per_step": on.weight_bytes_per_step - base.weight_bytes_per_step,
        "kv_pool_tokens": float(on.kv_pool_tokens - base.kv_pool_tokens),
        "startup_s": on.startup_s - base.startup_s,
    }


def analyze(
    plan: SweepPlan,
    runs: list[CellRun],
    facts: dict[str, ServerFacts],
    lim: Limits | None,
    native: frozenset[str],
    quality: dict[str, dict[str, Any]],
    target_load: float,
    objective: str = "output_throughput",
) -> dict[str, Any]:
    """The answers (see the module docstring) as a JSON-ready dict: ``levers``,
    ``pairs`` (the composition at every load), ``matrix`` (at ``target_load``),
    ``recommendation``, ``cells`` (every median) and ``noise``.

    Raises:
        ValueError: an unknown objective.
    """
    cells = summarize_cells(runs)
    loads = [ld.value for ld in plan.loads]
    by_cell: dict[tuple[str, float], list[CellRun]] = {}
    for r in runs:
        by_cell.setdefault((r.config, r.load), []).append(r)

    def bind(config: str, x: float) -> dict[str, Any] | None:
        return _binding_of(by_cell.get((config, x), []), facts.get(config), lim, native)

    levers = []
    for lv in plan.levers:
        name = Config(frozenset({lv.name})).name
        ref = plan.reference(lv.name).name  # the baseline, or the levers it requires
        per_load = []
        for x in loads:
            on, base = cells.get((name, x)), cells.get((ref, x))
            effects = {key: (gain(on, base, m) if on and base else None) for key, m in EFFECTS}
            per_load.append(
                {
                    "load": x,
                    "gain": effects,
                    # the gain's noise: twice the larger spread of the two cells' repeats
                    "tolerance": noise_tolerance(on, base) if on and base else None,
                    "metrics": on.metrics if on else None,
                    "binding_baseline": bind(ref, x),
                    "binding_on": bind(name, x),
                    "ledger": lever_ledger(on, lv.ledger),
                }
            )
        curve = [p["gain"]["throughput"] for p in per_load]
        objective_key = next(k for k, m in EFFECTS if m == objective)
        be = break_even(loads, [p["gain"][objective_key] for p in per_load])
        levers.append(
            {
                "lever": lv.name,
                "against": ref,
                "title": lv.title,
                "verb": lv.verb,
                "bottleneck": lv.bottleneck,
                "flags_on": list(lv.flags(True, plan.machine)),
                "flags_off": list(lv.flags(False, plan.machine)),
                "lossy": lv.lossy is not None,
                "accuracy": quality.get(lv.name),
                "spent_static": _spent_static(facts.get(name), facts.get("baseline")),
                "loads": per_load,
                "throughput_gain_curve": curve,
                "break_even": {"kind": be.kind, "load": be.load, "text": be.text(_unit(plan))},
            }
        )
    pairs = []
    for a, b in plan.pairs:
        ab = Config(frozenset({a, b})).name
        for x in loads:
            base, ca, cb, cab = (cells.get((n, x)) for n in ("baseline", a, b, ab))
            if not (base and ca and cb and cab):
                continue
            ga, gb, gab = (gain(c, base, objective) for c in (ca, cb, cab))
            if not (ga and gb and gab):
                continue
            c = compose(a, b, ga, gb, gab, noise_tolerance(base, ca, cb, cab))
            pairs.append({"load": x, **c.__dict__})
    rec = recommend(cells, target_load, objective)
    recommendation = None
    if rec is not None:
        config = next(c for c in plan.configs() if c.name == rec.config)
        defaults = cells.get((DEFAULTS, rec.load))
        best = cells.get((rec.config, rec.load))
        against = gain(best, defaults, objective) if best and defaults else None
        spread = noise_tolerance(best, defaults) if best and defaults else None
        recommendation = {
            **rec.__dict__,
            "flags": plan.flags(config),
            "against_defaults": against,
            "defaults_tolerance": spread,  # a gain within it of 1x is noise
        }
    spreads = [c.spread for c in cells.values() if c.repeats > 1]
    return {
        "levers": levers,
        "not_applicable": plan.not_applicable,
        "pairs_not_measured": plan.skipped_pairs,
        "pairs": pairs,
        "matrix": [p for p in pairs if p["load"] == target_load],
        "recommendation": recommendation,
        "cells": [c.__dict__ for c in cells.values()],
        "noise": {
            "median_spread": statistics.median(spreads) if spreads else None,
            "max_spread": max(spreads) if spreads else None,
        },
        "target_load": target_load,
        "objective": objective,
    }


def _unit(plan: SweepPlan) -> str:
    return "c" if plan.loads and plan.loads[0].kind == "concurrency" else "r"
