"""Batch-invariant inference (``houchu serve --deterministic``,
``houchu.runner.deterministic``) at the runner level, on the default model: a prompt's
logits are bit for bit the same alone and in steps of 2..17 sequences beside other
prompts and decode rows of other lengths, at any place, and from an extend over its
cached pages; on the default int4 path, int8 weights and the exact float32 path."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from houchu.model.batch import build_batch
from houchu.options.runner_options import RunnerOptions
from houchu.runner.deterministic import DeterministicUnsupported, check_options
from houchu.runner.model_runner import ModelRunner
from houchu.transport.step_messages import SeqWork

pytestmark = pytest.mark.slow

PAGE = 16
PROMPT = 37  # the target prompt's tokens: two full pages and a partial one
#: rows in the target's step: each side of the power-of-two bucket edges up to 17
STEP_SIZES = (2, 3, 4, 5, 8, 9, 16, 17)


@pytest.fixture(scope="module", params=["auto", "int8", "none"], ids=["int4", "int8", "exact"])
def runner(request: pytest.FixtureRequest, real_model_path: Path) -> ModelRunner:
    """The default model with ``--deterministic`` (``auto``: its int4 GGUF path;
    ``int8``: int8 weights;
    ``none``: the exact float32 path)."""
    o = RunnerOptions(
        device="cpu", quantization=request.param, deterministic=True, page_size=PAGE, num_pages=160
    )
    return ModelRunner(str(real_model_path), o, quiet=True)


def logits(r: ModelRunner, work: list[SeqWork]) -> torch.Tensor:
    """``[len(work), V]`` float32 logits of one step of ``work`` (every item samples)."""
    batch = build_batch(
        work,
        page_size=PAGE,
        num_pages=r.pool.num_pages,
        max_context=r.max_context,
        vocab_size=r.config.vocab_size,
    )
    with torch.inference_mode():
        return r.model(batch, r.pool, r.backend).clone()


def pages(first: int, tokens: int) -> list[int]:
    """Consecutive page indices from ``first`` holding ``tokens`` positions."""
    return list(range(first, first + -(-tokens // PAGE)))


@pytest.mark.parametrize("length", [PROMPT, 5])
def test_prompt_logits_do_not_depend_on_the_rest_of_the_step(
    runner: ModelRunner, length: int
) -> None:
    """A prompt of ``length`` tokens: 37 (a prefill-sized step alone) or 5 (a step the
    default route gives a decode bucket's path alone and the prefill path in company)."""
    g = torch.Generator().manual_seed(length)
    vocab = runner.config.vocab_size
    prompt = torch.randint(0, vocab, (length,), generator=g).tolist()
    target = SeqWork(
        rid="t", token_ids=prompt, start_pos=0, page_table=pages(0, length), sample=True
    )
    alone = logits(runner, [target])[0]  # [V]
    # the other rows: prompts of 1..40 tokens and decode rows over 20..60 cached positions
    others, page = [], 4
    for i in range(16):
        if i % 3 == 2:  # a decode row: one new token after positions its pages hold
            ctx = 20 + 3 * i
            ids, start = [int(torch.randint(0, vocab, (1,), generator=g))], ctx
        else:
            ids, start = torch.randint(0, vocab, (1 + 5 * i % 40,), generator=g).tolist(), 0
        table = pages(page, start + len(ids))
        page += len(table)
        others.append(
            SeqWork(rid=f"o{i}", token_ids=ids, start_pos=start, page_table=table, sample=True)
        )
    for size in STEP_SIZES:
        for at in (0, size // 2, size - 1):
            work = others[: size - 1]
            work = [*work[:at], target, *work[at:]]
            got = logits(runner, work)[at]
            assert torch.equal(got, alone), (size, at, (got - alone).abs().max().item())
    if length < 2 * PAGE + 1:
        return
    # an extend over the prompt's two cached pages gives its last token the same logits
    extend = SeqWork(
        rid="t",
        token_ids=prompt[2 * PAGE :],
        start_pos=2 * PAGE,
        page_table=target.page_table,
        sample=True,
    )
    for work in ([extend], [others[0], extend, others[2]]):
        got = logits(runner, work)[work.index(extend)]
        assert torch.equal(got, alone), (len(work), (got - alone).abs().max().item())


def test_runner_says_what_it_pinned(runner: ModelRunner) -> None:
    assert runner.tuned is None and runner.accel.kind is None  # no measured route, no compile
    assert runner.info().deterministic == runner.deterministic
    assert "fixed threads" in runner.deterministic
    if runner.options.quantization == "none":
        assert "dense matmuls in calls of 8 rows" in runner.deterministic
    else:
        assert "C++ GEMV" in runner.deterministic


@pytest.mark.parametrize(
    ("kw", "match"),
    [
        ({"int4_activations": "int8"}, "float activations"),
        ({"quantization": "w8a8"}, "w8a8"),
        ({"tensor_parallel_size": 2}, "tensor parallel"),
    ],
)
def test_refused_combinations(kw: dict, match: str) -> None:
    with pytest.raises(DeterministicUnsupported, match=match):
        check_options(RunnerOptions(deterministic=True, **kw), torch.device("cpu"))
    with pytest.raises(DeterministicUnsupported, match="CPU only"):
        check_options(RunnerOptions(deterministic=True), torch.device("cuda"))


@pytest.mark.parametrize("splits", [(36, 1), (20, 16, 1), (30, 7)])
def test_a_prompt_in_chunks_equals_it_prefilled_whole(runner: ModelRunner, splits) -> None:
    """The prompt's last-token logits from chunked prefills, the last chunk a single
    token (which without the mode attends on the decode kernel) or a short extend beside
    another one in the same step (without the mode, one batched SDPA call), equal those
    of one whole prefill bit for bit."""
    g = torch.Generator().manual_seed(11)
    prompt = torch.randint(0, runner.config.vocab_size, (PROMPT,), generator=g).tolist()
    other = torch.randint(0, runner.config.vocab_size, (PROMPT,), generator=g).tolist()
    whole = logits(runner, [_chunk("w", prompt, 0, PROMPT, pages(0, PROMPT), True)])
    table, beside = pages(10, PROMPT), pages(20, PROMPT)
    pos = 0
    for i, n in enumerate(splits):
        last = i == len(splits) - 1
        work = [_chunk("c", prompt, pos, PROMPT - pos if last else n, table, last)]
        work.append(_chunk("o", other, pos, n, beside, last))
        got = logits(runner, work)
        pos += n
    assert torch.equal(got[0], whole[0])


def _chunk(rid: str, ids: list[int], pos: int, n: int, table: list[int], sample: bool):
    """The work item of ``ids[pos : pos + n]`` for request ``rid``."""
    return SeqWork(
        rid=rid, token_ids=ids[pos : pos + n], start_pos=pos, page_table=table, sample=sample
    )
