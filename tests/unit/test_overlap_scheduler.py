"""The overlap scheduler's one-step-late bookkeeping, without a model.

A fake runner plays the model runner: it executes plans in the order they are sent,
keeps a KV pool of token ids (so a page that one request reads after another request
wrote into it is caught), resolves placeholder tokens from its previous step, and
samples a token that depends only on the request and the output index (or EOS where the
test says). Driving the scheduler one step ahead must then give exactly the tokens and
page accounting of driving it step by step.
"""

from __future__ import annotations

import random

import pytest

from houchu.options.speculation_options import SpeculativeOptions
from houchu.scheduler.batcher import PLACEHOLDER_TOKEN
from houchu.scheduler.overlap import OverlapLedger
from houchu.transport.failures import internal
from houchu.transport.messages import (
    RunnerInfo,
    StepResult,
)
from tests.support.overlap import FakeRunner, add, both, drive, make_core
from tests.support.scheduler import EOS, check_page_tables


def test_finish_at_n_with_a_token_already_planned_at_n_plus_1():
    core = make_core(num_pages=8)
    runner = FakeRunner(eos_at={"a": 1})
    add(core, "a", list(range(10, 16)), max_tokens=10)
    r0 = runner.execute(core.next_plan())  # prefill, samples output 0
    assert core.can_plan_ahead()
    p1 = core.next_plan()  # planned before output 0 is known
    (w,) = p1.work
    assert w.use_last_sampled and w.token_ids == [PLACEHOLDER_TOKEN] and w.start_pos == 6
    r1 = runner.execute(p1)  # samples output 1 = EOS
    (ev,) = core.apply(r0)
    assert ev.finish_reason is None and len(ev.token_ids) == 1
    p2 = core.next_plan()  # output 1 is still unknown: decode it with a placeholder
    assert p2.work[0].use_last_sampled and p2.work[0].start_pos == 7
    r2 = runner.execute(p2)  # an extra token after EOS
    (ev,) = core.apply(r1)
    assert ev.finish_reason == "stop" and ev.token_ids == [EOS]
    assert core.allocator.num_free == 8  # pages freed although step 2 still writes them
    assert core.apply(r2) == []  # its extra token is discarded
    assert core.overlap.discarded_tokens == 1
    p3 = core.next_plan()
    assert p3.work == [] and p3.release == ["a"]
    runner.execute(p3)
    assert core.num_in_flight == 1 and not core.batcher.running


def test_a_length_finish_is_not_planned_again():
    core = make_core()
    runner = FakeRunner()
    add(core, "a", [10, 11, 12], max_tokens=2)
    r0 = runner.execute(core.next_plan())
    r1 = runner.execute(core.next_plan())  # output 1 with a placeholder
    core.apply(r0)
    assert core.next_plan() is None  # output 1 is its last: nothing to plan for it
    (ev,) = core.apply(r1)
    assert ev.finish_reason == "length" and core.overlap.discarded_tokens == 0


def test_abort_between_plan_and_result():
    core = make_core(num_pages=8)
    runner = FakeRunner()
    add(core, "a", list(range(10, 17)), max_tokens=10)
    add(core, "b", list(range(30, 33)), max_tokens=3)
    r0 = runner.execute(core.next_plan())
    r1 = runner.execute(core.next_plan())
    assert core.abort("a")
    assert core.allocator.num_free == 8 - 1  # only b's page is held
    events = core.apply(r0) + core.apply(r1)
    assert {e.rid for e in events} == {"b"}
    assert core.overlap.discarded_tokens == 0  # aborts are not the overlap's cost
    plan = core.next_plan()
    assert "a" in plan.release and [w.rid for w in plan.work] == ["b"]
    check_page_tables(core)


def test_a_failed_step_fails_its_requests_once_with_the_next_one_in_flight():
    core = make_core(num_pages=8)
    runner = FakeRunner()
    add(core, "a", [10, 11, 12], max_tokens=10)
    r0 = runner.execute(core.next_plan())
    r1 = runner.execute(core.next_plan())
    failed = StepResult(
        step_id=r0.step_id, outputs=[], duration_s=0.0, num_tokens=0, error=internal("boom")
    )
    (ev,) = core.apply(failed)
    assert ev.finish_reason == "error" and core.allocator.num_free == 8
    assert core.apply(r1) == [] and core.overlap.discarded_tokens == 0
    assert core.next_plan().release == ["a"]


def test_preempted_while_in_flight_keeps_its_token_and_waits():
    def make():
        core = make_core(num_pages=7, max_running_requests=8, chunked_prefill_size=4)
        add(core, "old", list(range(10, 17)), max_tokens=10)
        add(core, "new", list(range(40, 55)), max_tokens=10)
        return core

    core, runner = make(), FakeRunner()
    for _ in range(4):  # chunked prefills; then both decode and the pool is full
        core.apply(runner.execute(core.next_plan()))
    assert core.allocator.num_free == 0
    r4 = runner.execute(core.next_plan())  # "new" decodes position 15, its last slot
    p5 = core.next_plan()  # position 16 needs a page: "new" preempts itself
    assert [w.rid for w in p5.work] == ["old"] and core.batcher.num_preemptions == 1
    new = core.batcher.get("new")
    assert new.page_table == [] and new.num_pending == 1  # step 4 still samples for it
    # its pages are free now, but it is not re-admitted before its token is known
    assert core.allocator.num_free == 4
    r5 = runner.execute(p5)
    events = core.apply(r4)
    assert {e.rid for e in events} == {"old", "new"}  # the token sampled for it is kept
    assert len(new.output_ids) == 2 and not new.is_in_flight
    core.apply(r5)
    out = drive(core, runner, overlap=True)  # recomputed with both of its tokens
    plain = drive(make(), FakeRunner(), overlap=False)
    assert (new.output_ids, out["new"][1]) == plain["new"]
    assert out["new"][0] == plain["new"][0][2:]


def test_overlapped_equals_step_by_step_with_chunks_eos_and_lengths():
    def make():
        core = make_core(num_pages=64, max_batch_tokens=12, chunked_prefill_size=5)
        for i, (n, m) in enumerate([(3, 5), (17, 9), (6, 1), (9, 2), (4, 12), (23, 7)]):
            add(core, f"r{i}", list(range(10 + i, 10 + i + n)), max_tokens=m)
        return core

    plain, over, core = both(make, eos_at={"r1": 4, "r4": 0})
    assert over == plain
    assert plain["r1"] == (plain["r1"][0][:4] + [EOS], "stop")
    assert core.overlap.steps_ahead > 0 and core.allocator.num_free == 64


def test_overlapped_equals_step_by_step_under_preemption_and_prefix_sharing():
    shared = list(range(50, 62))

    def make():
        core = make_core(num_pages=14, radix=True, max_batch_tokens=16, chunked_prefill_size=8)
        for i in range(6):
            add(core, f"r{i}", shared + [70 + i] * (i + 1), max_tokens=6 + 2 * i)
        return core

    plain, over, core = both(make, eos_at={"r2": 3})
    assert over == plain and core.batcher.num_preemptions > 0
    assert len(plain) == 6


def test_random_runs_with_aborts_keep_pages_exact():
    rng = random.Random(5)
    for trial in range(25):
        specs = [
            (
                f"t{trial}r{i}",
                [rng.randrange(10, 15) for _ in range(rng.randrange(1, 20))],
                rng.randrange(1, 12),
            )
            for i in range(rng.randrange(2, 7))
        ]
        eos_at = {rid: rng.randrange(0, 12) for rid, _, _ in specs if rng.random() < 0.4}
        aborts = {rng.randrange(0, 12): rid for rid, _, _ in specs if rng.random() < 0.3}

        def make(specs=specs):
            core = make_core(num_pages=12, radix=True, max_batch_tokens=10, chunked_prefill_size=6)
            for rid, prompt, m in specs:
                add(core, rid, prompt, m)
            return core

        def hook(core, n, aborts=aborts):
            if n in aborts:
                core.abort(aborts[n])

        plain, over, core = both(make, eos_at)
        assert over == plain and len(plain) == len(specs)
        assert core.allocator.num_free + core.tree.num_pages == 12
        plain, over, core = both(make, eos_at, hook)  # page checks inside
        kept = set(plain) - set(aborts.values())
        assert {r: over[r] for r in kept} == {r: plain[r] for r in kept}
        assert core.allocator.num_free + core.tree.num_pages == 12


def test_no_plan_ahead_of_a_verify_step_or_while_speculation_may_propose():
    core = make_core(
        spec=SpeculativeOptions(
            speculative="ngram", num_speculative_tokens=2, speculative_max_batch=1
        )
    )
    runner = FakeRunner()
    add(core, "a", [10, 11, 12], max_tokens=10)
    r0 = runner.execute(core.next_plan())
    assert not core.can_plan_ahead()  # "a" decodes next: speculation may propose for it
    core.apply(r0)
    add(core, "b", [20, 21], max_tokens=10)
    add(core, "c", [30, 31], max_tokens=10)
    core.apply(runner.execute(core.next_plan()))
    runner.execute(core.next_plan())
    assert core.can_plan_ahead()  # three decoding, above max_batch 1: speculation is off
    runner.execute(core.next_plan())
    with pytest.raises(RuntimeError, match="two steps"):
        core.next_plan()


def test_ledger_counts_only_work_inside_the_runners_step():
    led = OverlapLedger(enabled=True)
    led.record_work(10.0, 10.5, overlapped=True)
    led.record_work(12.0, 12.2, overlapped=False)
    assert led.on_executed(10.2, 1.0) == pytest.approx(0.3)  # the step ran 10.2 .. 11.2
    assert led.on_executed(0.0, 1.0) == 0.0  # unknown start: nothing claimed
    s = led.stats()
    assert s.overlap_hidden_s == pytest.approx(0.3) and s.overlap_schedule == 1
    assert s.overlap_scheduler_s == pytest.approx(0.7)
    led.on_discarded(2)
    (sample,) = unpaced_samples(led)
    assert (sample.lever, sample.verb, sample.saved_unit, sample.spent_unit) == (
        "overlap_scheduler",
        "fill",
        "seconds",
        "tokens",
    )
    assert sample.saved == pytest.approx(0.3) and sample.spent == 2
    assert unpaced_samples(led) == []  # nothing new accrued


def unpaced_samples(led: OverlapLedger) -> list:
    led._sent_at = -1e9  # noqa: SLF001 (skip the once-a-second pacing)
    return led.samples()


def test_resolve_overlap_auto_on_gpu_or_spare_cores() -> None:
    from houchu.scheduler.overlap import resolve_overlap
    from houchu.transport.messages import RunnerInfo

    def info(device: str, threads: int) -> RunnerInfo:
        return RunnerInfo(
            num_pages=8,
            page_size=16,
            max_context=128,
            kv_bytes_per_token=64,
            num_params=1,
            model_name="m",
            device_type=device,
            num_threads=threads,
        )

    assert resolve_overlap("auto", info("cuda", 16), 16)
    assert not resolve_overlap("auto", info("cpu", 2), 2)  # every core runs the step
    assert not resolve_overlap("auto", info("cpu", 7), 8)
    assert resolve_overlap("auto", info("cpu", 6), 8)
    assert resolve_overlap("on", info("cpu", 2), 2)
    assert not resolve_overlap("off", info("cuda", 1), 16)
    with pytest.raises(ValueError, match="auto, on or off"):
        resolve_overlap("yes", info("cpu", 1), 2)
