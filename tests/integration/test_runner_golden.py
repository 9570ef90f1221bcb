"""Golden test: houchu's runner against Hugging Face transformers on the real model.

Greedy decoding of SmolLM2-135M-Instruct (Q4_1 GGUF, dequantized to fp32 by both),
three prompts batched together in every step, must give the same tokens as
``AutoModelForCausalLM.generate(do_sample=False)`` run per prompt.
"""

from __future__ import annotations

import pytest
import torch

from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow

NEW_TOKENS = 32
PAGE = 16


@pytest.fixture(scope="module")
def hf(hf_model):
    """(tokenizer, model) from transformers: the session's (``conftest.hf_model``)."""
    return hf_model


@pytest.fixture(scope="module")
def prompts(hf):
    tok, _ = hf
    chat = tok.apply_chat_template(
        [{"role": "user", "content": "Write a haiku about a kitchen at night."}],
        add_generation_prompt=True,
        tokenize=False,
    )
    texts = [
        chat,
        "The three most important inventions of the nineteenth century were",
        "def fibonacci(n):\n    ",
    ]
    return [tok(t)["input_ids"] for t in texts]


def runner_generate(runner: ModelRunner, prompts: list[list[int]]) -> list[list[int]]:
    """Prefill all prompts in one step, then decode one token per step, all batched."""
    rids = [f"r{i}" for i in range(len(prompts))]
    pages_each = -(-(max(map(len, prompts)) + NEW_TOKENS) // PAGE)
    tables = {
        r: list(range(i, runner.pool.num_pages, len(rids)))[:pages_each] for i, r in enumerate(rids)
    }
    greedy = SamplingParams(temperature=0.0, ignore_eos=True, max_tokens=NEW_TOKENS)
    init = [
        SeqInit(rid=r, sampling=greedy, prompt_ids=p) for r, p in zip(rids, prompts, strict=True)
    ]
    work = [
        SeqWork(rid=r, token_ids=p, start_pos=0, page_table=tables[r], sample=True)
        for r, p in zip(rids, prompts, strict=True)
    ]
    out = {r: [] for r in rids}
    plan = StepPlan(step_id=0, work=work, init=init)
    for step in range(NEW_TOKENS):
        for o in runner.execute(plan).outputs:
            out[o.rid].append(o.token_id)
        work = [
            SeqWork(
                rid=r,
                token_ids=[out[r][-1]],
                start_pos=len(p) + step,
                page_table=tables[r],
                sample=True,
            )
            for r, p in zip(rids, prompts, strict=True)
        ]
        plan = StepPlan(step_id=step + 1, work=work)
    runner.execute(StepPlan(step_id=NEW_TOKENS + 1, work=[], release=rids))
    return [out[r] for r in rids]


def test_greedy_matches_transformers(real_model_path, hf, prompts):
    _, model = hf
    runner = ModelRunner(str(real_model_path), exact(page_size=PAGE, num_pages=64))
    got = runner_generate(runner, prompts)
    eos = set(runner.config.eos_token_ids)
    for ids, ours in zip(prompts, got, strict=True):
        with torch.no_grad():
            full = model.generate(torch.tensor([ids]), do_sample=False, max_new_tokens=NEW_TOKENS)[
                0, len(ids) :
            ].tolist()
        # transformers stops at EOS; houchu ignores it (ignore_eos is the scheduler's job)
        assert len(full) == NEW_TOKENS or full[-1] in eos
        assert ours[: len(full)] == full
