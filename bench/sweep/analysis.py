"""The four questions, answered from a sweep's measurements (pure functions).

- **Medians and noise.** Each (configuration, load) is summarized by the median of its
  repeats; its noise is the spread of the repeats' output throughput,
  ``(max - min) / median``.
- **Gain.** A lever's speed-up at a load is ``throughput(on) / throughput(baseline)``
  (output tokens per second); for TTFT and TPOT it is ``baseline / on`` (lower is
  better), so a gain above 1 always means the lever helped.
- **Break-even load.** Where the gain curve crosses 1, interpolated linearly in the
  logarithm of the load (load levels are usually geometric: 1, 4, 16, 64) between the two
  measured loads around the crossing.
- **Composition.** For a pair measured with its singles, the ratio of the pair's
  speed-up to the product of the singles' (the gains of independent levers multiply):
  ``cancel`` when the pair is slower than the better single by more than the noise
  tolerance, ``synergy`` when the ratio is above ``1 + tol``, ``add`` within ``tol`` of 1
  (the gains compound as if independent), ``overlap`` below it (part of one gain is
  the other's); ``noisy`` when the tolerance is above :data:`MAX_TOLERANCE`: the repeats
  spread too much to tell.
- **Recommendation.** The fastest measured configuration at the target load.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Iterable
from dataclasses import dataclass

from houchu.bench.sweep.records import CELL_METRICS, CellRun

#: Metrics a gain can be taken on; True where higher is better.
HIGHER_IS_BETTER = {"output_throughput": True, "median_ttft_ms": False, "median_tpot_ms": False}
#: Smallest tolerance of a composition verdict (a relative difference).
MIN_TOLERANCE = 0.03
#: Above this tolerance no verdict is given (``noisy``).
MAX_TOLERANCE = 0.5


@dataclass
class CellSummary:
    """The repeats of one (configuration, load): medians of each metric, noise.

    Attributes:
        config, load: which cell.
        metrics: the median of each metric over the repeats (None if never measured).
        spread: ``(max - min) / median`` of the repeats' output throughput (0 for one).
        repeats: how many runs.
        ledger: the median of each ledger amount over the repeats.
    """

    config: str
    load: float
    metrics: dict[str, float | None]
    spread: float
    repeats: int
    ledger: dict[str, dict[str, float]]


def _median(values: Iterable[float | None]) -> float | None:
    vs = [v for v in values if v is not None]
    return float(statistics.median(vs)) if vs else None


def summarize_cells(runs: list[CellRun]) -> dict[tuple[str, float], CellSummary]:
    """Each (configuration, load)'s repeats as one :class:`CellSummary`."""
    groups: dict[tuple[str, float], list[CellRun]] = {}
    for r in runs:
        groups.setdefault((r.config, r.load), []).append(r)
    out = {}
    for key, rs in groups.items():
        metrics = {m: _median(r.metrics.get(m) for r in rs) for m in CELL_METRICS}
        tput = [v for r in rs if (v := r.metrics.get("output_throughput"))]
        med = statistics.median(tput) if tput else 0.0
        spread = (max(tput) - min(tput)) / med if len(tput) > 1 and med > 0 else 0.0
        ledger: dict[str, dict[str, float]] = {}
        for name in {n for r in rs for n in r.ledger}:
            amounts = {a for r in rs for a in r.ledger.get(name, {})}
            ledger[name] = {
                a: float(statistics.median(r.ledger.get(name, {}).get(a, 0.0) for r in rs))
                for a in sorted(amounts)
            }
        out[key] = CellSummary(key[0], key[1], metrics, spread, len(rs), ledger)
    return out


def gain(on: CellSummary, base: CellSummary, metric: str = "output_throughput") -> float | None:
    """The speed-up of ``on`` over ``base`` on ``metric`` (above 1: better), or None
    when either is missing or zero."""
    a, b = on.metrics.get(metric), base.metrics.get(metric)
    if not a or not b:
        return None
    return a / b if HIGHER_IS_BETTER[metric] else b / a


@dataclass(frozen=True)
class BreakEven:
    """Where a lever's gain crosses 1 over the measured loads.

    Attributes:
        kind: ``stops`` (pays below ``load``, not above), ``starts`` (pays above it),
            ``always`` (pays at every measured load), ``never`` (at none), or
            ``unknown`` (fewer than one measured point).
        load: the interpolated crossing (for ``stops`` / ``starts``).
    """

    kind: str
    load: float | None = None

    def text(self, unit: str) -> str:
        """In words, e.g. ``stops paying above c=11.3``."""
        if self.kind == "stops":
            return f"stops paying above {unit}={self.load:.3g}"
        if self.kind == "starts":
            return f"pays above {unit}={self.load:.3g}"
        return {"always": "pays at every load", "never": "pays at no load"}.get(
            self.kind, "unknown"
        )


def break_even(loads: list[float], gains: list[float | None]) -> BreakEven:
    """The break-even load of a gain curve (``gains[i]`` at ``loads[i]``, loads
    ascending). The first crossing of 1 is taken, interpolated linearly in log(load);
    a gain of exactly 1 is not paying."""
    pts = [(x, g) for x, g in zip(loads, gains, strict=True) if g is not None and x > 0]
    if not pts:
        return BreakEven("unknown")
    pays = [g > 1.0 for _, g in pts]
    if all(pays):
        return BreakEven("always")
    if not any(pays):
        return BreakEven("never")
    for (x0, g0), (x1, g1) in zip(pts, pts[1:], strict=False):
        if (g0 > 1.0) != (g1 > 1.0):
            frac = (1.0 - g0) / (g1 - g0)
            lx = math.log(x0) + frac * (math.log(x1) - math.log(x0))
            return BreakEven("stops" if g0 > 1.0 else "starts", math.exp(lx))
    return BreakEven("unknown")  # pragma: no cover - a sign change always has a pair


@dataclass(frozen=True)
class Composition:
    """How two levers' gains combine at one load.

    Attributes:
        a, b: the levers.
        gain_a, gain_b, gain_ab: speed-ups over the baseline, alone and together.
        ratio: ``gain_ab / (gain_a * gain_b)``.
        verdict: ``add``, ``overlap``, ``cancel``, ``synergy`` or ``noisy``.
        tolerance: the relative difference within which gains count as adding.
    """

    a: str
    b: str
    gain_a: float
    gain_b: float
    gain_ab: float
    ratio: float
    verdict: str
    tolerance: float


def compose(a: str, b: str, ga: float, gb: float, gab: float, tol: float) -> Composition:
    """The verdict on a pair from its measured speed-ups (see the module docstring).

    Raises:
        ValueError: a speed-up that is not positive.
    """
    if min(ga, gb, gab) <= 0:
        raise ValueError(f"speed-ups must be positive, got {ga}, {gb}, {gab}")
    tol = max(tol, MIN_TOLERANCE)
    ratio = gab / (ga * gb)
    if tol > MAX_TOLERANCE:
        verdict = "noisy"
    elif gab < max(ga, gb) * (1.0 - tol):
        verdict = "cancel"
    elif ratio > 1.0 + tol:
        verdict = "synergy"
    elif ratio >= 1.0 - tol:
        verdict = "add"
    else:
        verdict = "overlap"
    return Composition(a, b, ga, gb, gab, ratio, verdict, tol)


def noise_tolerance(*cells: CellSummary) -> float:
    """The tolerance of a verdict over these cells: twice their largest spread (at least
    :data:`MIN_TOLERANCE`)."""
    return max(MIN_TOLERANCE, 2.0 * max((c.spread for c in cells), default=0.0))


@dataclass(frozen=True)
class Recommendation:
    """The fastest measured configuration at the target load.

    Attributes:
        config: its name.
        load: the target load it was judged at.
        metric: what "fastest" was measured by.
        metrics: its median TTFT, TPOT, throughput there.
        gain: its speed-up over the baseline on ``metric``.
    """

    config: str
    load: float
    metric: str
    metrics: dict[str, float | None]
    gain: float | None


def recommend(
    cells: dict[tuple[str, float], CellSummary], load: float, metric: str = "output_throughput"
) -> Recommendation | None:
    """The configuration with the best ``metric`` at ``load`` among those measured
    there with no failed request (ties: the first measured, so the baseline wins a
    tie). None when nothing was measured at that load.

    Raises:
        ValueError: an unknown metric.
    """
    if metric not in HIGHER_IS_BETTER:
        raise ValueError(f"unknown objective {metric!r}; one of {', '.join(HIGHER_IS_BETTER)}")
    here = [c for (_, x), c in cells.items() if x == load]
    ok = [c for c in here if c.metrics.get(metric) and not c.metrics.get("failed")]
    if not ok:
        return None
    sign = 1.0 if HIGHER_IS_BETTER[metric] else -1.0
    best = ok[0]
    for c in ok[1:]:
        if sign * (c.metrics[metric] or 0.0) > sign * (best.metrics[metric] or 0.0):
            best = c
    base = cells.get(("baseline", load))
    return Recommendation(
        best.config, load, metric, best.metrics, gain(best, base, metric) if base else None
    )
