"""Prefill groups (``n > 1``): the prompt is prefilled once, the other choices start
from its pages in the radix tree; prompt-logprob requests compute their whole prompt.
The choices start together: the same steps whatever their arrival and the cache."""

from __future__ import annotations

from houchu.options.batching_options import BatchingOptions
from houchu.scheduler.core import SchedulerCore
from houchu.scheduler.groups import ARRIVAL_WAIT_S, PrefillGroups
from houchu.scheduler.overlap import OverlapLedger
from houchu.transport.messages import SamplingParams, StepResult, TokenizedRequest
from houchu.transport.telemetry import LeverSample
from tests.support.scheduler import EOS, check_page_tables, make_core, run_step

PROMPT = list(range(10, 23))  # 13 tokens: 3 full pages of 4 before the last token


def choice(i: int, group: str = "g", size: int = 1, rid: str = "", **kw) -> TokenizedRequest:
    return TokenizedRequest(
        rid=rid or f"{group or 'solo'}-{i}",
        prompt_ids=list(PROMPT),
        sampling=SamplingParams(temperature=1.0, seed=i, max_tokens=3, **kw),
        stop_ids=[EOS],
        prefill_group=group,
        prefill_group_size=size,
    )


def rows(plan) -> list[tuple[str, int, int, bool]]:
    return [(w.rid, w.start_pos, len(w.token_ids), w.sample) for w in plan.work]


def test_the_prompt_is_prefilled_once_and_shared():
    core = make_core(radix=True, num_pages=32)
    for i in range(3):
        core.add(choice(i, size=3))
    plan, _ = run_step(core)  # the first computes the 12 shareable tokens and stops
    assert rows(plan) == [("g-0", 0, 12, False)]
    plan, events = run_step(core)  # then every choice computes the last prompt token
    assert rows(plan) == [("g-0", 12, 1, True), ("g-1", 12, 1, True), ("g-2", 12, 1, True)]
    assert {e.rid: e.cached_tokens for e in events if e.rid != "g-0"} == {"g-1": 12, "g-2": 12}
    stats = core.stats()
    assert stats["parallel_sampling_tokens_shared"] == 24
    assert stats["prefix_tokens_reused"] == 24
    check_page_tables(core)
    while core.has_work:
        run_step(core)
    assert core.batcher.groups.num_groups == 0
    check_page_tables(core)


class LeverRecord:
    """A telemetry sink that keeps the lever samples (events are dropped)."""

    def __init__(self) -> None:
        self.samples: list[LeverSample] = []

    def event(self, rid: str, kind: str, t: float | None = None, **data: float | int | str):
        pass

    def lever(self, sample: LeverSample) -> None:
        self.samples.append(sample)


def test_each_reused_prompt_token_is_saved_by_one_lever():
    """The choices' shared prompt tokens are the ``parallel_sampling`` lever's, a later
    request's cache hit the ``radix_prefix_cache``'s, never both: the tokens the levers
    saved add up to ``/stats`` ``prefix_tokens_reused`` (every prompt token found in
    the tree, whatever put it there), of which ``parallel_sampling_tokens_shared`` is
    the part the choices took from each other."""
    record = LeverRecord()
    core = SchedulerCore(make_core(num_pages=32).runner, BatchingOptions(), telemetry=record)
    for i in range(3):
        core.add(choice(i, size=3))
    while core.has_work:
        run_step(core)
    core.add(choice(10, group="", rid="after"))
    while core.has_work:
        run_step(core)
    saved: dict[tuple[str | None, str], float] = {}
    for s in record.samples:
        if s.saved_unit == "tokens" and s.lever in ("parallel_sampling", "radix_prefix_cache"):
            key = (s.rid, s.lever)
            saved[key] = saved.get(key, 0.0) + s.saved
    assert saved[("g-1", "parallel_sampling")] == saved[("g-2", "parallel_sampling")] == 12
    assert saved[("after", "radix_prefix_cache")] == 12
    assert len({rid for rid, _ in saved}) == len(saved)  # one lever per request
    stats = core.stats()
    assert sum(saved.values()) == stats["prefix_tokens_reused"]
    assert stats["parallel_sampling_tokens_shared"] == 24


def test_without_the_radix_cache_every_choice_prefills():
    core = make_core(radix=False, num_pages=32)
    for i in range(3):
        core.add(choice(i))
    plan, _ = run_step(core)
    assert sorted((w.rid, w.start_pos) for w in plan.work) == [("g-0", 0), ("g-1", 0), ("g-2", 0)]
    assert core.stats()["parallel_sampling_tokens_shared"] == 0


def test_without_the_radix_cache_the_choices_still_start_together():
    core = make_core(radix=False, num_pages=32)
    core.add(choice(0, size=2))
    assert core.next_plan() is None
    core.add(choice(1, size=2))
    plan, _ = run_step(core)
    assert rows(plan) == [("g-0", 0, 13, True), ("g-1", 0, 13, True)]


def test_other_requests_are_not_held_by_a_group():
    core = make_core(radix=True, num_pages=32)
    core.add(choice(0))
    core.add(choice(1))
    core.add(
        TokenizedRequest(
            rid="solo", prompt_ids=list(PROMPT), sampling=SamplingParams(), stop_ids=[]
        )
    )
    plan, _ = run_step(core)
    assert sorted(w.rid for w in plan.work) == ["g-0", "solo"]


def test_an_aborted_leader_lets_the_next_choice_prefill():
    core = make_core(radix=True, num_pages=32, chunked_prefill_size=4)
    core.add(choice(0))
    core.add(choice(1))
    plan, _ = run_step(core)
    assert [w.rid for w in plan.work] == ["g-0"]
    assert core.abort("g-0")
    plan, _ = run_step(core)
    assert [(w.rid, w.start_pos) for w in plan.work] == [("g-1", 4)]  # its 4 cached tokens
    check_page_tables(core)


def test_prompt_logprobs_compute_the_whole_prompt_even_when_cached():
    core = make_core(radix=True, num_pages=32)
    core.add(choice(0, group=""))
    while core.has_work:
        run_step(core)
    core.add(choice(1, group="", prompt_logprobs=0))
    plan, _ = run_step(core)
    assert [(w.start_pos, len(w.token_ids)) for w in plan.work] == [(0, 13)]
    while core.has_work:
        run_step(core)
    check_page_tables(core)


class FakeClock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def grouped_core(**kw):
    core = make_core(radix=True, num_pages=32, **kw)
    clock = FakeClock()
    core.batcher.groups = PrefillGroups(True, 4, clock=clock)
    return core, clock


def test_no_choice_starts_before_its_whole_group_arrived():
    core, clock = grouped_core()
    core.add(choice(0, size=3))
    core.add(choice(1, size=3))
    assert core.next_plan() is None  # the third is still on its way
    assert core.group_wait_s() == ARRIVAL_WAIT_S
    clock.t += 0.25
    assert core.group_wait_s() == ARRIVAL_WAIT_S - 0.25
    core.add(choice(2, size=3))
    assert core.group_wait_s() is None
    plan, _ = run_step(core)
    assert rows(plan) == [("g-0", 0, 12, False)]
    plan, _ = run_step(core)
    assert [w.rid for w in plan.work] == ["g-0", "g-1", "g-2"]


def test_a_choice_that_never_comes_is_waited_for_a_bounded_time():
    core, clock = grouped_core()
    core.add(choice(0, size=3))
    core.add(choice(1, size=3))
    clock.t += ARRIVAL_WAIT_S
    assert core.group_wait_s() is None
    plan, _ = run_step(core)
    assert rows(plan) == [("g-0", 0, 12, False)]
    plan, _ = run_step(core)
    assert [w.rid for w in plan.work] == ["g-0", "g-1"]


def test_a_refused_choice_is_not_waited_for():
    core, _ = grouped_core()
    core.add(choice(0, size=3))
    core.add(choice(1, size=3))
    try:
        core.add(choice(2, size=3, rid="g-1"))  # a request id already queued
    except Exception as e:  # Rejected
        assert "already queued" in str(e.failure.message)
    else:
        raise AssertionError("a duplicate request id was queued")
    plan, _ = run_step(core)
    assert rows(plan) == [("g-0", 0, 12, False)]


def test_a_cached_prompt_gives_the_choices_the_same_steps():
    """Cold (the shared pages computed now) and warm (found in the radix tree): the step
    in which the choices compute the rest of the prompt has the same rows, and so do the
    decode steps after it."""
    core, _ = grouped_core()
    runs = []
    for group in ("a", "b"):
        for i in range(3):
            core.add(choice(i, group=group, size=3))
        steps = []
        while core.has_work:
            plan, _ = run_step(core)
            steps.append([(w.start_pos, len(w.token_ids), w.sample) for w in plan.work])
        runs.append(steps)
    cold, warm = runs
    assert cold[0] == [(0, 12, False)]
    assert cold[1:] == warm
    assert warm[0] == [(12, 1, True)] * 3
    check_page_tables(core)


def test_the_first_choice_waits_while_its_shared_pages_are_in_flight():
    """Overlap: a plan built while the first choice's shared pages are computed gives
    it nothing more; the choices then compute the rest together."""
    core, _ = grouped_core()
    core.overlap = OverlapLedger(True)
    for i in range(3):
        core.add(choice(i, size=3))
    first = core.next_plan()
    assert rows(first) == [("g-0", 0, 12, False)]
    assert core.next_plan() is None  # planned ahead: nothing can run yet
    core.apply(StepResult(step_id=first.step_id, outputs=[], duration_s=0.0, num_tokens=0))
    plan, _ = run_step(core)
    assert rows(plan) == [("g-0", 12, 1, True), ("g-1", 12, 1, True), ("g-2", 12, 1, True)]


def test_lone_requests_are_never_held():
    core, _ = grouped_core()
    core.add(choice(0, group=""))
    plan, _ = run_step(core)
    assert rows(plan) == [("solo-0", 0, 13, True)]
