"""The CPU runner's thread governor (``houchu.cpu.threads``): per step kind it keeps the
thread count whose measured cycle time per token is lowest, follows a change of the
machine's load, never measures idle gaps, and judges each kind on its own."""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable

import pytest

from houchu.cpu.threads import CpuLoad, ThreadGovernor, step_key


class FakeMachine:
    """A clock the test drives. ``cost(kind, threads)`` gives a step's seconds and the gap
    after it (the actors' time before the next step starts)."""

    def __init__(self, cost: Callable[[str, int], tuple[float, float]]) -> None:
        self.now = 0.0
        self.cost = cost
        self.set_calls: list[int] = []
        self.g = ThreadGovernor(
            2, probe_every_s=1.0, set_threads=self.set_calls.append, clock=lambda: self.now
        )

    def step(self, kind: str = "decode<=1", tokens: int = 1) -> int:
        """One step of ``kind``; returns the thread count it ran with."""
        ran: list[int] = []

        def body() -> None:
            ran.append(self.g.threads)
            self.now += self.cost(kind, self.g.threads)[0]

        self.g.run(body, kind, tokens)
        self.now += self.cost(kind, ran[0])[1]
        return ran[0]

    def run_for(self, seconds: float, **kw: object) -> list[int]:
        end, used = self.now + seconds, []
        while self.now < end:
            used.append(self.step(**kw))
        return used


def test_step_key_buckets_decode_and_prefill():
    assert step_key(1, all_decode=True) == "decode<=1"
    assert step_key(3, all_decode=True) == "decode<=4"
    assert step_key(16, all_decode=True) == "decode<=16"
    assert step_key(300, all_decode=False) == "prefill<=512"


def test_more_threads_kept_where_they_are_faster():
    m = FakeMachine(lambda kind, t: (0.010 / t, 0.001))  # 2 threads twice as fast
    used = m.run_for(10.0)
    assert m.g.chosen() == {"decode<=1": 2} and m.g.changes == 0
    assert 1 in used  # it did try one thread (each probe), and went back
    assert used.count(1) < 0.05 * len(used)  # trials are a small share of the steps


def test_fewer_threads_chosen_when_they_serve_faster(capsys):
    """2 threads step faster alone but collide with the actors' work: the cycle is longer."""
    m = FakeMachine(lambda kind, t: (0.0033, 0.0025) if t == 2 else (0.0037, 0.0005))
    m.run_for(3.0)
    assert m.g.chosen() == {"decode<=1": 1} and m.g.changes == 1
    # the log line: when (wall clock), which kind, and the cycles per token before and after
    line = re.search(
        r"runner: \d\d:\d\d:\d\d decode<=1: 2 -> 1 threads .*5\.80 -> 4\.20 ms",
        capsys.readouterr().out,
    )
    assert line, "the change is logged with its time, kind and cycle times"
    assert m.run_for(1.0)[-1] == 1


def test_follows_the_load_both_ways():
    busy = {"on": True}

    def cost(kind: str, t: int) -> tuple[float, float]:
        if busy["on"]:  # another process on the cores: a second thread stalls the barriers
            return (0.020, 0.002) if t == 2 else (0.009, 0.002)
        return (0.005, 0.001) if t == 2 else (0.009, 0.001)

    m = FakeMachine(cost)
    m.run_for(3.0)
    assert m.g.chosen() == {"decode<=1": 1}
    busy["on"] = False
    m.run_for(3.0)
    assert m.g.chosen() == {"decode<=1": 2} and m.g.changes == 2


def test_idle_gaps_are_not_measured():
    # every step is followed by 0.2 s of idleness: nothing is ever judged
    m = FakeMachine(lambda kind, t: (0.0033, 0.2) if t == 2 else (0.001, 0.2))
    m.run_for(20.0)
    assert m.g.chosen() == {"decode<=1": 2} and m.g.changes == 0
    assert m.g.kinds["decode<=1"].samples == {}


def test_each_kind_is_judged_on_its_own():
    def cost(kind: str, t: int) -> tuple[float, float]:
        if kind == "decode<=1":  # bandwidth-bound: one thread serves faster
            return (0.0033, 0.0025) if t == 2 else (0.0037, 0.0005)
        return (0.011, 0.002) if t == 2 else (0.020, 0.001)  # batch 16: two threads

    m = FakeMachine(cost)
    end = m.now + 6.0
    while m.now < end:
        m.step("decode<=1", 1)
        m.step("decode<=16", 16)
    assert m.g.chosen() == {"decode<=1": 1, "decode<=16": 2}


def test_one_thread_never_probes():
    calls: list[int] = []
    now = [0.0]
    g = ThreadGovernor(1, set_threads=calls.append, clock=lambda: now[0])
    for _ in range(500):
        g.run(lambda: now.__setitem__(0, now[0] + 0.01), "decode<=1", 1)
    assert calls == [] and g.chosen() == {"decode<=1": 1}


def test_a_losing_direction_is_tried_less_and_less():
    """Contended cores: a second thread stalls a step for a time slice. Each try of two
    threads ends after its first slow step, and the tries thin out (the wait doubles)."""
    m = FakeMachine(lambda kind, t: (0.050, 0.002) if t == 2 else (0.009, 0.002))
    used = m.run_for(40.0)
    assert m.g.chosen() == {"decode<=1": 1}
    first = used.index(1)  # the first second at two threads, then one thread wins
    tries = [i for i in range(first, len(used)) if used[i] == 2]
    assert 3 <= len(tries) <= 7  # waits of 1, 2, 4, 8, 16 s: not one a second
    assert all(b - a > 1 for a, b in zip(tries, tries[1:], strict=False))  # one step each
    assert m.g.kinds["decode<=1"].wait[+1] >= 16


def test_trials_of_long_steps_cost_a_small_share():
    """512-token prefill steps on 2 AVX2 cores: 0.64 s at two threads, 1.14 s at one. A
    one-thread trial is paid for out of the kind's own time, and ends after one slow step
    when it is far slower."""
    m = FakeMachine(lambda kind, t: (0.64, 0.001) if t == 2 else (1.14, 0.001))
    used = m.run_for(120.0, kind="prefill<=512", tokens=512)
    assert m.g.chosen() == {"prefill<=512": 2}
    extra = 0.5 * used.count(1)  # seconds the trials cost
    assert 0 < used.count(1) and extra < 0.03 * 120.0, used.count(1)


def test_a_trial_waits_until_its_kind_has_run_long_enough():
    m = FakeMachine(lambda kind, t: (0.010, 0.001) if t == 2 else (0.012, 0.001))
    used = m.run_for(5.0)
    first = used.index(1)
    assert first >= 40  # 40 steps' worth of time at the current count first
    assert all(u == 2 for u in used[:first])


def test_back_to_more_threads_soon_after_a_long_busy_spell():
    """Thirty seconds beside two busy loops push the two-thread trials' wait to its cap;
    when the loops end, the single thread runs faster (a core of its own), and that change
    brings the next trial at once instead of after the long wait."""
    busy = {"on": True}

    def cost(kind: str, t: int) -> tuple[float, float]:
        if busy["on"]:  # one thread gets two thirds of a core; two stall at the barriers
            return (0.030, 0.002) if t == 2 else (0.0135, 0.002)
        return (0.005, 0.001) if t == 2 else (0.009, 0.001)

    m = FakeMachine(cost)
    m.run_for(30.0)
    assert m.g.chosen() == {"decode<=1": 1}
    assert m.g.kinds["decode<=1"].wait[+1] >= 16.0  # many lost trials: a long wait
    busy["on"] = False
    m.run_for(2.0)
    assert m.g.chosen() == {"decode<=1": 2}


def test_a_steady_load_does_not_bring_trials_early():
    """The load does not change: the lost direction keeps its long wait (trials stay rare)."""
    m = FakeMachine(lambda kind, t: (0.030, 0.002) if t == 2 else (0.0135, 0.002))
    used = m.run_for(60.0)
    assert m.g.chosen() == {"decode<=1": 1}
    trials = sum(1 for a, b in zip(used, used[1:], strict=False) if a == 1 and b == 2)
    assert trials <= 8


class FakeLoad:
    """A CpuLoad whose other processes' share the test sets (cores of 2)."""

    def __init__(self) -> None:
        self.others: float | None = 0.0
        self.cpus = 2

    def tick(self) -> None:
        pass

    def core_free(self, threads: int) -> bool:
        return CpuLoad.core_free(self, threads)  # type: ignore[arg-type]


def test_no_trial_of_a_thread_more_while_the_cores_are_busy():
    """Two busy processes start beside two threads: the governor drops to one thread
    within seconds (not after 40 slow steps of budget), then runs no two-thread trial
    while the cores stay busy (each would stall on every barrier); when the processes
    end, the trial runs and wins."""
    load = FakeLoad()
    busy = {"on": False}

    def cost(kind: str, t: int) -> tuple[float, float]:
        if busy["on"]:
            return (0.5, 0.002) if t == 2 else (0.0135, 0.002)
        return (0.005, 0.001) if t == 2 else (0.009, 0.001)

    m = FakeMachine(cost)
    m.g.load = load
    m.run_for(40.0)  # quiet: two threads, the one-thread direction lost many times
    assert m.g.chosen() == {"decode<=1": 2}
    busy["on"], load.others = True, 1.5
    m.run_for(4.0)
    assert m.g.chosen() == {"decode<=1": 1}
    used = m.run_for(30.0)
    assert 2 not in used  # no trial on busy cores
    busy["on"], load.others = False, 0.1
    assert 2 in m.run_for(2.0) and m.g.chosen() == {"decode<=1": 2}


def test_a_new_kind_starts_with_a_thread_less_per_core_others_hold(capsys):
    """The first steps of a kind run at the count the load leaves: one thread where two
    busy processes hold both cores (the trial that found it came 40 slow steps late),
    both where only part of a core is taken, all where the load is unknown."""
    for others, first in ((1.9, 1), (1.0, 1), (0.5, 2), (None, 2)):
        load = FakeLoad()
        load.others = others
        m = FakeMachine(lambda kind, t: (0.005, 0.001))
        m.g.load = load
        assert m.step() == first, others
        assert m.g.chosen() == {"decode<=1": first}
        said = "starts at 1 of 2 threads" in capsys.readouterr().out  # logged, with why
        assert said == (first == 1)


def _proc_stat(total: tuple[int, ...], own: tuple[int, int]) -> tuple[str, str]:
    """(/proc/stat, /proc/self/stat) texts: the summed cpu line, one line per usable CPU."""
    cpus = "".join(f"cpu{i} 1 0 0 0\n" for i in range(len(os.sched_getaffinity(0))))
    return (
        "cpu  " + " ".join(map(str, total)) + " 0 0\n" + cpus,
        "1 (a b) R " + "0 " * 10 + f"{own[0]} {own[1]} 0",
    )


def test_cpu_load_counts_only_the_other_processes():
    """/proc/stat's busy ticks less this process's own, per CPU of the window."""
    n = len(os.sched_getaffinity(0))
    stats = iter(
        [
            _proc_stat((100, 0, 50, 850, 0, 0, 0, 0), (30, 10)),
            _proc_stat((300, 0, 150, 850 + 300 * n - 300, 0, 0, 0, 0), (110, 30)),
        ]
    )
    clock = iter([0.0, 1.0])
    load = CpuLoad(every_s=0.5, read=lambda: next(stats), clock=lambda: next(clock))
    assert load.others is None  # one reading: no window yet
    load.tick()
    # the window: 300 * n ticks, 300 per CPU; busy +300, own +100: others 200 / 300 cores
    assert load.cpus == n and abs(load.others - 200 / 300) < 1e-9
    assert load.core_free(n - 1) is False  # the rest of the machine holds 2/3 of a core
    assert load.core_free(n - 2) is (n >= 2)


def test_cpu_load_unknown_where_the_counters_do_not_read():
    load = CpuLoad(read=lambda: None)
    load.tick()
    assert load.others is None and load.core_free(64)


def _machine(cost, **kw: object) -> FakeMachine:
    """A ``FakeMachine`` whose governor takes ``kw`` (``cached``, ``save``, ``load``)."""
    m = FakeMachine(cost)
    m.g = ThreadGovernor(
        2, probe_every_s=1.0, set_threads=m.set_calls.append, clock=lambda: m.now, **kw
    )
    return m


def test_the_governor_starts_from_the_cached_measurement(capsys):
    """A restart serves its first steps at the count the previous run settled on (here
    one thread of two, on cores where one serves faster), with that run's waits: the
    direction that lost many times is not tried again for its wait, so no step of the
    first requests pays for a trial. Without the cache it starts at two threads and
    takes 40 steps' worth of time to find one."""

    def cost(kind: str, t: int) -> tuple[float, float]:
        return (0.030, 0.002) if t == 2 else (0.0135, 0.002)

    first = _machine(cost)
    used = first.run_for(3.0)
    assert used[0] == 2 and used.index(1) >= 40  # measuring its way there
    saved: list[dict] = []
    settled = _machine(cost, save=lambda v: saved.append(json.loads(json.dumps(v))))
    settled.run_for(60.0)
    assert settled.g.chosen() == {"decode<=1": 1} and saved
    cached = saved[-1]
    assert cached["decode<=1"]["0"]["threads"] == 1 and cached["decode<=1"]["0"]["wait"]["1"] >= 16
    again = _machine(cost, cached=cached)
    assert again.g.start_notes() == [
        "thread counts to start from, as measured before: decode<=1 1 of 2"
    ]
    used = again.run_for(15.0)  # 15 s: within the cached wait of the two-thread direction
    assert set(used) == {1} and again.g.changes == 0


def test_a_cached_count_is_for_the_cores_held_when_it_was_judged():
    """One thread settled on while other processes held a core is not where a quiet
    start begins (that was the slow first requests of a fresh server): entries are kept
    per number of cores held, and the startup measurement's ("measured") stands in for
    a quiet start that has none of its own."""
    busy = {"decode<=1": {"1": {"threads": 1, "wait": {"-1": 1.0, "1": 32.0}}}}
    load = FakeLoad()
    quiet = _machine(lambda kind, t: (0.005, 0.001), cached=busy, load=load)
    assert quiet.step() == 2 and quiet.g.start_notes() == []
    load = FakeLoad()
    load.others = 1.5  # two busy loops' worth on 2 cores: one held (at most threads - 1)
    held = _machine(lambda kind, t: (0.005, 0.001), cached=busy, load=load)
    assert held.step() == 1
    assert held.g.kinds["decode<=1"].wait[+1] == 32.0
    assert "other processes holding 1 cores" in held.g.start_notes()[0]
    measured = {"decode<=1": {"measured": {"threads": 1}}, "decode<=8": {"0": {"threads": 2}}}
    m = _machine(lambda kind, t: (0.005, 0.001), cached=measured)
    assert m.step() == 1 and m.step(kind="decode<=8", tokens=8) == 2
    assert m.g.start_notes() == [
        "thread counts to start from, as measured before: decode<=1 1 (startup measurement), "
        "decode<=8 2 of 2"
    ]


def test_exploring_never_costs_a_request_more_than_a_tenth():
    """Trials that always lose, by just under the abort ratio (the costliest kind: a
    slower step ends the trial at once): every run of 128 steps (a 128-token request)
    takes at most 10% longer than at the best count alone. Settings that could cost
    more are refused."""
    m = _machine(lambda kind, t: (0.010, 0.0005) if t == 2 else (0.0149, 0.0005))
    starts = []
    for _ in range(3000):
        starts.append(m.now)
        m.step()
    best = 128 * 0.0105
    worst = max(starts[i + 128] - starts[i] for i in range(len(starts) - 128))
    assert worst <= 1.1 * best, worst / best
    with pytest.raises(ValueError, match="10%"):
        ThreadGovernor(2, trial_steps=12, probe_steps=40, abort_ratio=1.5)


def test_the_load_is_read_in_the_background_until_it_is_gone():
    """``CpuLoad.watch`` reads the counters every window from a daemon thread (so a new
    kind of step after an idle spell sees the last window, not the average since the
    previous step), and stops once its ``CpuLoad`` is gone."""
    import gc
    import time

    reads = []

    def read() -> tuple[str, str]:
        reads.append(time.monotonic())
        return _proc_stat((100 * len(reads), 0, 0, 0, 0, 0, 0, 0), (0, 0))

    load = CpuLoad(every_s=0.01, read=read)
    thread = load.watch()
    time.sleep(0.2)
    assert len(reads) >= 5 and thread.is_alive()
    del load
    gc.collect()
    thread.join(1.0)
    assert not thread.is_alive()


def test_new_kinds_start_by_the_last_second_not_the_last_window():
    """On a busy machine one quarter-second window can show the other processes idle
    and the next busy: kinds created a step apart (a request's prefill, then its decode)
    start by the mean of the last windows, so both at one thread here."""
    load = CpuLoad(every_s=0.0, read=lambda: None)
    load.cpus, load.others = 2, 0.2  # the last window: a lull
    load._recent.extend([1.8, 1.6, 1.5, 0.2])  # noqa: SLF001 (the windows before it)
    m = _machine(lambda kind, t: (0.005, 0.001), load=load)
    m.g.load.tick = lambda: None  # the counters as set
    assert m.step(kind="prefill<=16", tokens=12) == 1
    assert m.step() == 1
    assert load.recent() == pytest.approx(1.275)
