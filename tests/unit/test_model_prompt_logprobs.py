"""Prompt logprobs in the runner (tiny random model): they match transformers', whole
or chunked, and a recomputed chunk is not scored twice."""

from __future__ import annotations

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

PROMPT = [1, 17, 33, 90, 4, 4, 61, 7, 12, 99, 5]


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("prompt_lps"), seed=5)


@pytest.fixture(scope="module")
def hf_logprobs(tiny_dir) -> torch.Tensor:
    """``[P - 1]`` transformers' logprob of each prompt token after the first."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = hf(torch.tensor([PROMPT])).logits[0].float()  # [P, V]
    lp = torch.log_softmax(logits[:-1], dim=-1)
    return lp.gather(1, torch.tensor(PROMPT[1:])[:, None])[:, 0]


def _runner(tiny_dir) -> ModelRunner:
    return ModelRunner(str(tiny_dir), exact(page_size=4, num_pages=16), quiet=True)


def _work(ids, start, sample) -> SeqWork:
    return SeqWork(rid="a", token_ids=ids, start_pos=start, page_table=[0, 1, 2, 3], sample=sample)


@pytest.mark.parametrize("chunks", [[11], [4, 7], [3, 3, 3, 2]])
def test_prompt_logprobs_match_transformers(tiny_dir, hf_logprobs, chunks):
    runner = _runner(tiny_dir)
    sp = SamplingParams(temperature=0.0, prompt_logprobs=3)
    got, start = [], 0
    for step, n in enumerate(chunks):
        end = start + n
        init = [SeqInit(rid="a", sampling=sp, prompt_ids=PROMPT)] if step == 0 else []
        res = runner.execute(
            StepPlan(step_id=step, init=init, work=[_work(PROMPT[start:end], start, end == 11)])
        )
        for plp in res.prompt_logprobs:
            assert plp.start == len(got) + 1
            assert all(r >= 1 for r in plp.ranks) and all(len(t) == 3 for t in plp.top)
            for lp, rank, top in zip(plp.logprobs, plp.ranks, plp.top, strict=True):
                assert top[0][1] >= lp and (rank == 1) == (abs(top[0][1] - lp) < 1e-6)
            got.extend(plp.logprobs)
        start = end
    assert len(res.outputs) == 1  # the sample row still samples
    torch.testing.assert_close(torch.tensor(got), hf_logprobs, rtol=1e-4, atol=1e-4)


def test_a_recomputed_chunk_is_not_scored_again(tiny_dir, hf_logprobs):
    runner = _runner(tiny_dir)
    sp = SamplingParams(temperature=0.0, prompt_logprobs=0)
    init = [SeqInit(rid="a", sampling=sp, prompt_ids=PROMPT)]
    first = runner.execute(StepPlan(step_id=0, init=init, work=[_work(PROMPT[:6], 0, False)]))
    assert [len(p.logprobs) for p in first.prompt_logprobs] == [6]
    # preempted, then recomputed from position 0: only the positions not scored yet
    again = runner.execute(StepPlan(step_id=1, work=[_work(PROMPT, 0, True)]))
    (plp,) = again.prompt_logprobs
    assert plp.start == 7 and len(plp.logprobs) == 4 and plp.top == [[]] * 4
    torch.testing.assert_close(torch.tensor(plp.logprobs), hf_logprobs[6:], rtol=1e-4, atol=1e-4)


def test_requests_without_prompt_logprobs_score_nothing(tiny_dir):
    runner = _runner(tiny_dir)
    init = [SeqInit(rid="a", sampling=SamplingParams(temperature=0.0), prompt_ids=PROMPT)]
    res = runner.execute(StepPlan(step_id=0, init=init, work=[_work(PROMPT, 0, True)]))
    assert res.prompt_logprobs == [] and len(res.outputs) == 1
