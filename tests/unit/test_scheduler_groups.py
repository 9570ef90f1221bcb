"""Prefill groups (``n > 1``): the prompt is prefilled once, the other choices start
from its pages in the radix tree; prompt-logprob requests compute their whole prompt."""

from __future__ import annotations

from houchu.transport.messages import SamplingParams, TokenizedRequest

from .test_scheduler import EOS, check_page_tables, make_core, run_step

PROMPT = list(range(10, 23))  # 13 tokens: 3 full pages of 4 before the last token


def choice(i: int, group: str = "g", **kw) -> TokenizedRequest:
    return TokenizedRequest(
        rid=f"g-{i}",
        prompt_ids=list(PROMPT),
        sampling=SamplingParams(temperature=1.0, seed=i, max_tokens=3, **kw),
        stop_ids=[EOS],
        prefill_group=group,
    )


def test_the_prompt_is_prefilled_once_and_shared():
    core = make_core(radix=True, num_pages=32)
    for i in range(3):
        core.add(choice(i))
    plan, _ = run_step(core)
    assert [(w.rid, w.start_pos, len(w.token_ids)) for w in plan.work] == [("g-0", 0, 13)]
    plan, events = run_step(core)  # the others start from the 12 cached tokens
    starts = {w.rid: (w.start_pos, len(w.token_ids)) for w in plan.work}
    assert starts == {"g-0": (13, 1), "g-1": (12, 1), "g-2": (12, 1)}
    assert {e.rid: e.cached_tokens for e in events if e.rid != "g-0"} == {"g-1": 12, "g-2": 12}
    stats = core.stats()
    assert stats["parallel_sampling_tokens_shared"] == 24
    assert stats["prefix_tokens_reused"] == 24
    check_page_tables(core)
    while core.has_work:
        run_step(core)
    assert core.batcher.groups.num_groups == 0
    check_page_tables(core)


def test_without_the_radix_cache_every_choice_prefills():
    core = make_core(radix=False, num_pages=32)
    for i in range(3):
        core.add(choice(i))
    plan, _ = run_step(core)
    assert sorted((w.rid, w.start_pos) for w in plan.work) == [("g-0", 0), ("g-1", 0), ("g-2", 0)]
    assert core.stats()["parallel_sampling_tokens_shared"] == 0


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
