"""Scheduler logic without a model: plans, page accounting, preemption, aborts.

A step's result is made up by the test (the token a model would have sampled), so the
scheduler's bookkeeping is checked exactly.
"""

from __future__ import annotations

import msgspec
import pytest

from houchu.cache_tiers.page_allocator import OutOfPages, PageAllocator
from houchu.scheduler.core import Rejected
from houchu.transport.failures import bad_request, internal
from houchu.transport.messages import (
    Failure,
    SeqOutput,
    StepResult,
)
from tests.support.scheduler import EOS, check_page_tables, make_core, req, run_step


def test_allocator_refcounts():
    a = PageAllocator(4, 16)
    pages = a.allocate(3)
    a.share(pages[:1])
    a.free(pages)
    assert a.num_free == 3
    a.free(pages[:1])
    assert a.num_free == 4
    with pytest.raises(OutOfPages):
        a.allocate(5)
    with pytest.raises(ValueError):
        a.free([0])


def test_prefill_then_decode_then_finish_frees_pages():
    core = make_core()
    core.add(req("a", 6, max_tokens=3))
    plan, events = run_step(core)
    (w,) = plan.work
    assert w.token_ids == list(range(10, 16)) and w.start_pos == 0 and w.sample
    assert len(w.page_table) == 2 and plan.init[0].rid == "a"
    assert events[0].token_ids == [7] and events[0].prompt_tokens == 6
    plan, _ = run_step(core)
    assert plan.work[0].token_ids == [7] and plan.work[0].start_pos == 6
    plan, events = run_step(core)
    assert events[0].finish_reason == "length"
    assert core.allocator.num_free == 16
    plan = core.next_plan()  # the runner is told to drop the request's state
    assert plan is not None and plan.work == [] and plan.release == ["a"]


def test_eos_finishes_with_stop():
    core = make_core()
    core.add(req("a", 3, max_tokens=10))
    _, events = run_step(core, token=EOS)
    assert events[0].finish_reason == "stop"


def test_chunked_prefill_shares_step_with_decodes():
    core = make_core(num_pages=64, max_batch_tokens=8, chunked_prefill_size=8)
    core.add(req("short", 2, max_tokens=20))
    run_step(core)
    core.add(req("long", 30, max_tokens=2))
    plan, _ = run_step(core)
    kinds = {w.rid: len(w.token_ids) for w in plan.work}
    assert kinds == {"short": 1, "long": 7}  # the decode keeps going beside the chunk
    assert not next(w for w in plan.work if w.rid == "long").sample
    starts = []
    while core.batcher.get("long").num_computed < 30:
        plan, _ = run_step(core)
        starts += [w.start_pos for w in plan.work if w.rid == "long"]
        check_page_tables(core)
    assert starts == [7, 14, 21, 28]


def test_preemption_recomputes_prompt_and_output():
    core = make_core(num_pages=4, page_size=4, max_running_requests=8)
    core.add(req("old", 7, max_tokens=9))
    core.add(req("new", 7, max_tokens=9))
    run_step(core)  # both prefilled: 2 pages each, pool full
    assert core.allocator.num_free == 0
    plan, _ = run_step(core)  # decode at position 7 fits in page 2 of each
    plan, _ = run_step(core)  # position 8 needs a third page: the newest is preempted
    assert [w.rid for w in plan.work] == ["old"]
    assert core.batcher.num_preemptions == 1
    new = core.batcher.get("new")
    assert new.num_computed == 0 and new.page_table == [] and len(new.output_ids) == 2
    while core.batcher.get("old") is not None:
        run_step(core)
        check_page_tables(core)
    plan, _ = run_step(core)  # "new" is recomputed from prompt + its 2 outputs
    w = next(w for w in plan.work if w.rid == "new")
    assert w.token_ids == list(range(10, 17)) + [7, 7] and w.sample
    assert plan.init == []  # its runner state (seeded generator, penalties) was kept


def test_abort_frees_pages_and_drops_late_results():
    core = make_core()
    core.add(req("a", 5, max_tokens=10))
    plan = core.next_plan()
    assert core.abort("a")
    assert core.allocator.num_free == 16
    events = core.apply(
        StepResult(
            step_id=plan.step_id,
            outputs=[SeqOutput(rid="a", token_id=3)],
            duration_s=0,
            num_tokens=5,
        )
    )
    assert events == []
    assert not core.abort("a")


def test_reject_what_can_never_fit():
    core = make_core(num_pages=2, page_size=4, max_context=100)
    with pytest.raises(Rejected, match="pool"):
        core.add(req("big", 6, max_tokens=10))
    with pytest.raises(Rejected, match="context"):
        core.add(req("long", 100, max_tokens=1))


def test_runner_error_fails_requests():
    core = make_core()
    core.add(req("a", 3))
    plan = core.next_plan()
    events = core.apply(
        StepResult(
            step_id=plan.step_id, outputs=[], duration_s=0, num_tokens=0, error=internal("boom")
        )
    )
    assert events[0].finish_reason == "error" and events[0].failure == internal("boom")
    assert core.allocator.num_free == 16


def test_a_request_the_runner_failed_alone_ends_and_the_batch_goes_on():
    """``StepResult.failures`` (a grammar the runner could not follow) fails that request
    only: its token of the step is discarded, its pages are freed and released in the
    next plan, and the other request keeps decoding to its end."""
    core = make_core()
    core.add(req("a", 3))
    core.add(req("b", 3))
    plan = core.next_plan()
    why = bad_request("'guided_regex' is too complex", code="grammar_too_complex")
    outs = [SeqOutput(rid=w.rid, token_id=7) for w in plan.work if w.sample]
    events = core.apply(
        StepResult(
            step_id=plan.step_id, outputs=outs, duration_s=0, num_tokens=0, failures={"a": why}
        )
    )
    by_rid = {e.rid: e for e in events}
    assert by_rid["a"].finish_reason == "error" and by_rid["a"].failure == why
    assert by_rid["a"].token_ids == []
    assert by_rid["b"].token_ids == [7] and by_rid["b"].failure is None
    plan, events = run_step(core)
    assert plan.release == ["a"] and [w.rid for w in plan.work] == ["b"]
    while core.has_work:
        run_step(core)
    assert core.allocator.num_free == 16


def test_continuous_batching_joins_and_leaves():
    core = make_core(num_pages=64)
    core.add(req("a", 3, max_tokens=2))
    run_step(core)
    core.add(req("b", 3, max_tokens=4))
    plan, _ = run_step(core)
    assert {w.rid for w in plan.work} == {"a", "b"}  # b joins while a decodes
    plan, _ = run_step(core)
    assert [w.rid for w in plan.work] == ["b"]  # a left after its 2 tokens


def test_requests_queued_while_the_runner_restarts_survive_its_replacement():
    """The runner died (every request failed, the pool started over); requests that
    arrive before its replacement's RunnerInfo wait. A replacement whose pool has the
    same geometry (its measured decode paths differ, as they do at every start) keeps
    them and serves them; one with another pool fails them cleanly, never raising
    "restart with requests still queued or running"."""
    core = make_core()
    core.add(req("old", 5, max_tokens=3))
    run_step(core)
    assert core.fail_all(Failure(message="runner died", status=503))
    core.restart_pool()
    core.add(req("queued", 5, max_tokens=2))
    same = msgspec.structs.replace(core.runner, decode_paths="b<=1 fused 2.6 ms")
    assert core.on_runner_info(same) == []
    _, events = run_step(core)
    assert [e.rid for e in events] == ["queued"] and events[0].finish_reason is None
    core.add(req("late", 5, max_tokens=2))
    bigger = msgspec.structs.replace(core.runner, num_pages=32)
    failed = core.on_runner_info(bigger)
    assert sorted(e.rid for e in failed) == ["late", "queued"]
    assert all(e.finish_reason == "error" for e in failed)
    assert core.allocator.num_pages == 32 and not core.batcher.waiting
