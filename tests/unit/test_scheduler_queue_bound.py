"""The scheduler's waiting queue is bounded in prompt tokens (``--max-queued-tokens``)."""

from __future__ import annotations

import pytest

from houchu.scheduler.core import Overloaded, Rejected
from tests.support.scheduler import make_core, req, run_step


def test_queue_full_of_tokens_refuses_with_429() -> None:
    core = make_core(num_pages=64, max_running_requests=1, max_queued_tokens=20)
    core.add(req("a", 10))
    run_step(core)  # "a" runs; the queue is empty again
    core.add(req("b", 12))
    core.add(req("c", 8))  # 20 tokens wait: at the bound
    with pytest.raises(Overloaded) as e:
        core.add(req("d", 1))
    assert e.value.status == 429 and isinstance(e.value, Rejected)
    stats = core.stats()
    assert stats["num_waiting_tokens"] == 20 and stats["num_refused_queue_full"] == 1
    assert core.abort("b")  # room again
    core.add(req("d", 5))


def test_an_empty_queue_takes_a_request_above_the_bound() -> None:
    core = make_core(num_pages=64, max_running_requests=1, max_queued_tokens=4)
    core.add(req("big", 30))  # it could never run otherwise
    with pytest.raises(Overloaded):
        core.add(req("next", 1))


def test_no_bound_by_default() -> None:
    core = make_core(num_pages=64, max_running_requests=1)
    for i in range(20):
        core.add(req(f"r{i}", 30))
    assert core.stats()["num_waiting"] == 20
