"""Decode kernel paths chosen by measurement at startup (``auto``), per batch bucket.

A quantized model's decode step on the CPU can run four ways, and which is fastest
depends on the CPU (its ISA level, cores, caches), the model's shapes and the batch size:

| path | what runs the projections |
|---|---|
| ``fused`` | houchu's C++ decode layers: all layers and the LM head in one call (``fused_cpu``) |
| ``gemv`` | houchu's C++ int4/int8 GEMV, one call per projection |
| ``torch`` | torch's packed int4 / int8 CPU kernels (``_weight_int4pack_mm_for_cpu``, ``_weight_int8pack_mm``) |
| ``dense`` | a kept dense float32/bfloat16 copy through oneDNN (memory for speed) |

``tune`` times one decode step of each available path at every decode bucket (best of a
few, after a warm-up; a path four times slower than a bucket's best is not timed at the
larger ones), keeps the fastest per bucket in a ``DecodeRoute`` that the model's
quantized linears and the fused layers consult, and caches the result (``DecisionCache``,
keyed by the model file, its format, the ISA level, the thread count and torch's version),
so a second start only reads it. Steps of more rows than the largest bucket (prefill) keep
the layers' own rules.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from houchu.model.attention import AttentionBackend
    from houchu.model.decisions import DecisionCache
    from houchu.model.kv_pool import KVPool

PATHS = ("fused", "gemv", "torch", "dense")
CONTENDED_SHARE = 0.75  # of the threads' cores: below it (and preempted) a measurement is not kept
DROP_ABOVE = 4.0  # a path this many times slower than a bucket's best is not timed further


@dataclass
class DecodeRoute:
    """Which path a decode step of ``rows`` rows takes.

    Attributes:
        table: bucket (rows) -> path; a step of ``rows`` rows takes the path of the
            smallest bucket >= rows; above the largest bucket, None (the layers' rules).
    """

    table: dict[int, str]

    def __post_init__(self) -> None:
        # every quantized linear asks on every step: the buckets sorted once
        self._order = sorted(self.table.items())

    def path_for(self, rows: int) -> str | None:
        """The path for a step of ``rows`` rows, or None (no choice made for it)."""
        for b, path in self._order:
            if rows <= b:
                return path
        return None

    def describe(self, times: dict[int, dict[str, float]] | None = None) -> str:
        """E.g. "b<=1 fused 2.4 ms (gemv 3.1, torch 9.0); b<=32 dense 20.1 ms (...)":
        consecutive buckets with the same path merged, times in milliseconds."""
        parts, buckets = [], sorted(self.table)
        for i, b in enumerate(buckets):
            if i + 1 < len(buckets) and self.table[buckets[i + 1]] == self.table[b] and not times:
                continue
            path = self.table[b]
            text = f"b<={b} {path}"
            if times and b in times:
                others = ", ".join(f"{p} {t * 1e3:.1f}" for p, t in times[b].items() if p != path)
                text += f" {times[b][path] * 1e3:.1f} ms" + (f" ({others})" if others else "")
            parts.append(text)
        return "; ".join(parts)


def _usage() -> tuple[float, int]:
    """(CPU seconds of the process, its involuntary context switches so far)."""
    u = resource.getrusage(resource.RUSAGE_SELF)
    return u.ru_utime + u.ru_stime, u.ru_nivcsw


def available_paths(model: torch.nn.Module) -> list[str]:
    """The paths this model's quantized linears can run (empty: nothing to choose)."""
    from houchu.model.qlinear import Int4Linear, Int8Linear

    lins = [m for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear))]
    if not lins or any(m.sz.device.type != "cpu" for m in lins if isinstance(m, Int4Linear)):
        return []
    paths = []
    if getattr(model, "fused", None) is not None:
        paths.append("fused")
    if all(m._cpu_gemv is not None for m in lins):  # noqa: SLF001 (the layers' own state)
        paths.append("gemv")
    if all(isinstance(m, Int4Linear) or m.kernel for m in lins):
        paths.append("torch")
    if all(m._dense is not None for m in lins):  # noqa: SLF001
        paths.append("dense")
    return paths


def attach(model: torch.nn.Module, route: DecodeRoute | None) -> None:
    """Make ``model``'s quantized linears and fused layers follow ``route``."""
    from houchu.model.qlinear import Int4Linear, Int8Linear

    model.route = route
    for m in model.modules():
        if isinstance(m, (Int4Linear, Int8Linear)):
            m.route = route


@dataclass
class Tuned:
    """``tune``'s answer: the route, the measured step times (bucket -> path -> seconds),
    the seconds measuring took (0 when read from the cache), whether it was read from
    the cache, and whether the cores were contended while it measured (then it is not
    stored, and the next start measures again)."""

    route: DecodeRoute
    times: dict[int, dict[str, float]]
    took_s: float
    cached: bool
    contended: bool = False  # measured while the cores were contended: not cached


def tune(
    model: torch.nn.Module,
    buckets: tuple[int, ...],
    step: Callable[[int], None],
    cache_get: Callable[[], dict | None] = lambda: None,
    cache_put: Callable[[dict], None] = lambda v: None,
    reps: int = 3,
) -> Tuned | None:
    """Measure and attach the fastest path per bucket (see the module docstring).

    Args:
        model: the loaded model.
        buckets: decode batch sizes to choose for.
        step: runs one eager decode step of the given number of rows.
        cache_get, cache_put: read / store the measurement (a JSON-able dict).
        reps: timed steps per (bucket, path), the best taken, after one warm-up step.
    Returns:
        None when there is nothing to choose (dense weights, fewer than two paths).
    """
    paths = available_paths(model)
    if len(paths) < 2:
        return None
    cached = cache_get()
    if cached and set(cached.get("paths", [])) == set(paths):
        times = {int(b): t for b, t in cached["times"].items()}
        route = DecodeRoute({b: min(t, key=t.get) for b, t in times.items()})
        attach(model, route)
        return Tuned(route, times, 0.0, True)
    t0 = time.perf_counter()
    cpu0, preempted0 = _usage()
    times: dict[int, dict[str, float]] = {}
    live = list(paths)  # a path DROP_ABOVE x slower than the best is not timed further up
    for b in buckets:
        times[b] = {}
        for p in live:
            attach(model, DecodeRoute({max(buckets): p}))
            step(b)  # warm-up (first-call costs, caches)
            best = float("inf")
            for _ in range(reps):
                t = time.perf_counter()
                step(b)
                best = min(best, time.perf_counter() - t)
            times[b][p] = best
        fastest = min(times[b].values())
        live = [p for p in live if times[b][p] <= DROP_ABOVE * fastest]
    route = DecodeRoute({b: min(t, key=t.get) for b, t in times.items()})
    attach(model, route)
    took = time.perf_counter() - t0
    cpu, preempted = _usage()
    share = (cpu - cpu0) / max(took * torch.get_num_threads(), 1e-9)
    contended = preempted > preempted0 and share < CONTENDED_SHARE
    if not contended:  # a measurement taken while other processes held the cores is not kept
        cache_put({"paths": paths, "times": {str(b): t for b, t in times.items()}})
    return Tuned(route, times, took, False, contended)


def tune_model(
    model: torch.nn.Module,
    pool: KVPool,
    backend: AttentionBackend,
    buckets: tuple[int, ...],
    cache: DecisionCache,
    key: str,
) -> Tuned | None:
    """``tune`` on ``model``'s eager decode steps of one-token sequences
    (``batch.warmup_batch``), the buckets that fit ``pool``, kept in ``cache`` under
    ``key``."""
    from houchu.model.batch import warmup_batch

    fit = tuple(b for b in buckets if b <= pool.num_pages)

    def step(rows: int) -> None:
        batch = warmup_batch(
            rows,
            page_size=pool.page_size,
            num_pages=pool.num_pages,
            vocab_size=model.cfg.vocab_size,
        )
        model(batch, pool, backend)

    with torch.inference_mode():
        return tune(
            model,
            fit,
            step,
            cache_get=lambda: cache.get("decode_paths", key),
            cache_put=lambda v: cache.put("decode_paths", key, v),
        )
