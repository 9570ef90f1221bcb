"""The CPU runner's thread governor (``houchu.gpu.threads``): steps down while the cores
are contended, probes back up when they are free, and leaves a quiet machine alone."""

from __future__ import annotations

from houchu.gpu.threads import ThreadGovernor


class FakeMachine:
    """A clock, process CPU time and involuntary context switches that the test drives:
    each step lasts 10 ms and gets ``share`` of the governor's threads' cores."""

    def __init__(self) -> None:
        self.now, self.cpu, self.preempted = 0.0, 0.0, 0
        self.set_calls: list[int] = []

    def step(self, g: ThreadGovernor, share: float, preemptions: int) -> None:
        g.begin()
        self.now += 0.01
        self.cpu += 0.01 * g.threads * share
        self.preempted += preemptions
        g.end()

    def governor(self, threads: int = 2) -> ThreadGovernor:
        return ThreadGovernor(
            threads,
            probe_every_s=1.0,
            set_threads=self.set_calls.append,
            clock=lambda: self.now,
            usage=lambda: (self.cpu, self.preempted),
        )


def test_quiet_machine_keeps_its_threads():
    m = FakeMachine()
    g = m.governor()
    for _ in range(500):
        m.step(g, share=0.97, preemptions=0)
    for _ in range(50):  # an idle worker (low share) but never preempted: not contention
        m.step(g, share=0.6, preemptions=0)
    for _ in range(50):  # a stray preemption with a full share: not contention either
        m.step(g, share=0.95, preemptions=1)
    assert g.threads == 2 and m.set_calls == [] and g.changes == 0


def test_contention_steps_down_then_free_cores_step_back_up():
    m = FakeMachine()
    g = m.governor(4)
    for _ in range(3):
        m.step(g, share=0.5, preemptions=2)
    assert g.threads == 3 and m.set_calls == [3]
    for _ in range(6):
        m.step(g, share=0.5, preemptions=2)
    assert g.threads == 1 and m.set_calls == [3, 2, 1]
    for _ in range(20):  # 1 thread is never stepped below
        m.step(g, share=0.5, preemptions=2)
    assert g.threads == 1
    for _ in range(350):  # the load is gone: a probe each second, each kept
        m.step(g, share=0.98, preemptions=0)
    assert g.threads == 4 and m.set_calls == [3, 2, 1, 2, 3, 4]


def test_a_probe_into_contention_is_undone():
    m = FakeMachine()
    g = m.governor(2)
    for _ in range(3):
        m.step(g, share=0.4, preemptions=3)
    assert g.threads == 1
    for _ in range(110):  # at 1 thread the cores suffice; after 1 s it probes 2
        m.step(g, share=0.9, preemptions=0)
    assert m.set_calls[-1] == 2
    for _ in range(3):  # still contended at 2: back to 1
        m.step(g, share=0.45, preemptions=2)
    assert g.threads == 1 and m.set_calls == [1, 2, 1]


def test_steps_too_short_to_measure_are_not_judged():
    m = FakeMachine()
    g = m.governor(2)
    for _ in range(10):
        g.begin()
        m.now += 1e-4
        m.preempted += 1
        g.end()
    assert g.threads == 2
