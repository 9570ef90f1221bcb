"""Plans carry only the pages the runner lacks (``Request.give_pages`` on the
scheduler's side, ``houchu.runner.page_tables.PageTables`` on the runner's), and each
work item says its phase."""

from __future__ import annotations

import pytest
from msgspec import msgpack

from houchu.actors.runner import step_record
from houchu.runner.page_tables import PageTables
from houchu.scheduler.request import Request
from houchu.transport.messages import Phase, SamplingParams, SeqWork, StepPlan
from tests.support.scheduler import make_core, req, run_step


def work(rid: str, table: list[int]) -> SeqWork:
    return SeqWork(rid=rid, token_ids=[1], start_pos=0, page_table=list(table), sample=True)


def test_a_table_travels_whole_once_then_only_its_new_pages() -> None:
    req = Request("a", [1, 2, 3], SamplingParams(), [])
    runner = PageTables()
    sent = []
    for table in ([4], [4, 9], [4, 9], [4, 9, 2]):
        req.page_table = list(table)
        w = work("a", table)
        req.give_pages(w)
        sent.append((w.page_table, w.new_pages))
        (resolved,), updates = runner.resolve([w])
        runner.commit(updates)
        assert resolved.page_table == table
    assert sent == [([4], []), (None, [9]), (None, []), (None, [2])]


def test_a_table_that_is_not_grown_travels_whole_again() -> None:
    req = Request("a", [1], SamplingParams(), [])
    runner = PageTables()
    for table, expect_whole in (
        ([4, 9, 2], True),
        ([4, 9], True),
        ([7, 1], True),
        ([7, 1, 3], False),
    ):
        req.page_table = list(table)  # cut (rejected proposals), new pages (preemption)
        w = work("a", table)
        req.give_pages(w)
        assert (w.page_table is not None) == expect_whole
        (resolved,), updates = runner.resolve([w])
        runner.commit(updates)
        assert resolved.page_table == table
    req.unregister()  # released: the next table travels whole
    req.page_table = [5]
    w = work("a", [5])
    req.give_pages(w)
    assert w.page_table == [5]


def test_the_runner_refuses_new_pages_without_a_table_and_changes_nothing() -> None:
    runner = PageTables()
    (_, updates) = runner.resolve([work("a", [1, 2])])
    runner.commit(updates)
    delta = SeqWork(rid="a", token_ids=[1], start_pos=4, sample=True, new_pages=[3])
    with pytest.raises(ValueError, match="no page table"):
        runner.resolve([delta], released=["a"])  # released before its work
    ghost = SeqWork(rid="b", token_ids=[1], start_pos=0, sample=True, new_pages=[3])
    with pytest.raises(ValueError, match="'b': new pages but no page table"):
        runner.resolve([delta, ghost])
    assert runner.get("a") == [1, 2]  # a refused plan changed nothing
    runner.commit({}, released=["a"])
    assert runner.get("a") is None and len(runner) == 0


def test_scheduled_plans_send_each_page_once_and_the_phase() -> None:
    core = make_core(num_pages=16, page_size=4)
    core.add(req("a", 9, max_tokens=8))  # 9 prompt tokens: 3 pages
    runner = PageTables()
    plans = []
    for _ in range(6):
        plan, _ = run_step(core)
        work, updates = runner.resolve(plan.work, plan.release)
        runner.commit(updates, plan.release)
        plans.append(plan)
        assert work[0].page_table == core.batcher.get("a").page_table
    first, *rest = (p.work[0] for p in plans)
    assert first.page_table is not None and len(first.page_table) == 3
    assert first.phase is Phase.PREFILL and all(w.phase is Phase.DECODE for w in rest)
    assert all(w.page_table is None for w in rest)
    # positions 9..11 fit the third page; position 12 (the 4th decode) takes a 4th page
    assert [len(w.new_pages) for w in rest] == [0, 0, 0, 1, 0]
    encoded = [len(msgpack.encode(p)) for p in plans]
    assert max(encoded[1:]) < encoded[0]  # decode plans carry no page table


def test_step_records_count_tokens_by_the_phase_the_plan_gives() -> None:
    plan = StepPlan(
        step_id=3,
        work=[
            SeqWork(rid="a", token_ids=[1, 2, 3], start_pos=0, page_table=[0], sample=True),
            SeqWork(
                rid="b",
                token_ids=[4],
                start_pos=7,
                page_table=[1, 2],
                sample=True,
                phase=Phase.DECODE,
            ),
        ],
    )
    r = step_record(plan, 100.0, 0.5)
    assert (r.num_prefill_tokens, r.num_decode_tokens, r.phase) == (3, 1, "mixed")
