"""A scheduler core on a fake runner: requests, steps, and its page-table invariants."""

from __future__ import annotations

from houchu.options.batching_options import BatchingOptions
from houchu.scheduler.core import SchedulerCore
from houchu.transport.messages import (
    RunnerInfo,
    SamplingParams,
    SeqOutput,
    StepPlan,
    StepResult,
    TokenizedRequest,
)

EOS = 2


def make_core(num_pages=16, page_size=4, max_context=256, radix=False, **batch) -> SchedulerCore:
    info = RunnerInfo(
        num_pages=num_pages,
        page_size=page_size,
        max_context=max_context,
        kv_bytes_per_token=8,
        num_params=1,
        model_name="tiny",
    )
    return SchedulerCore(info, BatchingOptions(**batch, disable_radix_cache=not radix))


def req(rid: str, n_prompt: int, max_tokens: int = 4) -> TokenizedRequest:
    return TokenizedRequest(
        rid=rid,
        prompt_ids=list(range(10, 10 + n_prompt)),
        sampling=SamplingParams(temperature=0.0, max_tokens=max_tokens),
        stop_ids=[EOS],
    )


def run_step(core: SchedulerCore, token: int = 7) -> tuple[StepPlan, list]:
    plan = core.next_plan()
    assert plan is not None
    outs = [SeqOutput(rid=w.rid, token_id=token) for w in plan.work if w.sample]
    events = core.apply(
        StepResult(step_id=plan.step_id, outputs=outs, duration_s=0.0, num_tokens=0)
    )
    return plan, events


def check_page_tables(core: SchedulerCore) -> None:
    """Every page is free, or referenced exactly by its users (tree + page tables; a
    table's leading entries released outside a sliding window hold nothing)."""
    users: dict[int, int] = {}
    for r in core.batcher.running.values():
        held = r.page_table[r.num_dead_pages :]
        assert len(held) == len(set(held)), "a page twice in one table"
        for p in held:
            users[p] = users.get(p, 0) + 1
    for p in core.tree.pages() if core.tree else []:
        users[p] = users.get(p, 0) + 1
    a = core.allocator
    for p in range(a.num_pages):
        assert a.ref_count(p) == users.get(p, 0), f"page {p}"
    assert a.num_free == a.num_pages - len(users)
