"""Output that does not depend on the load, without ``--deterministic`` (issue 45 item 6),
at the runner level on the default model: every bucket of a measured route runs one
activation format, and a prompt's tokens attend on the prefill kernel whether its first
pages were cached or not (``StepBatch.prompt_seqs``), so a prompt's logits are the same
bits cold and cached, in either format."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from houchu.options.runner_options import RunnerOptions
from houchu.runner.autotune import DecodeRoute, attach, invariant_where_free
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, StepPlan
from houchu.transport.step_messages import SeqWork

pytestmark = pytest.mark.slow

PAGE = 16
PROMPT = 37  # two full pages and 5 tokens

#: a route of each activation format, as ``autotune`` makes them (one format throughout)
ROUTES = {
    "int8": DecodeRoute({1: "fused-a8", 8: "fused-a8", 32: "gemv-a8"}, prefill="gemv-a8"),
    "float": DecodeRoute({1: "fused", 8: "fused", 32: "gemv"}, prefill="gemv"),
}


@pytest.fixture(scope="module")
def runner(real_model_path: Path) -> ModelRunner:
    """The default model on its default int4 path, the route attached by each test."""
    o = RunnerOptions(
        device="cpu", compile="off", decode_paths="rules", page_size=PAGE, num_pages=160
    )
    r = ModelRunner(str(real_model_path), o, quiet=True)
    invariant_where_free(r.model)  # as the measured route's start-up does
    return r


def _first_token(r: ModelRunner, rid: str, prompt: list[int], cached: int, pages: list[int]):
    """The greedy first token's (id, logprob, top 5) of ``prompt`` whose first ``cached``
    tokens' KV is already in ``pages`` (computed by an earlier request), through
    ``ModelRunner.execute``: only the rest is planned, as the scheduler plans a prompt
    that hits the prefix cache."""
    g = SamplingParams(temperature=0.0, logprobs=True, top_logprobs=5, ignore_eos=True)
    init = [SeqInit(rid=rid, sampling=g, prompt_ids=prompt)]
    work = SeqWork(
        rid=rid, token_ids=prompt[cached:], start_pos=cached, page_table=pages, sample=True
    )
    out = r.execute(StepPlan(step_id=0, init=init, work=[work])).outputs[0]
    r.execute(StepPlan(step_id=1, work=[], release=[rid]))
    return out.token_id, out.logprob, out.top_logprobs


@pytest.mark.parametrize("fmt", sorted(ROUTES))
def test_a_prompt_gets_the_same_logits_cold_and_cached(runner: ModelRunner, fmt: str) -> None:
    """Cold (the whole prompt in one step), then cached up to a page boundary (a 5-token
    tail) and up to its last token (a 1-token tail, which attended on the decode kernel
    before): the first token's logprobs are equal bit for bit."""
    attach(runner.model, ROUTES[fmt])
    g = torch.Generator().manual_seed(45)
    pages = list(range(3))
    for i in range(4):
        prompt = torch.randint(0, runner.config.vocab_size, (PROMPT,), generator=g).tolist()
        cold = _first_token(runner, f"c{i}", prompt, 0, pages)
        for cached in (2 * PAGE, PROMPT - 1):
            got = _first_token(runner, f"h{i}-{cached}", prompt, cached, pages)
            assert got == cold, (fmt, i, cached)


def test_prompt_chunks_are_marked_and_decode_rows_are_not(runner: ModelRunner) -> None:
    """The runner marks a plan's prompt chunks (``prompt_chunk_rids``), a one-token tail
    included; a decode row is not one, and keeps the fused decode kernels."""
    attach(runner.model, ROUTES["int8"])
    g = SamplingParams(temperature=0.0, ignore_eos=True)
    prompt = list(range(100, 100 + PROMPT))
    init = [SeqInit(rid="p", sampling=g, prompt_ids=prompt)]
    pages = [0, 1, 2]
    tail = SeqWork(
        rid="p", token_ids=prompt[-1:], start_pos=PROMPT - 1, page_table=pages, sample=True
    )
    before = runner.model.fused.steps
    out = runner.execute(StepPlan(step_id=0, init=init, work=[tail])).outputs[0]
    assert runner.prompt_rids == {"p"} and runner.model.fused.steps == before
    step = SeqWork(
        rid="p", token_ids=[out.token_id], start_pos=PROMPT, page_table=pages, sample=True
    )
    runner.execute(StepPlan(step_id=1, work=[step]))
    assert runner.prompt_rids == set() and runner.model.fused.steps == before + 1
    runner.execute(StepPlan(step_id=2, work=[], release=["p"]))


def test_int8_activations_asked_for_leave_no_float_path(real_model_path: Path) -> None:
    """``--int4-activations int8`` on the default model, whose LM head is kept as stored
    with float activations: the route's choices are the int8 paths only (the head's own
    option made the float paths choices too, and the measured route could ignore the
    flag)."""
    from houchu.runner.autotune import available_paths

    o = RunnerOptions(
        device="cpu", compile="off", decode_paths="rules", int4_activations="int8", num_pages=8
    )
    r = ModelRunner(str(real_model_path), o, quiet=True)
    assert available_paths(r.model) == ["fused-a8", "gemv-a8"]


def test_a_decode_row_is_the_same_alone_and_beside_seven_others(runner: ModelRunner) -> None:
    """The float family at the AVX-512 levels (batch-invariant GEMV sums, the fused
    layers' included) and the int8 family: a decode row's logits are the same bits in a
    step of one row and in a step of eight."""
    from houchu.model.batch import build_batch

    def step(work: list[SeqWork]) -> torch.Tensor:
        b = build_batch(
            work,
            page_size=PAGE,
            num_pages=runner.pool.num_pages,
            max_context=runner.max_context,
            vocab_size=runner.config.vocab_size,
        )
        with torch.inference_mode():
            return runner.model(b, runner.pool, runner.backend).clone()

    def pages(i: int) -> list[int]:
        return [40 + 2 * i, 41 + 2 * i]

    for fmt, seed in ((f, s) for f in sorted(ROUTES) for s in range(4)):
        if fmt == "float" and not runner.model.fused.batch_invariant:
            continue  # avx2 / NEON: the float GEMV's sums follow the tile's rows
        attach(runner.model, ROUTES[fmt])
        g = torch.Generator().manual_seed(seed)
        prompts = [torch.randint(100, 40000, (20 + i,), generator=g).tolist() for i in range(8)]
        for i, p in enumerate(prompts):
            step([SeqWork(rid=f"d{i}", token_ids=p, start_pos=0, page_table=pages(i), sample=True)])
        rows = [
            SeqWork(rid=f"d{i}", token_ids=[11], start_pos=len(p), page_table=pages(i), sample=True)
            for i, p in enumerate(prompts)
        ]
        before = runner.model.fused.steps
        alone, beside = step(rows[:1])[0], step(rows)[0]
        assert runner.model.fused.steps == before + 2  # both on the fused layers
        assert torch.equal(alone, beside), (fmt, seed, (alone - beside).abs().max().item())
