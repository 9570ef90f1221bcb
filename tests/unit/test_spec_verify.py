"""Speculative verification in the runner: the acceptance rule, the sampled distribution
(chi-square against the target's own), and seeds / penalties / logprobs as without
speculation (tiny random models)."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.sampling.sampler import RequestState, Sampler
from houchu.model.sampling.verify import sample_and_verify
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

GREEDY = SamplingParams(temperature=0.0)
VOCAB = 12


def states(n: int, sp: SamplingParams = GREEDY, vocab: int = 16) -> list[RequestState]:
    return [RequestState(f"r{i}", sp, [1, 2], vocab) for i in range(n)]


def rows_with_argmax(argmaxes: list[int], vocab: int = 16) -> torch.Tensor:
    logits = torch.zeros(len(argmaxes), vocab)
    for i, a in enumerate(argmaxes):
        logits[i, a] = 5.0
    return logits  # [R, V]


def test_greedy_accepts_exactly_the_argmax_prefix():
    sampler = Sampler(seed=0)
    logits = rows_with_argmax([5, 7, 9, 3, 4, 6])  # request 0: 4 rows, request 1: 2 rows
    st = states(2)
    out = sample_and_verify(sampler, logits, [4, 2], st, [[5, 7, 1], [6]])
    assert [s.token_id for s in out[0]] == [5, 7, 9]  # two accepted, then the correction
    assert [s.token_id for s in out[1]] == [4]  # first proposal rejected
    assert st[0].generated == [5, 7, 9] and st[1].generated == [4]


def test_all_accepted_gets_the_bonus_token_and_plain_rows_sample_once():
    sampler = Sampler(seed=0)
    logits = rows_with_argmax([5, 7, 9, 2])
    out = sample_and_verify(sampler, logits, [3, 1], states(2), [[5, 7], []])
    assert [s.token_id for s in out[0]] == [5, 7, 9] and [s.token_id for s in out[1]] == [2]


def test_counts_must_match_drafts_and_rows():
    sampler, logits = Sampler(seed=0), rows_with_argmax([1, 2, 3])
    with pytest.raises(ValueError):
        sample_and_verify(sampler, logits, [2, 1], states(2), [[1, 2], []])
    with pytest.raises(ValueError):
        sample_and_verify(sampler, logits, [2, 2], states(2), [[1], [2]])


# ---------------------------------------------------------------- the distribution


@pytest.fixture(scope="module")
def small_vocab(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("v12"), seed=11, vocab_size=VOCAB)


def chi2_critical(df: int, z: float = 3.09) -> float:
    """Upper 0.1% point of chi-square with ``df`` degrees of freedom (Wilson-Hilferty)."""
    a = 2.0 / (9.0 * df)
    return df * (1.0 - a + z * math.sqrt(a)) ** 3


def chi_square(counts: Counter, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson's statistic of ``counts`` against ``probs`` [V], bins with an expected
    count below 5 pooled into one; returns (statistic, degrees of freedom)."""
    n = sum(counts.values())
    exp = (probs.double() * n).tolist()
    big = [x for x in range(len(exp)) if exp[x] >= 5]
    small = [x for x in range(len(exp)) if exp[x] < 5]
    cells = [(counts[x], exp[x]) for x in big]
    if small:
        cells.append((sum(counts[x] for x in small), sum(exp[x] for x in small)))
    stat = sum((o - e) ** 2 / e for o, e in cells if e > 0)
    return stat, len(cells) - 1


def target_probs(model_dir, prefix: list[int]) -> torch.Tensor:
    """The target's next-token distribution after ``prefix`` (temperature 1), [V]."""
    from transformers import LlamaForCausalLM

    hf = LlamaForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return hf(torch.tensor([prefix])).logits[0, -1].softmax(-1)


def test_sampled_tokens_follow_the_target_distribution(small_vocab):
    """N seeded requests verify the same two proposals once each. The first emitted token
    must be distributed as p1 = p(. | prompt) and, when d1 was accepted, the second as
    p2 = p(. | prompt, d1) — whatever the proposals are."""
    n, prompt = 2500, [1, 5, 9, 3, 7]  # page 0 (positions 0..3) is shared by all
    p1 = target_probs(small_vocab, prompt)
    d1 = int(p1.argsort(descending=True)[1])  # a plausible but not the likeliest token
    p2 = target_probs(small_vocab, prompt + [d1])
    d2 = int(p2.argmax())
    runner = ModelRunner(str(small_vocab), exact(page_size=4, num_pages=n + 1), quiet=True)
    rids = [f"s{i}" for i in range(n)]
    init = [
        SeqInit(rid=r, sampling=SamplingParams(temperature=1.0, seed=i), prompt_ids=prompt)
        for i, r in enumerate(["head", *rids])
    ]
    head = SeqWork(rid="head", token_ids=prompt[:4], start_pos=0, page_table=[0], sample=False)
    runner.execute(StepPlan(step_id=0, init=init, work=[head]))
    verify = [
        SeqWork(
            rid=r,
            token_ids=[prompt[-1], d1, d2],
            start_pos=len(prompt) - 1,
            page_table=[0, 1 + i],
            sample=True,
            num_draft=2,
        )
        for i, r in enumerate(rids)
    ]
    res = runner.execute(StepPlan(step_id=1, work=verify))
    emitted: dict[str, list[int]] = {}
    for o in res.outputs:
        emitted.setdefault(o.rid, []).append(o.token_id)
    first = Counter(e[0] for e in emitted.values())
    second = Counter(e[1] for e in emitted.values() if len(e) > 1)
    assert all(len(e) == 1 or e[0] == d1 for e in emitted.values())
    assert sum(second.values()) > 300  # enough acceptances to test the second position
    for counts, p in ((first, p1), (second, p2)):
        stat, df = chi_square(counts, p)
        assert stat < chi2_critical(df), (stat, df, counts, p)
    # power: the classic mistake (resampling from p itself after a rejection) gives
    # P(d1) = p(d1) + (1 - p(d1)) p(d1); the same samples must reject it
    wrong = p1 * (1 - p1[d1])
    wrong[d1] += p1[d1]
    stat, df = chi_square(first, wrong)
    assert stat > chi2_critical(df)


# ---------------------------------------------------------------- as without speculation


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("spec"), seed=3)


def generate(runner: ModelRunner, sp: SamplingParams, prompt: list[int], n: int, drafts=None):
    """``n`` tokens (and logprobs) of one request; ``drafts(history)`` gives the proposals
    to verify at each step (None: plain decoding)."""
    pages = list(range(16))
    runner.execute(
        StepPlan(
            step_id=0,
            init=[SeqInit(rid="a", sampling=sp, prompt_ids=prompt)],
            work=[
                SeqWork(rid="a", token_ids=prompt[:-1], start_pos=0, page_table=pages, sample=False)
            ],
        )
    )
    toks, lps, step = [], [], 1
    while len(toks) < n:
        last = (prompt + toks)[-1]
        d = drafts(toks) if drafts else []
        w = SeqWork(
            rid="a",
            token_ids=[last, *d],
            start_pos=len(prompt) + len(toks) - 1,
            page_table=pages,
            sample=True,
            num_draft=len(d),
        )
        res = runner.execute(StepPlan(step_id=step, work=[w]))
        toks += [o.token_id for o in res.outputs]
        lps += [(o.logprob, o.top_logprobs) for o in res.outputs]
        step += 1
    return toks[:n], lps[:n]


@pytest.mark.parametrize(
    "sp",
    [
        SamplingParams(temperature=0.0, repetition_penalty=1.3, logprobs=True, top_logprobs=3),
        SamplingParams(
            temperature=0.9,
            top_k=20,
            top_p=0.95,
            seed=7,
            frequency_penalty=0.5,
            presence_penalty=0.3,
            logprobs=True,
            top_logprobs=2,
        ),
    ],
)
def test_seeds_penalties_and_logprobs_match_plain_decoding(tiny, sp):
    prompt, n = [1, 17, 33, 90, 4, 4, 61], 24
    plain = ModelRunner(str(tiny), exact(page_size=4, num_pages=32), quiet=True)
    want, want_lp = generate(plain, sp, prompt, n)

    def drafts(history: list[int]) -> list[int]:  # right for a while, then wrong
        i = len(history)
        good = want[i : i + 3]
        if i % 2 == 0 or not good:
            return good
        return [*good[:-1], (good[-1] + 1) % 128]

    spec = ModelRunner(str(tiny), exact(page_size=4, num_pages=32), quiet=True)
    got, got_lp = generate(spec, sp, prompt, n, drafts)
    assert got == want
    for (a, ta), (b, tb) in zip(got_lp, want_lp, strict=True):
        assert a == pytest.approx(b, abs=1e-4)
        assert [t for t, _ in ta] == [t for t, _ in tb]
