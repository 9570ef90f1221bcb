"""Decode paths chosen by measurement (``houchu.runner.autotune``): every path a route names
really runs and gives the same greedy tokens, the choice is the fastest measured, and a
second start reads it from the cache instead of measuring."""

from __future__ import annotations

import os
import time

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.batch import build_batch
from houchu.runner.autotune import FAMILY_TEXT, DecodeRoute, a8_candidate, attach, path_family
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

pytestmark = [pytest.mark.usefixtures("cpu_isa"), pytest.mark.slow]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("HOUCHU_DECISION_CACHE", str(tmp_path / "decisions.json"))


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=5)


def _runner(path, **kw) -> ModelRunner:
    args = {"page_size": 4, "num_pages": 48, "quantization": "int4"}
    return ModelRunner(path, exact(**(args | kw), decode_batch_sizes=(1, 2, 4)), quiet=True)


def _decode_logits(r: ModelRunner) -> torch.Tensor:
    """Logits ``[2, V]`` of one decode step of two sequences after their prefill."""
    prompts = {"a": [1, 5, 9, 33], "b": [7, 7, 100, 4, 2]}
    tables = {x: list(range(i * 8, i * 8 + 8)) for i, x in enumerate(prompts)}
    g = SamplingParams(temperature=0.0, ignore_eos=True)
    init = [SeqInit(rid=x, sampling=g, prompt_ids=p) for x, p in prompts.items()]
    work = [
        SeqWork(rid=x, token_ids=p, start_pos=0, page_table=tables[x], sample=True)
        for x, p in prompts.items()
    ]
    r.execute(StepPlan(step_id=0, init=init, work=work))
    work = [
        SeqWork(rid=x, token_ids=[11], start_pos=len(p), page_table=tables[x], sample=True)
        for x, p in prompts.items()
    ]
    batch = build_batch(
        work,
        page_size=r.pool.page_size,
        num_pages=r.pool.num_pages,
        max_context=r.max_context,
        vocab_size=r.config.vocab_size,
    )
    with torch.inference_mode():
        return r.model(batch, r.pool, r.backend).float()


def test_auto_measures_then_reads_the_cache(tiny, monkeypatch):
    import houchu.runner.autotune as autotune

    monkeypatch.setattr(autotune, "CONTENDED_WAIT", float("inf"))  # however busy this machine is
    monkeypatch.setattr(autotune, "TUNE_BUDGET_S", float("inf"))  # and however slow
    r = _runner(tiny, decode_paths="auto", int4_activations="auto")
    assert r.tuned is not None and not r.tuned.cached
    t = r.tuned
    assert set(t.times) == {1, 2, 4}
    a8 = {"fused-a8", "gemv-a8"}  # a float32 model: int8 activations are candidates
    fam = t.family  # one kernel family for every bucket, printed
    assert fam in ("float", "int8", "torch")

    def fmt(p: str) -> bool:
        return path_family(p) == fam

    for b, by_path in t.times.items():  # the fastest measured of that family is kept
        own = {p: s for p, s in by_path.items() if fmt(p)}
        assert t.route.table[b] == min(own, key=own.get)
        assert {"fused", "gemv", "torch"} | a8 <= set(by_path) or b > 1
    pre = t.prefill_times  # a prefill-sized step, timed per path, the fastest kept
    assert pre is not None and {"gemv"} | (a8 - {"fused-a8"}) <= set(pre)
    own = {p: s for p, s in pre.items() if fmt(p)}
    want = min(own, key=own.get) if own else {"torch": "torch"}[fam]
    assert t.route.prefill == want == t.route.path_for(1000)
    assert "decode paths b<=1" in r.summary() and "prefill " in r.summary()
    assert f"every row count on one kernel family: {FAMILY_TEXT[fam]}" in r.summary()
    if torch.get_num_threads() > 1:  # the route timed at a thread fewer: the governor's start
        assert set(t.fewer_threads) == {1, 2, 4}
    again = _runner(tiny, decode_paths="auto", int4_activations="auto")
    assert again.tuned.cached and again.tuned.route == t.route
    assert again.tuned.fewer_threads == t.fewer_threads
    assert again.tuned.prefill_times == pre
    info = again.info()  # /stats: the startup line's route, prefill times and how
    assert info.cpu_isa and info.decode_paths == again.decode_paths()
    assert "prefill " in info.decode_paths and "[cached measurement]" in info.decode_paths


@pytest.mark.parametrize("path", ["fused", "gemv", "torch", "dense", "fused-a8", "gemv-a8"])
def test_every_path_runs_and_agrees(tiny, path):
    """The path a route names is the one that runs, and computes the same logits as the
    threshold rules up to the activation dtype's rounding (bfloat16 here where the CPU
    has it: greedy tokens of a tiny random model can then flip at exact ties) and, on
    the -a8 paths, the int8 activations' (a few percent)."""
    ref = _decode_logits(_runner(tiny, decode_paths="rules"))
    r = _runner(tiny, int4_activations="auto")
    attach(r.model, DecodeRoute({4: path}, prefill="gemv-a8" if "a8" in path else None))
    before = r.model.fused.steps
    got = _decode_logits(r)
    assert (r.model.fused.steps > before) == path.startswith("fused")
    scale = ref.abs().amax()
    tol = 6e-2 if path.endswith("-a8") else 2e-2
    torch.testing.assert_close(got / scale, ref / scale, atol=tol, rtol=0)
    if path.endswith("-a8"):  # int8 activations did run: not the float path's values
        assert not torch.allclose(got / scale, ref / scale, atol=1e-4, rtol=0)


def test_int4_activations_option_sets_the_choices(tiny):
    from houchu.runner.autotune import available_paths

    auto = available_paths(_runner(tiny, int4_activations="auto").model)
    assert {"fused", "gemv"} <= set(auto)
    # auto times int8 activations in a float32 model, whatever the int4 layers compute in
    assert {"fused-a8", "gemv-a8"} <= set(auto)
    assert not any(
        p.endswith("-a8") for p in available_paths(_runner(tiny, int4_activations="float").model)
    )
    int8 = _runner(tiny, int4_activations="int8", decode_paths="rules")
    assert available_paths(int8.model) == ["fused-a8", "gemv-a8"]
    # without a route the option decides: int8 activations on every step, fused or not
    routed = _runner(tiny, int4_activations="int8", decode_paths="rules")
    attach(routed.model, DecodeRoute({4: "fused-a8"}, prefill="gemv-a8"))
    torch.testing.assert_close(_decode_logits(int8), _decode_logits(routed), atol=0, rtol=0)


def test_int8_activations_are_candidates_only_on_float32_with_auto():
    assert a8_candidate({"auto"}, torch.float32)
    assert not a8_candidate({"auto"}, torch.bfloat16)  # a bfloat16 model: below the 95% bar
    assert a8_candidate({"int8"}, torch.bfloat16)  # asked for: always
    assert not a8_candidate({"float"}, torch.float32)


def test_route_lookup():
    route = DecodeRoute({1: "fused", 8: "gemv", 32: "dense"})
    assert [route.path_for(n) for n in (1, 2, 8, 9, 32, 33)] == [
        "fused",
        "gemv",
        "gemv",
        "dense",
        "dense",
        None,
    ]
    assert route.describe() == "b<=1 fused; b<=8 gemv; b<=32 dense"
    pre = DecodeRoute({1: "fused"}, prefill="gemv-a8")
    assert pre.path_for(1) == "fused" and pre.path_for(2) == pre.path_for(500) == "gemv-a8"
    times = {"gemv-a8": 0.01, "dense": 0.02}
    assert pre.describe(prefill_times=times) == "b<=1 fused; prefill gemv-a8 10.0 ms (dense 20.0)"
    times = {1: {"fused": 0.002, "gemv": 0.003}}
    assert DecodeRoute({1: "fused"}).describe(times) == "b<=1 fused 2.0 ms (gemv 3.0)"
    assert torch.get_num_threads() >= 1


def test_a_measurement_under_contention_is_provisional(tiny, monkeypatch):
    """Measured on busy cores: cached as provisional. A later start on busy cores uses it
    (its probe steps wait), the first start on quiet cores measures again and keeps that."""
    import houchu.runner.autotune as autotune

    calls = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(autotune, "waited", lambda: float(next(calls)))  # 1000 s waited
    r = _runner(tiny, decode_paths="auto")
    assert r.tuned.contended and r.tuned.provisional and not r.tuned.cached
    assert "cores contended; cached as provisional" in r.decode_paths()
    busy = _runner(tiny, decode_paths="auto")
    assert busy.tuned.cached and busy.tuned.provisional and busy.tuned.contended
    assert busy.tuned.route == r.tuned.route
    assert "provisional cached measurement; cores still busy" in busy.decode_paths()
    monkeypatch.setattr(autotune, "waited", lambda: 0.0)  # the cores are quiet now
    quiet = _runner(tiny, decode_paths="auto")
    assert not quiet.tuned.cached and not quiet.tuned.provisional  # measured anew
    again = _runner(tiny, decode_paths="auto")
    assert again.tuned.cached and not again.tuned.provisional
    assert "[cached measurement]" in again.decode_paths()


def test_a_measurement_the_cache_did_not_take_says_so(tiny, tmp_path, monkeypatch):
    """An unwritable decision cache: the start-up line says "not cached", never "cached
    as provisional" (found by a review)."""
    import houchu.runner.autotune as autotune

    blocker = tmp_path / "afile"
    blocker.write_text("")
    monkeypatch.setenv("HOUCHU_DECISION_CACHE", str(blocker / "d.json"))
    calls = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(autotune, "waited", lambda: float(next(calls)))  # contended
    r = _runner(tiny, decode_paths="auto")
    assert r.tuned.provisional and not r.tuned.stored
    assert "not cached" in r.decode_paths() and "cached as provisional" not in r.decode_paths()


def test_measuring_stops_at_its_time_budget(monkeypatch):
    """Past the budget no bucket is timed: the ones left take the last timed bucket's
    path, the answer is cached as provisional, and a cached copy routes the same."""
    import types

    import houchu.runner.autotune as autotune

    clock = [0.0]  # the steps' time, on a clock of the test's own
    current: dict[str, str] = {}
    stored: list[dict] = []

    def step(rows: int) -> None:
        clock[0] += {"fused": 0.002, "gemv": 0.004}[current["path"]] * rows

    def attach(model, route):
        current["path"] = route.table[max(route.table)]

    monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(autotune, "available_paths", lambda m: ["fused", "gemv"])
    monkeypatch.setattr(autotune, "attach", attach)
    monkeypatch.setattr(autotune, "waited", lambda: 0.0)
    tuned = autotune.tune(
        torch.nn.Module(), (1, 2, 4), step, cache_put=stored.append, budget_s=0.001
    )
    assert tuned.truncated and tuned.provisional and not tuned.contended
    assert set(tuned.times) == {1}  # only the first bucket timed
    assert tuned.route.table == {1: "fused", 2: "fused", 4: "fused"}
    entry = stored[-1]
    assert entry["provisional"]
    calls = iter(range(0, 10**9, 1000))
    monkeypatch.setattr(autotune, "waited", lambda: float(next(calls)))  # busy probe steps
    cached = autotune.tune(torch.nn.Module(), (1, 2, 4), step, cache_get=lambda: entry)
    assert cached.cached and cached.route == tuned.route and cached.contended
    monkeypatch.setattr(autotune, "waited", lambda: 0.0)  # quiet: measured again in full
    full = autotune.tune(torch.nn.Module(), (1, 2, 4), step)
    assert not full.truncated and set(full.times) == {1, 2, 4}


def test_the_budget_is_overrun_by_one_path_at_most(monkeypatch):
    """The budget is checked before every path's steps (the reviewer saw 24.9 s against
    15 s when it was checked between buckets only): the measurement ends within one
    path's warm-up and timed step past it, each bucket timed the last winner first."""
    import types

    import houchu.runner.autotune as autotune

    clock = [0.0]
    current: dict[str, str] = {}
    cost = {"fused": 0.010, "gemv": 0.020, "torch": 0.030}  # seconds per row

    def step(rows: int) -> None:
        clock[0] += cost[current["path"]] * rows

    def attach(model, route):
        current["path"] = route.table[max(route.table)]

    monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(autotune, "available_paths", lambda m: ["torch", "gemv", "fused"])
    monkeypatch.setattr(autotune, "attach", attach)
    monkeypatch.setattr(autotune, "waited", lambda: 0.0)
    buckets, budget = (1, 8, 32), 0.5
    tuned = autotune.tune(torch.nn.Module(), buckets, step, budget_s=budget)
    one_path = 2 * cost["torch"] * max(buckets)  # a warm-up and a timed step, the slowest
    assert tuned.truncated and clock[0] <= budget + one_path
    assert list(tuned.times[8])[0] == "fused"  # b=1's winner timed first at b=8
    assert tuned.route.path_for(32) == "fused"
    cut = [b for b in buckets if b not in tuned.times or len(tuned.times[b]) < 3]
    assert cut, "the budget cut a bucket short"


def _spin(seconds: float) -> None:
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


def test_waiting_for_a_core_is_seen_when_other_processes_hold_them():
    """Two busy processes per core of this one: its thread waits for most of the time
    it is runnable, and ``waited`` sees it (run_delay, not CPU share)."""
    import multiprocessing

    from houchu.cpu.load import wait_share, waited
    from houchu.runner.autotune import CONTENDED_WAIT

    mask = os.sched_getaffinity(0)
    os.sched_setaffinity(0, {min(mask)})  # this thread on one core
    ctx = multiprocessing.get_context("spawn")
    busy = [ctx.Process(target=_spin, args=(4.0,)) for _ in range(2 * len(mask))]
    try:
        for p in busy:
            p.start()
        time.sleep(1.0)  # the busy processes are up and spinning
        w0, t0 = waited(), time.perf_counter()
        _spin(1.0)
        share = wait_share(waited() - w0, time.perf_counter() - t0, 1)
    finally:
        for p in busy:
            p.terminate()
            p.join()
        os.sched_setaffinity(0, mask)
    assert share > CONTENDED_WAIT


def test_a_burst_of_other_work_at_the_start_does_not_decide_the_route(monkeypatch):
    """The steps timed first run while the other actors start: a path whose first steps
    all fell in such a burst would lose to a slower one. Later rounds time every pair
    again, so the burst spoils one step of each, not the choice."""
    import types

    import houchu.runner.autotune as autotune

    clock = [0.0]  # the steps' time, on a clock of the test's own
    current: dict[str, str] = {}
    calls = iter(range(10**6))

    def step(rows: int) -> None:
        slow = next(calls) < 4  # a warm-up and the first timed steps of "fused" at b=1
        cost = {"fused": 0.002, "gemv": 0.004}[current["path"]]
        clock[0] += 0.03 if slow else cost * rows

    def attach(model, route):
        current["path"] = route.table[max(route.table)]

    monkeypatch.setattr(autotune, "time", types.SimpleNamespace(perf_counter=lambda: clock[0]))
    monkeypatch.setattr(autotune, "available_paths", lambda m: ["fused", "gemv"])
    monkeypatch.setattr(autotune, "attach", attach)
    monkeypatch.setattr(autotune, "waited", lambda: 0.0)
    tuned = autotune.tune(torch.nn.Module(), (1, 2), step, reps=3)
    assert tuned.route.table == {1: "fused", 2: "fused"}, tuned.times


def test_one_kernel_family_for_every_bucket():
    """int8 activations faster at one bucket and float at the others: one family is
    chosen for all of them by the geometric mean of each family's best over the bucket's
    best (the prefill counted as a bucket where the family has a prefill path), ties keep
    the earlier family, and a family not timed at a bucket counts as ``DROP_ABOVE`` times
    slower there. torch's kernels and the dense copy are families of their own."""
    from houchu.runner.autotune import DROP_ABOVE, _route_of, choose_family

    times = {
        1: {"fused": 2.0, "fused-a8": 1.0, "gemv": 3.0},
        4: {"fused": 4.0, "fused-a8": 4.4, "gemv-a8": 5.0},
        16: {"gemv": 8.0, "gemv-a8": 8.4},
    }
    fam, slower = choose_family(times)
    assert fam == "int8" and slower == {"float": pytest.approx((2.0 / 1.1 / 1.05) ** (1 / 3))}
    paths = ["fused", "gemv", "torch", "dense", "fused-a8", "gemv-a8"]
    route, fam, _ = _route_of([1, 4, 16, 32], times, {32: "gemv"}, None, paths)
    assert route.table == {1: "fused-a8", 4: "fused-a8", 16: "gemv-a8", 32: "gemv-a8"}
    assert route.prefill == "gemv-a8"  # untimed in int8: still int8 above the buckets
    pre = {"gemv": 9.0, "gemv-a8": 8.0}  # the prefill counts as one more bucket
    assert _route_of([1, 4, 16], times, {}, pre, paths)[0].prefill == "gemv-a8"
    times[1]["fused"] = 1.0  # a tie at b=1, float ahead elsewhere: float
    route, fam, _ = _route_of([1, 4, 16], times, {}, None, paths)
    assert fam == "float" and route.table == {1: "fused", 4: "fused", 16: "gemv"}
    assert route.prefill == "gemv"  # not the layers' rules (the dense copy from 64 rows)
    assert choose_family({1: {"fused": 1.0, "fused-a8": 1.0}})[0] == "float"
    assert choose_family({1: {"fused": 1.0, "gemv": 2.0}}) == (None, {})  # one family
    # int8 dropped out after b=1 (over DROP_ABOVE x slower): float, its ratio counted there
    fam, slower = choose_family({1: {"gemv": 1.0, "gemv-a8": 5.0}, 2: {"gemv": 1.0}})
    assert fam == "float" and slower["int8"] == pytest.approx((5.0 * DROP_ABOVE) ** 0.5)
    # torch fastest at the large buckets, the GEMV at the small ones: one of them for all
    mixed = {
        1: {"fused": 1.0, "torch": 1.6},
        8: {"fused": 3.0, "torch": 2.7},
        32: {"gemv": 9.0, "torch": 8.0},
    }
    route, fam, slower = _route_of([1, 8, 32], mixed, {}, {"dense": 1.0, "gemv": 1.3}, paths)
    assert fam == "float" and set(route.table.values()) <= {"fused", "gemv"}
    assert route.prefill == "gemv" and set(slower) == {"torch"}


def test_the_thread_governor_starts_where_the_startup_measurement_says():
    """Each bucket's route timed at one thread fewer: a decode kind starts there where it
    measured ``PRIOR_GAIN`` faster, else at all threads; a provisional measurement (cut
    short or on busy cores) gives no start."""
    from houchu.runner.autotune import Tuned, thread_priors

    route = DecodeRoute({1: "fused", 8: "gemv"})
    times = {1: {"fused": 0.010, "gemv": 0.012}, 8: {"gemv": 0.040}}
    t = Tuned(route, times, 1.0, False, fewer_threads={1: 0.009, 8: 0.070})
    assert thread_priors(t, 2) == {
        "decode<=1": {"measured": {"threads": 1}},
        "decode<=8": {"measured": {"threads": 2}},
    }
    t.provisional = True
    assert thread_priors(t, 2) == {} and thread_priors(None, 2) == {}


def test_the_runner_keeps_its_thread_counts_in_the_decision_cache(tiny):
    """What a runner's thread governor settles on is stored under the runner's key and
    is where the next runner of the same model, build and thread budget starts (and is
    not where a runner with another thread budget starts)."""
    r = _runner(tiny)
    assert r.governor is not None
    entry = {"threads": 1, "wait": {"-1": 1.0, "1": 16.0}}
    r.governor.cached["decode<=1"] = {"0": entry}
    r.governor._save(r.governor.cached)  # noqa: SLF001 (what a judged trial does)
    again = _runner(tiny)
    assert again.governor._start_entry("decode<=1", 0) == entry  # noqa: SLF001
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(threads + 1)
        other = _runner(tiny)
        assert other.governor._start_entry("decode<=1", 0) is None  # noqa: SLF001
    finally:
        torch.set_num_threads(threads)


def test_steps_above_the_buckets_stay_in_the_family_when_there_was_no_choice():
    """One family timed (no torch kernel, no dense copy: the float GEMV alone) and no
    prefill timed: the steps above the largest bucket take its GEMV, not the layers'
    rules (which dequantize to the activation dtype from 128 rows)."""
    from houchu.runner.autotune import _route_of

    route, fam, _ = _route_of(
        [1, 8], {1: {"fused": 1.0, "gemv": 2.0}}, {8: "fused"}, None, ["fused", "gemv"]
    )
    assert fam is None and route.table == {1: "fused", 8: "fused"} and route.prefill == "gemv"
