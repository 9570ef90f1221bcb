"""The runner's side of the overlap scheduler (tiny random model): placeholder tokens
resolve to the previous step's sampled token, and the scheduler core driven one step
ahead over a real ``ModelRunner`` gives the same tokens as driven step by step."""

from __future__ import annotations

import pytest

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.options.batching_options import BatchingOptions
from houchu.runner.model_runner import ModelRunner
from houchu.scheduler.batcher import PLACEHOLDER_TOKEN
from houchu.scheduler.core import SchedulerCore
from houchu.text import stop as text_stop
from houchu.transport.messages import (
    RunnerInfo,
    SamplingParams,
    SeqInit,
    SeqWork,
    StepPlan,
    TokenizedRequest,
)
from tests.support.overlap import drive
from tests.support.runner_options import exact

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("overlap"), seed=11)


def new_runner(tiny_dir) -> ModelRunner:
    return ModelRunner(str(tiny_dir), exact(page_size=4, num_pages=64), quiet=True)


def work(rid, ids, start, pages, last=False) -> SeqWork:
    return SeqWork(
        rid=rid,
        token_ids=ids,
        start_pos=start,
        page_table=pages,
        sample=True,
        use_last_sampled=last,
    )


def test_placeholder_is_the_previous_steps_token(tiny_dir):
    prompt, pages = [5, 9, 17, 33, 4], [0, 1, 2]
    plain, over = new_runner(tiny_dir), new_runner(tiny_dir)
    a = plain.execute(
        StepPlan(
            step_id=0,
            init=[SeqInit(rid="a", sampling=GREEDY, prompt_ids=prompt)],
            work=[work("a", prompt, 0, pages)],
        )
    )
    b = over.execute(
        StepPlan(
            step_id=0,
            init=[SeqInit(rid="a", sampling=GREEDY, prompt_ids=prompt)],
            work=[work("a", prompt, 0, pages)],
        )
    )
    toks, placeheld = [a.outputs[0].token_id], [b.outputs[0].token_id]
    for i in range(6):
        pos = len(prompt) + i
        r = plain.execute(StepPlan(step_id=i + 1, work=[work("a", [toks[-1]], pos, pages)]))
        toks.append(r.outputs[0].token_id)
        plan = StepPlan(step_id=i + 1, work=[work("a", [PLACEHOLDER_TOKEN], pos, pages, True)])
        placeheld.append(over.execute(plan).outputs[0].token_id)
        assert plan.work[0].token_ids == [toks[-2]]  # resolved in place
    assert placeheld == toks
    assert r.started_at > 0


def test_placeholder_without_a_previous_sample_fails_and_changes_nothing(tiny_dir):
    runner = new_runner(tiny_dir)
    init = SeqInit(rid="a", sampling=GREEDY, prompt_ids=[5, 6, 7])
    chunk = SeqWork(rid="a", token_ids=[5, 6], start_pos=0, page_table=[0], sample=False)
    runner.execute(StepPlan(step_id=0, init=[init], work=[chunk]))  # samples nothing
    bad = StepPlan(step_id=1, work=[work("a", [PLACEHOLDER_TOKEN], 2, [0], True)])
    with pytest.raises(ValueError, match="previous step sampled nothing"):
        runner.execute(bad)
    assert runner.states["a"].generated == []
    runner.execute(StepPlan(step_id=2, work=[work("a", [7], 2, [0])]))  # samples
    with pytest.raises(ValueError, match="never initialised"):
        runner.execute(StepPlan(step_id=3, work=[work("zz", [7], 0, [1])]))
    # the failed step forgot what the step before it sampled: no stale token is used
    with pytest.raises(ValueError, match="previous step sampled nothing"):
        runner.execute(StepPlan(step_id=4, work=[work("a", [PLACEHOLDER_TOKEN], 3, [0], True)]))


def test_core_over_a_real_runner_overlapped_equals_step_by_step(tiny_dir):
    shared = [3, 14, 15, 92, 65, 35, 89, 79]
    specs = [
        ("a", shared + [1, 2], GREEDY, 9),
        ("b", shared + [7], SamplingParams(temperature=0.9, seed=7), 12),
        ("c", [40, 41, 42, 43, 44, 45, 46, 47, 48, 49, 50, 51, 52], GREEDY, 3),
        ("d", [60, 61], SamplingParams(temperature=0.0, repetition_penalty=1.3), 7),
        ("e", shared + [8, 8, 8], GREEDY, 1),
    ]

    def run(overlap: bool, stop_ids: list[int]):
        info = new_runner(tiny_dir)
        meta = info.info()
        core = SchedulerCore(
            RunnerInfo(
                num_pages=meta.num_pages,
                page_size=meta.page_size,
                max_context=meta.max_context,
                kv_bytes_per_token=8,
                num_params=1,
                model_name="tiny",
            ),
            BatchingOptions(max_batch_tokens=12, chunked_prefill_size=5),
            overlap=overlap,
        )
        for rid, prompt, sp, m in specs:
            stops = stop_ids if rid == "a" else []
            params = SamplingParams(**{**_fields(sp), "max_tokens": m, "stop_token_ids": stops})
            stops = text_stop.stop_ids(params, [2])
            core.add(TokenizedRequest(rid=rid, prompt_ids=prompt, sampling=params, stop_ids=stops))
        return drive(core, info, overlap=overlap), core

    plain, _ = run(False, [])
    stop = plain["a"][0][3]  # make "a" stop at its 4th token, one step before overlap sees it
    plain, _ = run(False, [stop])
    over, core = run(True, [stop])
    assert over == plain
    assert plain["a"][1] == "stop" and plain["e"][1] == "length"
    assert core.overlap.steps_ahead > 0 and core.overlap.discarded_tokens >= 1


def _fields(sp: SamplingParams) -> dict:
    return {f: getattr(sp, f) for f in sp.__struct_fields__}
