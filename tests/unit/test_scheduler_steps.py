"""The step tracker: how long a step has been at the runner, and the scheduler's round
trip per step (a stat; the runner's StepRecord has the compute time)."""

from __future__ import annotations

import time

from houchu.scheduler.speculation import NoSpeculation
from houchu.transport.messages import SeqOutput, StepResult
from tests.support.scheduler import make_core, req


def test_round_trip_and_time_at_the_runner():
    core = make_core()
    core.add(req("a", 5, max_tokens=4))
    assert "round_trip_ms" not in core.stats() and core.at_runner_s() == 0.0
    plan = core.next_plan()
    time.sleep(0.02)
    assert core.num_in_flight == 1 and core.at_runner_s() >= 0.02
    started = time.time() - 0.05  # the runner says when it started the step
    out = [SeqOutput(rid="a", token_id=7)]
    result = StepResult(
        step_id=plan.step_id, outputs=out, duration_s=0.01, num_tokens=5, started_at=started
    )
    core.apply(result)
    assert core.num_in_flight == 0 and core.at_runner_s() == 0.0
    assert 50 <= core.stats()["round_trip_ms"] < 5000


def test_a_stale_result_lands_nowhere():
    core = make_core()
    core.add(req("a", 5))
    plan = core.next_plan()
    stale = StepResult(step_id=plan.step_id + 7, outputs=[], duration_s=0.0, num_tokens=0)
    assert not core.is_in_flight(stale.step_id) and core.apply(stale) == []
    assert core.is_in_flight(plan.step_id)


def test_features_off_are_null_parts():
    core = make_core()
    assert isinstance(core.spec, NoSpeculation) and core.tree is None
    assert core.draft_request() is None and core.draft_release() is None
    assert not core.is_looking_up() and core.tier_messages() == []
    st = core.stats()
    assert st["speculative"] == "off" and st["radix_cache"] == 0
    assert st["num_pages_cached"] == 0
