"""Jump-forward's forced tokens in the scheduler, without a model: the fake runner of
``test_overlap_scheduler`` forces tokens after a step's sample where the test says; the
next step feeds them as one chunk, and driving the scheduler one step ahead gives the
tokens of driving it step by step (the step planned before the forced tokens draws
nothing)."""

from __future__ import annotations

from tests.support.overlap import FakeRunner, add, both, make_core


def test_forced_tokens_are_fed_in_one_chunk_after_their_step():
    """Jump-forward: the tokens a step forced after its sample have no KV yet; the next
    step feeds the sample and them as one chunk, whose last position draws."""
    core, runner = make_core(overlap_schedule="off"), FakeRunner(forced={"a": {0: 3}})
    add(core, "a", [10, 11, 12], max_tokens=10)
    (ev,) = core.apply(runner.execute(core.next_plan()))
    assert len(ev.token_ids) == 4 and core.counters.jump_forward_tokens == 3
    (w,) = core.next_plan().work
    assert (w.token_ids, w.start_pos, w.sample) == (ev.token_ids, 3, True)


def test_overlapped_equals_step_by_step_with_forced_tokens():
    """A step planned ahead for a request whose previous step forced tokens computes its
    sampled token and draws nothing (its sample is voided); the forced tokens go in the
    step after, so the outputs are those of driving it step by step."""

    def make():
        core = make_core(num_pages=64, max_batch_tokens=12, chunked_prefill_size=5)
        for i, (n, m) in enumerate([(3, 9), (7, 12), (4, 3)]):
            add(core, f"r{i}", list(range(10 + i, 10 + i + n)), max_tokens=m)
        return core

    forced = {"r0": {0: 3, 4: 1}, "r1": {2: 6, 9: 1}, "r2": {1: 4}}  # r2: cut by length
    plain, over, core = both(make, forced=forced)
    assert over == plain
    assert {rid: len(t) for rid, (t, _) in plain.items()} == {"r0": 9, "r1": 12, "r2": 3}
    assert core.counters.jump_forward_tokens == 3 + 1 + 6 + 1 + 1
    assert core.overlap.steps_ahead > 0 and core.allocator.num_free == 64


def test_a_step_planned_ahead_of_forced_tokens_draws_nothing():
    """The step planned before the forced tokens are known decodes the sampled token
    (a placeholder) and its sample is voided; the step after feeds exactly the forced
    tokens and draws after them."""
    core, runner = make_core(), FakeRunner(forced={"a": {0: 3}})
    add(core, "a", [10, 11, 12], max_tokens=10)
    r0 = runner.execute(core.next_plan())  # samples output 0 and forces 3 more
    r1 = runner.execute(core.next_plan())  # planned ahead: the placeholder at position 3
    assert [o.rid for o in r1.outputs] == []  # behind the forced tokens: nothing drawn
    (ev,) = core.apply(r0)
    a = core.batcher.get("a")
    assert len(ev.token_ids) == 4 and a.num_pending == 0  # step 1 draws nothing for it
    p2 = core.next_plan()
    (w,) = p2.work
    assert (w.token_ids, w.start_pos, w.sample) == (ev.token_ids[1:], 4, True)
    assert core.apply(r1) == [] and a.num_computed == 4
    (ev2,) = core.apply(runner.execute(p2))
    assert len(ev2.token_ids) == 1 and a.num_computed == 7
