"""Decode kernel paths chosen by measurement at startup (``auto``), per batch bucket.

A quantized model's decode step on the CPU can run four ways, and which is fastest
depends on the CPU (its ISA level, cores, caches), the model's shapes and the batch size:

| path | what runs the projections |
|---|---|
| ``fused`` | houchu's C++ decode layers: all layers and the LM head in one call (``fused_cpu``) |
| ``gemv`` | houchu's C++ int4/int8 GEMV, one call per projection |
| ``torch`` | torch's packed int4 / int8 CPU kernels (``_weight_int4pack_mm_for_cpu``, ``_weight_int8pack_mm``) |
| ``dense`` | a kept dense float32/bfloat16 copy through oneDNN (memory for speed) |
| ``fused-a8``, ``gemv-a8`` | as ``fused`` / ``gemv``, the int4 layers' activations quantized to int8 (W4A8, integer dot products: ``cpu_kernels/gemv_a8.h``) |

The ``-a8`` paths exist where the int4 layers run on houchu's C++ GEMV and
``QuantSpec.int4_activations`` is "int8" (then only they are timed) or "auto" in a
float32 model (``a8_candidate``).

The paths round differently, and not only in the last bits of their sums: int8
activations quantize each layer's input, torch's int4 kernel and the dense copy round the
dequantized weights (or their zero points) to the activation dtype, where houchu's GEMV
multiplies the stored codes exactly. On the default model (avx512_bf16, bfloat16
activations) a prompt's top-20 log-probs moved by up to 0.14 nats from ``gemv`` to
``gemv-a8`` and 0.19 from ``gemv`` to ``torch``, while ``fused`` and ``gemv`` gave equal
bits. Were buckets to take paths of different kinds, a request's tokens would depend on
how many rows share its steps (alone or beside others, a cold prompt's prefill or a
cached prompt's short tail). So the kind of kernel (``FAMILIES``: houchu's GEMV with
float activations, "fused" or "gemv"; the same with int8 activations; torch's; the
dense copy) is chosen once per model: ``tune`` times every path, keeps the family whose
fastest path is fastest over the buckets (``choose_family``: the geometric mean of each
family's best time over the bucket's best, the prefill step counted as one more bucket;
a tie keeps the earlier family) and routes every bucket and the prefill to that family's
fastest path. The choice is cached with the route and printed on the start-up line
("every row count on one kernel family: houchu's GEMV, int8 activations (float 1.31x
the time, torch 2.40x)"). The paths left in one family, "fused" and "gemv", run the
same kernels.

Where the thread governor should start (``houchu.cpu.threads``) is measured too: each
timed bucket's path at one thread fewer (``thread_priors``).

``tune`` times one decode step of each available path at every decode bucket (best of a
few, after a warm-up; a path four times slower than a bucket's best is not timed at the
larger ones), keeps the fastest per bucket (of the family chosen above) in a
``DecodeRoute`` that the model's quantized linears and the fused layers consult, and
caches the result (``DecisionCache``, keyed by the model file, its format, the CPU, the
ISA level and kernel build, the thread count and torch's version), so a second start
only reads it. Measuring stops at a time budget (``TUNE_BUDGET_S``):
buckets not yet timed then take the last timed bucket's path (each bucket times that
path first), a bucket cut short chooses among the paths it timed, and a prefill choice
cut short is not made. A measurement cut short or taken on contended cores is cached as
provisional: a later start uses it while its cores are still busy (a few probe steps
tell), and measures again once they are quiet. Steps of more rows than the largest
bucket (prefill) take the path of that family a one-sequence prefill measured fastest
among ``dense``, ``gemv`` and ``gemv-a8`` (``DecodeRoute.prefill``), else the family's own
path (``FAMILY_PATH``), never the layers' row rules.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch

from houchu.cpu.load import wait_share, waited
from houchu.model.linear.decode_route import DecodeRoute

if TYPE_CHECKING:
    from houchu.model.attention.base import AttentionBackend
    from houchu.model.kv.pool import KVPool
    from houchu.runner.decisions import DecisionCache

PATHS = ("fused", "gemv", "torch", "dense", "fused-a8", "gemv-a8")
FUSED_PATHS = ("fused", "fused-a8")  # every layer in one C++ call (``fused_cpu``)
PREFILL_PATHS = ("dense", "gemv", "gemv-a8")  # timed on a prefill-sized step
PREFILL_TOKENS = 128  # the prompt length of that step
CONTENDED_WAIT = 0.2  # of the threads' wall time spent waiting for a core: above it not kept
DROP_ABOVE = 4.0  # a path this many times slower than a bucket's best is not timed further
TUNE_BUDGET_S = 15.0  # wall seconds of measuring (4.5-8.7 s on 2 quiet cores): then it stops
PROBE_STEPS = 8  # steps that tell whether the cores are still busy, before a provisional
A8 = "-a8"  # the suffix of the int8-activation paths
PRIOR_GAIN = 0.03  # a thread fewer starts a bucket where its step measured this much faster


#: the kernel families, in the order a tie keeps them: houchu's GEMV (op by op or in the
#: fused layers: the same kernels and sums) with float activations, the same with int8
#: activations, torch's packed kernels, the dense copy
FAMILIES = ("float", "int8", "torch", "dense")
#: the start-up line's words for each
FAMILY_TEXT = {
    "float": "houchu's GEMV, float activations",
    "int8": "houchu's GEMV, int8 activations",
    "torch": "torch's packed kernels",
    "dense": "the dense copy",
}
#: the path of a family that steps of a bucket it timed nothing at take
FAMILY_PATH = {"float": "gemv", "int8": "gemv-a8", "torch": "torch", "dense": "dense"}


def path_family(path: str) -> str:
    """The kernel family of a path ("fused" and "gemv": "float"; the ``-a8`` paths:
    "int8"; "torch"; "dense")."""
    if path.endswith(A8):
        return "int8"
    return path if path in ("torch", "dense") else "float"


def choose_family(
    times: dict[int, dict[str, float]], prefill_times: dict[str, float] | None = None
) -> tuple[str | None, dict[str, float]]:
    """The kernel family every bucket runs (None: one family was timed, nothing to
    choose) and how many times slower each other family measured: the geometric mean
    over the buckets (and the prefill step, for the families that have a prefill path)
    of a family's fastest time over the fastest of all, a family not timed at a bucket
    counted ``DROP_ABOVE`` times slower there (it dropped out, or was cut short). A tie
    keeps the first of ``FAMILIES``."""
    rows = [t for t in times.values() if t]
    timed = {path_family(p) for t in rows for p in t}
    if len(timed) < 2:
        return None, {}
    score = {}
    for fam in (f for f in FAMILIES if f in timed):
        logs = []
        for t in rows:
            own = [s for p, s in t.items() if path_family(p) == fam]
            logs.append(math.log(min(own) / min(t.values()) if own else DROP_ABOVE))
        if prefill_times and any(path_family(p) == fam for p in prefill_times):
            own = [s for p, s in prefill_times.items() if path_family(p) == fam]
            logs.append(math.log(min(own) / min(prefill_times.values())))
        score[fam] = math.exp(sum(logs) / len(logs))
    fam = min(score, key=score.get)  # the first of FAMILIES on a tie
    return fam, {f: score[f] / score[fam] for f in score if f != fam}


def _in_family(path: str, fam: str | None, paths: list[str]) -> str:
    """``path``'s counterpart in ``fam`` ("fused" <-> "fused-a8", "gemv" <-> "gemv-a8",
    else the family's ``FAMILY_PATH``), for a bucket where no path of ``fam`` was timed."""
    if fam is None or path_family(path) == fam:
        return path
    base = path.removesuffix(A8)
    want = {"float": base, "int8": base + A8}.get(fam, FAMILY_PATH[fam])
    return want if want in paths else FAMILY_PATH[fam]


def _route_of(
    buckets: list[int],
    times: dict[int, dict[str, float]],
    table: dict[int, str],
    prefill_times: dict[str, float] | None,
    paths: list[str],
) -> tuple[DecodeRoute, str | None, dict[str, float]]:
    """The route of one kernel family (``choose_family``): each timed bucket takes its
    family's fastest path; a bucket where it timed none takes the nearest bucket's that
    did (the smaller first), else ``table``'s path's counterpart; the prefill its
    family's fastest, else its ``FAMILY_PATH`` (so that steps above the largest bucket
    run that family too, not the layers' row rules)."""
    fam, slower = choose_family(times, prefill_times)

    def mine(p: str) -> bool:
        return fam is None or path_family(p) == fam

    best: dict[int, str] = {}
    for b in buckets:
        own = {p: s for p, s in times.get(b, {}).items() if mine(p)}
        if own:
            best[b] = min(own, key=own.get)
    out: dict[int, str] = {}
    for b in buckets:
        near = sorted(best, key=lambda x: (x > b, abs(x - b)))
        out[b] = best[near[0]] if near else _in_family(table[b], fam, paths)
    pre = {p: s for p, s in (prefill_times or {}).items() if mine(p)}
    prefill = min(pre, key=pre.get) if pre else None
    timed = {path_family(p) for p in out.values()}  # one family (chosen, or the only one)
    if prefill is None and len(timed) == 1 and FAMILY_PATH[min(timed)] in paths:
        prefill = FAMILY_PATH[min(timed)]
    return DecodeRoute(dict(sorted(out.items())), prefill), fam, slower


def available_paths(model: torch.nn.Module) -> list[str]:
    """The paths this model's quantized linears can run (empty: nothing to choose)."""
    from houchu.model.linear.quantized import Int4Linear, Int8Linear

    lins = [m for m in model.modules() if isinstance(m, (Int4Linear, Int8Linear))]
    int4 = [m for m in lins if isinstance(m, Int4Linear)]
    if not lins or any(m.sz.device.type != "cpu" for m in int4):
        return []
    paths = []
    fused = getattr(model, "fused", None) is not None
    gemv = all(m.has_gemv for m in lins)
    if fused:
        paths.append("fused")
    if gemv:
        paths.append("gemv")
    if all(isinstance(m, Int4Linear) or m.kernel for m in lins):
        paths.append("torch")
    if all(m.has_dense for m in lins):
        paths.append("dense")
    # the layers' option; an LM head as stored (float_out) keeps float activations whatever
    # it is, and does not count (with it, --int4-activations int8 left the float paths in)
    acts = {m.activations for m in int4 if not m.float_out}
    if int4 and gemv and a8_candidate(acts, model_dtype(model)):
        if acts == {"int8"}:  # forced: the float paths are not choices
            paths = []
        paths += ["fused-a8"] if fused else []
        paths.append("gemv-a8")
    return paths


def a8_candidate(activations: set[str], model_dtype: torch.dtype) -> bool:
    """Whether the int8-activation paths are timed: always where the layers ask for
    "int8"; with "auto" only in a float32 model (its layer inputs are quantized to int8
    from float32, or from their bfloat16 rounding where the int4 layers compute in
    bfloat16). SmolLM2's top-1 agreement with the exact path on the English quality text,
    int4 x int8 activations: 0.965 with float32 layer inputs (torch held to AVX2), 0.964
    with float32 rounded to bfloat16 (avx512_bf16; ``test_quant_quality``'s ``int4-a8``),
    but 0.947 in a bfloat16 model (its residual stream rounded too), below the 95% the
    quantized paths keep."""
    if "int8" in activations:
        return True
    return "auto" in activations and model_dtype == torch.float32


def model_dtype(model: torch.nn.Module) -> torch.dtype:
    """The dtype of ``model``'s floating-point parameters (its residual stream's: the
    embeddings and norms; quantized linears keep their weights in buffers)."""
    for p in model.parameters():
        if p.is_floating_point():
            return p.dtype
    return torch.float32


#: ISA levels where houchu's int4 GEMV sums a row in one order at every tile size
#: (``int4_gemv(batch_invariant=True)``) at no measurable cost (3072x576, 1-16 rows; at
#: ``avx2`` it costs about 1.4x from 4 rows up): there the float paths' GEMV runs so by
#: default, and a row's output does not depend on the rows beside it
FREE_INVARIANT_LEVELS = ("avx512", "avx512_bf16")


def invariant_where_free(model: torch.nn.Module) -> bool:
    """Turn on the int4 GEMV's batch-invariant sums (float activations) at the ISA
    levels where they cost nothing (``FREE_INVARIANT_LEVELS``); whether it did."""
    from houchu.cpu import kernels as cpu_kernels
    from houchu.model.linear.quantized import Int4Linear

    if not cpu_kernels.is_loaded() or cpu_kernels.active_level() not in FREE_INVARIANT_LEVELS:
        return False
    for m in model.modules():
        if isinstance(m, Int4Linear):
            m.batch_invariant = True
    if getattr(model, "fused", None) is not None:  # the fused layers' GEMVs too
        model.fused.batch_invariant = True
    return True


def attach(model: torch.nn.Module, route: DecodeRoute | None) -> None:
    """Make ``model``'s quantized linears and fused layers follow ``route``."""
    from houchu.model.linear.quantized import Int4Linear, Int8Linear

    model.route = route
    for m in model.modules():
        if isinstance(m, (Int4Linear, Int8Linear)):
            m.route = route


@dataclass
class Tuned:
    """``tune``'s answer.

    Attributes:
        route: the path per bucket.
        times: bucket -> path -> seconds of one decode step (buckets not timed absent).
        took_s: seconds measuring took (0 when read from the cache).
        cached: read from the cache.
        contended: the cores were contended while it measured (wait share above
            ``CONTENDED_WAIT``), or, read from the cache, while the probe steps ran.
        prefill_times: path -> seconds of the prefill step, or None.
        truncated: measuring reached ``TUNE_BUDGET_S`` (buckets or rounds left out).
        provisional: measured contended or truncated: cached so, and measured again by
            the first later start whose cores are quiet.
        stored: (measured) the cache took it; False where it could not be written.
        family: the kernel family of every bucket and the prefill (``choose_family``),
            None where only one was timed.
        others_slower: each other family's measured time over the chosen one's.
        fewer_threads: bucket -> seconds of one step of the route's path at one thread
            fewer than the runner's (where the budget left time): the thread governor's
            first count per decode bucket (``thread_priors``).
    """

    route: DecodeRoute
    times: dict[int, dict[str, float]]
    took_s: float
    cached: bool
    contended: bool = False
    prefill_times: dict[str, float] | None = None
    truncated: bool = False
    provisional: bool = False
    stored: bool = True  # measured: whether the cache took it
    #: the kernel family every bucket runs (``FAMILIES``; None: no choice)
    family: str | None = None
    #: family -> how many times slower it measured than ``family`` (``choose_family``)
    others_slower: dict[str, float] | None = None
    #: bucket -> seconds of the route's step at one thread fewer (``thread_priors``)
    fewer_threads: dict[int, float] | None = None


def tune(
    model: torch.nn.Module,
    buckets: tuple[int, ...],
    step: Callable[[int], None],
    cache_get: Callable[[], dict | None] = lambda: None,
    cache_put: Callable[[dict], bool | None] = lambda v: False,
    reps: int = 3,
    prefill_step: Callable[[], None] | None = None,
    budget_s: float | None = None,
) -> Tuned | None:
    """Measure and attach the fastest path per bucket (see the module docstring).

    Args:
        model: the loaded model.
        buckets: decode batch sizes to choose for.
        step: runs one eager decode step of the given number of rows.
        cache_get, cache_put: read / store the measurement (a JSON-able dict);
            ``cache_put`` returns False where it could not store it.
        reps: timed steps per (bucket, path), the best taken, after one warm-up step:
            one in a first round over the buckets in order (where the slow paths drop
            out), the rest in later rounds over every pair timed, so that a passing
            burst of other work cannot spoil all of one pair's steps.
        prefill_step: runs one eager prefill step of more rows than the largest bucket
            (None: no prefill path is chosen).
        budget_s: seconds of measuring after which no further step is timed (the step
            running then finishes: the budget is overrun by at most one path's warm-up and
            timed step); None: ``TUNE_BUDGET_S``.
    Returns:
        None when there is nothing to choose (dense weights, fewer than two paths).
    """
    paths = available_paths(model)
    if len(paths) < 2:
        return None
    cached = cache_get()
    if cached and set(cached.get("paths", [])) == set(paths):
        kept = _from_cache(cached, paths)
        attach(model, kept.route)
        if not kept.provisional:
            return kept
        kept.contended = _cores_busy(step, buckets)
        if kept.contended:  # still busy: the provisional answer stands
            return kept
    budget = TUNE_BUDGET_S if budget_s is None else budget_s
    return _measure(model, paths, buckets, step, cache_put, reps, prefill_step, budget)


def _from_cache(entry: dict, paths: list[str]) -> Tuned:
    """The ``Tuned`` a cache entry holds (its route derived again from its times)."""
    times = {int(b): t for b, t in entry["times"].items()}
    table = {int(b): p for b, p in entry.get("table", {}).items()}
    pre = entry.get("prefill_times") or None
    route, fmt, slower = _route_of(sorted(table), times, table, pre, paths)
    provisional = bool(entry.get("provisional"))
    fewer = {int(b): s for b, s in (entry.get("fewer_threads") or {}).items()}
    return Tuned(
        route,
        times,
        0.0,
        True,
        prefill_times=pre,
        provisional=provisional,
        family=fmt,
        others_slower=slower,
        fewer_threads=fewer or None,
    )


def _cores_busy(step: Callable[[int], None], buckets: tuple[int, ...]) -> bool:
    """Whether each of ``PROBE_STEPS`` decode steps of the smallest bucket spent more
    than ``CONTENDED_WAIT`` of its threads' time waiting for a core. Other processes that
    hold the cores make every step wait; houchu's own actors starting beside the runner
    come in bursts, which some steps miss."""
    if not buckets:
        return False
    threads = torch.get_num_threads()
    for _ in range(PROBE_STEPS):
        t0, waited0 = time.perf_counter(), waited()
        step(min(buckets))
        if wait_share(waited() - waited0, time.perf_counter() - t0, threads) <= CONTENDED_WAIT:
            return False
    return True


def _measure(
    model: torch.nn.Module,
    paths: list[str],
    buckets: tuple[int, ...],
    step: Callable[[int], None],
    cache_put: Callable[[dict], bool | None],
    reps: int,
    prefill_step: Callable[[], None] | None,
    budget_s: float,
) -> Tuned:
    """``tune``'s measurement (its arguments), within ``budget_s`` seconds."""
    t0 = time.perf_counter()
    waited0 = waited()

    def over() -> bool:
        return time.perf_counter() - t0 > budget_s

    times: dict[int, dict[str, float]] = {}
    table: dict[int, str] = {}
    live = list(paths)  # a path DROP_ABOVE x slower than the best is not timed further up
    truncated = False
    for b in buckets:  # the first round: a warm-up and one timed step each
        if times and over():  # out of time: the last timed bucket's path, untimed
            table[b], truncated = table[max(times)], True
            continue
        times[b] = {}
        if table:  # the last bucket's winner first: timed whatever the budget leaves
            live.sort(key=lambda p: p != table[max(table)])
        for p in live:
            if times[b] and over():  # the paths left are not timed at this bucket
                truncated = True
                break
            attach(model, DecodeRoute({max(buckets): p}))
            times[b][p] = _best_of(lambda b=b: step(b), 1)
        table[b] = min(times[b], key=times[b].get)
        fastest = times[b][table[b]]
        live = [p for p in live if p not in times[b] or times[b][p] <= DROP_ABOVE * fastest]
    pre: dict[str, float] = {}
    candidates = [p for p in PREFILL_PATHS if p in paths]
    if prefill_step is None or len(candidates) < 2:
        candidates = []
    for p in candidates:
        if over():  # a choice among some of them could be the slow one: none is made
            pre, candidates, truncated = {}, [], True
            break
        attach(model, DecodeRoute({max(buckets): p}, prefill=p))
        pre[p] = _best_of(prefill_step, 1)
    for _ in range(reps - 1):  # more rounds, across every (bucket, path) timed: a burst
        if over():  # of other work (an actor starting) slows one step of each, not all
            truncated = True  # the steps of one
            break
        for b, by_path in times.items():
            for p in by_path:
                if over():
                    break
                attach(model, DecodeRoute({max(buckets): p}))
                by_path[p] = min(by_path[p], _timed(lambda b=b: step(b)))
        for p in candidates:
            if over():
                break
            attach(model, DecodeRoute({max(buckets): p}, prefill=p))
            pre[p] = min(pre[p], _timed(prefill_step))
    table |= {b: min(t, key=t.get) for b, t in times.items()}
    route, fmt, slower = _route_of(list(buckets), times, table, pre or None, paths)
    table = dict(route.table)
    attach(model, route)
    fewer = _fewer_threads(times, step, over)
    took = time.perf_counter() - t0
    contended = wait_share(waited() - waited0, took, torch.get_num_threads()) > CONTENDED_WAIT
    provisional = contended or truncated  # measured again once a start finds quiet cores
    stored = cache_put(
        {
            "paths": paths,
            "times": {str(b): t for b, t in times.items()},
            "table": {str(b): p for b, p in table.items()},
            "prefill_times": pre,
            "provisional": provisional,
            "fewer_threads": {str(b): s for b, s in fewer.items()},
        }
    )
    return Tuned(
        route,
        times,
        took,
        False,
        contended,
        pre or None,
        truncated,
        provisional,
        stored=stored is not False,
        family=fmt,
        others_slower=slower,
        fewer_threads=fewer or None,
    )


def _fewer_threads(
    times: dict[int, dict[str, float]], step: Callable[[int], None], over: Callable[[], bool]
) -> dict[int, float]:
    """Seconds of one step of each timed bucket on the attached route at one thread fewer
    than torch's count (after a warm-up), while the budget lasts ({} at one thread)."""
    n = torch.get_num_threads()
    got: dict[int, float] = {}
    if n < 2:
        return got
    torch.set_num_threads(n - 1)
    try:
        for b in times:
            if over():
                break
            got[b] = _best_of(lambda b=b: step(b), 1)
    finally:
        torch.set_num_threads(n)
    return got


def thread_priors(tuned: Tuned | None, threads: int) -> dict[str, dict[str, dict]]:
    """The thread governor's first count per decode kind (``ThreadGovernor.cached``'s
    "measured" entries) from a quiet startup measurement: one thread fewer where the
    route's step measured at least ``PRIOR_GAIN`` faster so, else ``threads``."""
    from houchu.cpu.threads import step_key

    if tuned is None or tuned.provisional or not tuned.fewer_threads:
        return {}
    out: dict[str, dict[str, dict]] = {}
    for b, fewer in tuned.fewer_threads.items():
        best = tuned.times.get(b, {}).get(tuned.route.table.get(b, ""))
        if best is None:
            continue
        n = threads - 1 if fewer < (1 - PRIOR_GAIN) * best else threads
        out[step_key(b, all_decode=True)] = {"measured": {"threads": n}}
    return out


def _timed(run: Callable[[], None]) -> float:
    """Seconds one call of ``run`` takes."""
    t = time.perf_counter()
    run()
    return time.perf_counter() - t


def _best_of(run: Callable[[], None], reps: int) -> float:
    """The fastest of ``reps`` timed calls of ``run``, after one warm-up call (seconds)."""
    run()  # first-call costs, caches
    best = float("inf")
    for _ in range(reps):
        t = time.perf_counter()
        run()
        best = min(best, time.perf_counter() - t)
    return best


def tune_model(
    model: torch.nn.Module,
    pool: KVPool,
    backend: AttentionBackend,
    buckets: tuple[int, ...],
    cache: DecisionCache,
    key: str,
) -> Tuned | None:
    """``tune`` on ``model``'s eager decode steps of one-token sequences
    (``batch.warmup_batch``), the buckets that fit ``pool``, and a prefill of one
    ``PREFILL_TOKENS``-token prompt where the pool holds it, kept in ``cache`` under
    ``key``."""
    from houchu.model.batch import prefill_warmup_batch, warmup_batch

    fit = tuple(b for b in buckets if b <= pool.num_pages)
    tokens = min(PREFILL_TOKENS, pool.num_pages * pool.page_size)

    def step(rows: int) -> None:
        batch = warmup_batch(
            rows,
            page_size=pool.page_size,
            num_pages=pool.num_pages,
            vocab_size=model.cfg.vocab_size,
        )
        model(batch, pool, backend)

    def prefill() -> None:
        batch = prefill_warmup_batch(
            tokens,
            page_size=pool.page_size,
            num_pages=pool.num_pages,
            vocab_size=model.cfg.vocab_size,
        )
        model(batch, pool, backend)

    invariant_where_free(model)  # before the GEMV is timed
    with torch.inference_mode():
        return tune(
            model,
            fit,
            step,
            cache_get=lambda: cache.get("decode_paths", key),
            cache_put=lambda v: cache.put("decode_paths", key, v),
            prefill_step=prefill if fit and tokens > max(fit) else None,
        )
