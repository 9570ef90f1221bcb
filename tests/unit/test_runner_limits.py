"""The runner's limits (one check and one message each), the stop ids computed once, and
a stop string finishing a request in the scheduler (not an abort)."""

from __future__ import annotations

import asyncio

import pytest

from houchu.text.stop import stop_ids
from houchu.transport.failures import CONTEXT_LENGTH_EXCEEDED
from houchu.transport.limits import LimitsWatch, RunnerLimits
from houchu.transport.messages import RunnerInfo, SamplingParams
from tests.support.scheduler import make_core, req, run_step

LIMITS = RunnerLimits(max_context=100, vocab_size=50, kv_tokens=64)


def test_context_check_names_what_it_knows() -> None:
    assert LIMITS.context_failure(100) is None
    assert LIMITS.context_failure(60, 40) is None
    early = LIMITS.context_failure(101, param="max_tokens")
    assert early.status == 400 and early.code == CONTEXT_LENGTH_EXCEEDED
    assert early.param == "max_tokens"
    assert (
        early.message
        == "this model's context window is 100 tokens; 'max_tokens' asks for 101 tokens"
    )
    exact = LIMITS.context_failure(61, 40)
    assert exact.param is None
    assert exact.message.endswith("the prompt has 40 tokens and the request asks for 61 more")
    bound = LIMITS.context_failure(1, 200, at_least=True)
    assert "the prompt has at least 200 tokens" in bound.message


def test_vocabulary_and_pool_checks() -> None:
    assert LIMITS.token_id_failure([0, 49]) is None
    assert "[0, 50)" in LIMITS.token_id_failure([50]).message
    assert LIMITS.token_id_failure([-1]) is not None
    assert RunnerLimits(max_context=8).token_id_failure([10**6]) is None  # 0: not checked
    assert LIMITS.kv_failure(30, 34) is None
    assert "pool holds 64" in LIMITS.kv_failure(30, 35).message


def test_limits_come_from_runner_info() -> None:
    info = RunnerInfo(
        num_pages=4,
        page_size=16,
        max_context=60,
        kv_bytes_per_token=8,
        num_params=1,
        model_name="tiny",
        vocab_size=32,
    )
    assert RunnerLimits.of(info) == RunnerLimits(max_context=60, vocab_size=32, kv_tokens=64)


async def test_limits_watch_waits_for_the_first_runner_info() -> None:
    watch = LimitsWatch()
    assert watch.current is None
    with pytest.raises(asyncio.TimeoutError):
        await watch.wait(0.01)
    waiter = asyncio.create_task(watch.wait(5.0))
    info = RunnerInfo(
        num_pages=2,
        page_size=4,
        max_context=8,
        kv_bytes_per_token=8,
        num_params=1,
        model_name="tiny",
    )
    watch.update(info)
    assert (await waiter).max_context == 8 and watch.current.kv_tokens == 8


def test_stop_ids_once() -> None:
    assert stop_ids(SamplingParams(stop_token_ids=[7, 2]), [2, 3]) == [7, 2, 3]
    assert stop_ids(SamplingParams(stop_token_ids=[7], ignore_eos=True), [2]) == [7]


def test_a_stop_string_finishes_the_request_it_does_not_abort_it() -> None:
    core = make_core()
    core.add(req("a", 3, max_tokens=10))
    core.add(req("b", 3, max_tokens=10))
    run_step(core)
    assert core.finish("a") and core.abort("b")
    assert not core.finish("a") and not core.abort("b")  # already gone
    stats = core.stats()
    assert (stats["num_finished"], stats["num_aborted"]) == (1, 1)
    assert core.allocator.num_free == core.allocator.num_pages


def test_tokens_left_is_the_one_count_of_what_a_request_may_still_take() -> None:
    from houchu.scheduler.request import Request
    from houchu.speculative.scheduling import _cap
    from houchu.transport.limits import tokens_left

    assert tokens_left(100, 40) == 60  # the window alone
    assert tokens_left(100, 45, max_tokens=20, generated=5) == 15  # max_tokens binds
    assert tokens_left(100, 95, max_tokens=20, generated=5) == 5  # the window binds
    near = Request("a", list(range(90)), SamplingParams(max_tokens=20), [])
    assert near.tokens_left(100) == 10 and near.max_length(100) == 100
    assert _cap(near, 100) == 9  # a verify step emits one token more than it verifies
    near.output_ids += [1] * 9
    assert near.tokens_left(100) == 1 and near.check_finished(100) is None
    near.output_ids.append(1)
    assert near.tokens_left(100) == 0 and near.check_finished(100) == "length"
    short = Request("b", [1] * 10, SamplingParams(max_tokens=3), [])
    assert short.tokens_left(100) == 3 and short.max_length(100) == 13
    assert _cap(short, 100) == 2
    short.output_ids += [1] * 3
    assert short.check_finished(100) == "length" and short.max_length(100) == 13
    assert "needs 100 tokens" in LIMITS.kv_failure(30, 200).message  # capped by the window
