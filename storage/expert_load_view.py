"""Reading a MoE model's expert load from the steps table: tokens per expert of each MoE
layer, and the imbalance (max / mean tokens per expert: 1.0 is even, E is every token on
one expert; the load-balance measure of the Switch Transformer and DeepSeek-V3 papers).

Each ``StepRecord`` of a MoE model carries its step's ``expert_load`` (``[layers][experts]``
tokens, a token counted once per expert it picked; ``houchu.model.expert_load``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import Engine, select
from sqlalchemy.orm import Session

from houchu.storage.models import StepRow


def imbalance(tokens: Sequence[int]) -> float | None:
    """max / mean of one layer's tokens per expert; None when no token was routed."""
    total = sum(tokens)
    if not total:
        return None
    return max(tokens) * len(tokens) / total


def step_imbalance(layers: Sequence[Sequence[int]] | None) -> float | None:
    """A step's imbalance: its most imbalanced layer's (that layer's busiest expert sets
    the pace when experts run side by side); None for a dense step or no routed token."""
    values = [v for v in (imbalance(t) for t in layers or ()) if v is not None]
    return max(values) if values else None


def expert_load(engine: Engine, now: float, window_s: float = 60.0) -> dict[str, Any] | None:
    """The expert load of the last ``window_s`` seconds of steps, or None when none of
    them carries one (a dense model, or no step).

    Returns ``{"window_s", "steps", "layers", "experts", "imbalance_mean",
    "imbalance_max" (over the steps' imbalances), "tokens" ([layers][experts] summed over
    the window), "imbalance_by_layer" (of those sums), "last": {"step_id", "t",
    "tokens", "imbalance"}}``; steps whose shape differs from the last one's (another
    model) are left out.
    """
    with Session(engine) as session:
        q = (
            select(StepRow.step_id, StepRow.t, StepRow.expert_load)
            .where(StepRow.t >= now - window_s, StepRow.expert_load.is_not(None))
            .order_by(StepRow.t)
        )
        rows = [(i, t, load) for i, t, load in session.execute(q) if load]
    if not rows:
        return None
    last_id, last_t, last_load = rows[-1]
    shape = [len(layer) for layer in last_load]
    loads = [load for _, _, load in rows if [len(layer) for layer in load] == shape]
    totals = [[0] * n for n in shape]
    for load in loads:
        for total, layer in zip(totals, load, strict=True):
            for e, n in enumerate(layer):
                total[e] += n
    values = [v for v in (step_imbalance(load) for load in loads) if v is not None]
    return {
        "window_s": window_s,
        "steps": len(loads),
        "layers": len(shape),
        "experts": max(shape, default=0),
        "imbalance_mean": sum(values) / len(values) if values else None,
        "imbalance_max": max(values, default=None),
        "tokens": totals,
        "imbalance_by_layer": [imbalance(t) for t in totals],
        "last": {
            "step_id": last_id,
            "t": last_t,
            "tokens": last_load,
            "imbalance": step_imbalance(last_load),
        },
    }
