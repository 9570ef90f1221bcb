"""The CPU runner's thread governor (``houchu.model.threads``): per step kind it keeps the
thread count whose measured cycle time per token is lowest, follows a change of the
machine's load, never measures idle gaps, and judges each kind on its own."""

from __future__ import annotations

import os
import re
from collections.abc import Callable

from houchu.model.threads import CpuLoad, ThreadGovernor, step_key


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
