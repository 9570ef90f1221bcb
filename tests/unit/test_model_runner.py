"""ModelRunner: plan semantics, state, validation (tiny random model)."""

from __future__ import annotations

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.config.core import num_parameters
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import (
    RunnerInfo,
    SamplingParams,
    SeqInit,
    SeqWork,
    StepPlan,
    StepResult,
)
from tests.support.runner_options import exact

GREEDY = SamplingParams(temperature=0.0)


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("runner"), seed=3)


@pytest.fixture
def runner(tiny_dir):
    return ModelRunner(str(tiny_dir), exact(page_size=4, num_pages=32), quiet=True)


def init(rid: str, prompt: list[int], sp: SamplingParams = GREEDY) -> SeqInit:
    return SeqInit(rid=rid, sampling=sp, prompt_ids=prompt)


def work(rid, ids, start, pages, sample=True) -> SeqWork:
    return SeqWork(rid=rid, token_ids=ids, start_pos=start, page_table=pages, sample=sample)


def generate(runner: ModelRunner, rid: str, prompt: list[int], pages: list[int], n: int, step0=0):
    out = runner.execute(
        StepPlan(step_id=step0, init=[init(rid, prompt)], work=[work(rid, prompt, 0, pages)])
    )
    toks = [out.outputs[0].token_id]
    for i in range(n - 1):
        pos = len(prompt) + i
        res = runner.execute(
            StepPlan(step_id=step0 + 1 + i, work=[work(rid, [toks[-1]], pos, pages)])
        )
        toks.append(res.outputs[0].token_id)
    return toks


def test_info_and_summary(tiny_dir, capsys):
    r = ModelRunner(str(tiny_dir), exact(page_size=8, kv_cache_mb=64 / 1024))  # 64 KiB
    line = capsys.readouterr().out.strip()
    assert line.count("\n") == 0 and "llama" in line and "pages" in line and "float32" in line
    info = r.info()
    assert isinstance(info, RunnerInfo)
    assert info.kv_bytes_per_token == 2 * 2 * 2 * 16 * 4  # K+V, layers, kv heads, dim, fp32
    assert info.num_pages == 64 * 1024 // (8 * info.kv_bytes_per_token) == 16
    assert info.max_context == min(512, 16 * 8)
    assert info.num_params == num_parameters(r.config).total


def test_kv_budget_below_one_page_raises(tiny_dir):
    with pytest.raises(ValueError, match="less than one page"):
        ModelRunner(str(tiny_dir), exact(kv_cache_mb=10 / 2**20), quiet=True)  # 10 bytes


def test_greedy_generation_matches_hf(tiny_dir, runner):
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    prompt = [1, 17, 33, 90, 4, 4, 61]
    got = generate(runner, "a", prompt, [9, 3, 30, 12, 0], 12)
    with torch.no_grad():
        want = hf.generate(
            torch.tensor([prompt]), do_sample=False, max_new_tokens=12, min_new_tokens=12
        )[0, len(prompt) :].tolist()
    assert got == want


def test_result_shape_and_history(runner):
    res = runner.execute(
        StepPlan(
            step_id=7,
            init=[init("a", [1, 2, 3]), init("b", [4, 5])],
            work=[work("a", [1, 2, 3], 0, [0]), work("b", [4, 5], 0, [1], sample=False)],
        )
    )
    assert isinstance(res, StepResult) and res.step_id == 7 and res.num_tokens == 5
    assert [o.rid for o in res.outputs] == ["a"] and res.error is None
    assert res.outputs[0].logprob is None and res.duration_s > 0
    assert runner.states["a"].generated == [res.outputs[0].token_id]
    assert runner.states["b"].generated == []
    runner.execute(StepPlan(step_id=8, work=[], release=["a", "b", "never-seen"]))
    assert runner.states == {}


def test_logprobs_only_when_asked(runner):
    sp = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=2)
    res = runner.execute(
        StepPlan(
            step_id=0,
            init=[init("a", [5], sp), init("b", [6])],
            work=[work("a", [5], 0, [0]), work("b", [6], 0, [1])],
        )
    )
    a, b = res.outputs
    assert a.logprob is not None and len(a.top_logprobs) == 2 and a.top_logprobs[0][0] == a.token_id
    assert b.logprob is None and b.top_logprobs is None


def test_recompute_does_not_touch_penalty_history(runner):
    sp = SamplingParams(temperature=0.0, frequency_penalty=1.0, repetition_penalty=1.3)
    prompt = [3, 9, 27]
    res = runner.execute(
        StepPlan(step_id=0, init=[init("a", prompt, sp)], work=[work("a", prompt, 0, [2])])
    )
    t1 = res.outputs[0].token_id
    t2 = runner.execute(StepPlan(step_id=1, work=[work("a", [t1], 3, [2])])).outputs[0].token_id
    st = runner.states["a"]
    assert st.generated == [t1, t2] and float(st.counts.sum()) == 2
    # preempted: recompute prompt + generated on new pages, no sample until the last chunk
    full = prompt + [t1, t2]
    runner.execute(StepPlan(step_id=2, work=[work("a", full[:3], 0, [7, 8], sample=False)]))
    assert st.generated == [t1, t2]
    res = runner.execute(StepPlan(step_id=3, work=[work("a", full[3:], 3, [7, 8])]))
    assert st.generated == [t1, t2, res.outputs[0].token_id]
    assert float(st.counts.sum()) == 3


@pytest.mark.parametrize(
    ("plan", "match"),
    [
        (StepPlan(step_id=0, work=[work("ghost", [1], 0, [0])]), "never initialised"),
        (
            StepPlan(step_id=0, init=[init("x", [1])], work=[work("x", [1], 0, [32])]),
            "page index out of range",
        ),
        (
            StepPlan(step_id=0, init=[init("x", [1])], work=[work("x", [1], 0, [-1])]),
            "page index out of range",
        ),
        (
            StepPlan(step_id=0, init=[init("x", [1])], work=[work("x", [1] * 5, 0, [0])]),
            "need 2",
        ),
        (
            StepPlan(step_id=0, init=[init("x", [1])], work=[work("x", [1], 128, list(range(32)))]),
            "max_context",
        ),
        (StepPlan(step_id=0, init=[init("x", [1])], work=[work("x", [], 0, [0])]), "empty"),
        (StepPlan(step_id=0, init=[init("x", [1])], work=[work("x", [128], 0, [0])]), "token id"),
        (StepPlan(step_id=0, init=[init("x", [1])], work=[work("x", [1], -1, [0])]), "negative"),
        (StepPlan(step_id=0, init=[init("x", [1]), init("x", [2])], work=[]), "already"),
        (
            StepPlan(
                step_id=0,
                init=[init("x", [1]), init("y", [1])],
                work=[work("x", [1], 0, [0]), work("y", [1], 0, [0])],
            ),
            "same KV slot",
        ),
        (
            StepPlan(
                step_id=0,
                init=[init("x", [1])],
                work=[work("x", [1], 0, [0]), work("x", [1], 1, [0])],
            ),
            "twice",
        ),
        (
            StepPlan(step_id=0, init=[init("x", [1], SamplingParams(top_p=2.0))], work=[]),
            "top_p",
        ),
    ],
)
def test_invalid_plans_raise_and_change_nothing(runner, plan, match):
    runner.execute(StepPlan(step_id=0, init=[init("keep", [1])], work=[]))
    before = runner.pool.k.clone()
    with pytest.raises(ValueError, match=match):
        runner.execute(plan)
    assert set(runner.states) == {"keep"}
    assert torch.equal(runner.pool.k, before)


def test_release_then_work_in_same_plan_is_an_error(runner):
    runner.execute(StepPlan(step_id=0, init=[init("a", [1])], work=[work("a", [1], 0, [0])]))
    with pytest.raises(ValueError, match="never initialised"):
        runner.execute(StepPlan(step_id=1, release=["a"], work=[work("a", [2], 1, [0])]))
    assert "a" in runner.states  # the failed plan released nothing


def test_reinit_after_release(runner):
    runner.execute(StepPlan(step_id=0, init=[init("a", [1])], work=[]))
    runner.execute(StepPlan(step_id=1, init=[init("a", [2])], release=["a"], work=[]))
    assert runner.states["a"].prompt_ids == [2]
