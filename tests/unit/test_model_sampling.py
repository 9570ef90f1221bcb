"""Batched sampling: greedy, filters, penalties, per-request seeds, logprobs."""

from __future__ import annotations

import math

import pytest
import torch

from houchu.model.sampling.sampler import (
    RequestState,
    Sampler,
    apply_min_p,
    apply_penalties,
    apply_top_k,
    apply_top_p,
    draw_seed,
)
from houchu.transport.messages import SamplingParams

V = 50
INF = float("-inf")


def state(rid: str = "r", prompt: list[int] | None = None, **kw) -> RequestState:
    return RequestState(rid, SamplingParams(**kw), prompt or [], V)


def logits(rows: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed)) * 3


def test_greedy_is_argmax():
    x = logits(4)
    out = Sampler(seed=0).sample(x, [state(str(i), temperature=0.0) for i in range(4)])
    assert [s.token_id for s in out] == x.argmax(-1).tolist()
    assert all(s.logprob is None and s.top_logprobs is None for s in out)


def test_top_k_one_equals_greedy():
    x = logits(6, seed=1)
    states = [state(str(i), temperature=1.3, top_k=1) for i in range(6)]
    out = Sampler(seed=0).sample(x, states)
    assert [s.token_id for s in out] == x.argmax(-1).tolist()


def test_seeded_request_is_batch_independent():
    x = logits(5, seed=2)
    target = x[2:3].clone()

    def run(rows: torch.Tensor, idx: int, n: int) -> list[int]:
        st = state("seeded", temperature=1.0, top_p=0.9, seed=1234)
        sampler = Sampler()  # unseeded shared generator for the other rows
        toks = []
        for _ in range(n):
            others = [state(f"o{i}", temperature=0.8) for i in range(rows.shape[0])]
            states = others[:idx] + [st] + others[idx + 1 :]
            toks.append(sampler.sample(rows, states)[idx].token_id)
            st.append(toks[-1])
        return toks

    alone = run(target, 0, 20)
    batched = run(x, 2, 20)
    assert alone == batched
    assert len(set(alone)) > 1  # it really sampled


def test_top_k_mask():
    x = torch.tensor([[1.0, 5.0, 3.0, 4.0, 2.0], [1.0, 2.0, 3.0, 4.0, 5.0]])
    got = apply_top_k(x, torch.tensor([2, 0]))
    assert got[0].tolist() == [INF, 5.0, INF, 4.0, INF]
    assert got[1].tolist() == x[1].tolist()  # k=0: disabled


def test_top_p_mask():
    probs = torch.tensor([[0.5, 0.3, 0.15, 0.05]])
    x = probs.log()
    keep = lambda p: (apply_top_p(x, torch.tensor([p])) > INF)[0].tolist()  # noqa: E731
    assert keep(0.75) == [True, True, False, False]
    assert keep(0.85) == [True, True, True, False]
    assert keep(0.3) == [True, False, False, False]
    assert keep(1.0) == [True] * 4
    # token order does not matter
    perm = torch.tensor([2, 0, 3, 1])
    got = apply_top_p(x[:, perm], torch.tensor([0.75]))
    assert (got > INF)[0].tolist() == [False, True, False, True]


def test_min_p_mask():
    x = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    got = apply_min_p(x, torch.tensor([0.4]))  # threshold 0.2
    assert (got > INF)[0].tolist() == [True, True, False, False]
    assert torch.equal(apply_min_p(x, torch.tensor([0.0])), x)


def test_penalties_follow_definitions():
    x = torch.tensor([[2.0, -2.0, 1.0, 0.5, -1.0] + [0.0] * (V - 5)])
    s = state(prompt=[0, 1], repetition_penalty=2.0, frequency_penalty=0.5, presence_penalty=0.25)
    for t in (2, 2, 3):
        s.append(t)
    got = apply_penalties(x, [s])[0]
    # repetition (prompt + generated): positive / 2, negative * 2
    # then generated counts: token 2 twice, token 3 once
    assert got[0] == pytest.approx(1.0)
    assert got[1] == pytest.approx(-4.0)
    assert got[2] == pytest.approx(0.5 - 0.5 * 2 - 0.25)
    assert got[3] == pytest.approx(0.25 - 0.5 * 1 - 0.25)
    assert got[4] == pytest.approx(-1.0)  # never seen
    assert torch.equal(x[0, 5:], got[5:])
    assert x[0, 0] == 2.0  # input untouched


@pytest.mark.parametrize("penalty", [3.0, 1e20, 1e38, 1e300, 1.7976931348623157e308])
def test_a_huge_repetition_penalty_keeps_the_logits_finite(penalty: float) -> None:
    """The API takes any finite penalty; above float32's range it would be infinite,
    and a seen logit of 0 NaN (0 * inf): the penalty is capped, the row still samples
    and a seen token is never preferred to an unseen one of the same logit."""
    x = torch.tensor([[0.0, -1.0, 2.0, 0.0, -1.0] + [-50.0] * (V - 5)])
    s = state(prompt=[0, 1, 2], repetition_penalty=penalty, temperature=1.0, seed=1)
    got = apply_penalties(x, [s])[0]
    assert bool(torch.isfinite(got).all())
    assert got[0] <= got[3] and got[1] < got[4] and 0 < got[2] < 2.0
    assert Sampler(seed=0).sample(x, [s])[0].token_id in range(V)


def test_penalties_change_greedy_choice():
    x = torch.zeros(1, V)
    x[0, 7] = 1.0
    x[0, 8] = 0.9
    s = state(temperature=0.0, presence_penalty=0.5)
    sampler = Sampler(seed=0)
    assert sampler.sample(x, [s])[0].token_id == 7
    s.append(7)
    assert sampler.sample(x, [s])[0].token_id == 8


def test_logprobs_are_raw_log_softmax():
    x = logits(3, seed=4)
    states = [
        state("a", temperature=0.0, logprobs=True, top_logprobs=3),
        state("b", temperature=0.7, top_k=5, logprobs=True, top_logprobs=0, seed=3),
        state("c", temperature=1.0),
    ]
    out = Sampler(seed=0).sample(x, states)
    lp = torch.log_softmax(x, -1)
    a, b, c = out
    assert a.logprob == pytest.approx(float(lp[0].max()))
    top = lp[0].topk(3)
    assert [t for t, _ in a.top_logprobs] == top.indices.tolist()
    assert [v for _, v in a.top_logprobs] == pytest.approx(top.values.tolist())
    assert b.logprob == pytest.approx(float(lp[1, b.token_id])) and b.top_logprobs == []
    assert b.token_id in x[1].topk(5).indices.tolist()
    assert c.logprob is None and c.top_logprobs is None


def test_top_logprobs_break_ties_as_greedy_does():
    x = torch.zeros(1, V)
    x[0, [31, 7, 19]] = 5.0  # a three-way tie for the top
    (out,) = Sampler(seed=0).sample(x, [state(temperature=0.0, logprobs=True, top_logprobs=4)])
    assert out.token_id == 7  # argmax: the first maximum
    assert [t for t, _ in out.top_logprobs][:3] == [7, 19, 31]


def test_processed_logprobs_mode():
    x = logits(1, seed=5)
    s = state(temperature=0.5, top_k=2, logprobs=True, seed=0)
    out = Sampler(logprobs_mode="processed").sample(x, [s])[0]
    top2 = torch.log_softmax(x[0] / 0.5, -1).topk(2)
    norm = torch.logsumexp(top2.values, -1)
    i = top2.indices.tolist().index(out.token_id)
    assert out.logprob == pytest.approx(float(top2.values[i] - norm), abs=1e-5)


def test_sampling_distribution_follows_temperature():
    x = torch.tensor([[math.log(0.7), math.log(0.2), math.log(0.1)] + [-1e9] * (V - 3)])
    s = state(temperature=1.0, seed=7)
    sampler = Sampler()
    counts = torch.zeros(3)
    for _ in range(2000):  # one seeded request's 2000 output tokens
        t = sampler.sample(x, [s])[0].token_id
        s.append(t)
        counts[t] += 1
    assert torch.allclose(counts / 2000, torch.tensor([0.7, 0.2, 0.1]), atol=0.04)


@pytest.mark.parametrize(
    "bad",
    [
        {"temperature": -1.0},
        {"top_p": 0.0},
        {"min_p": 1.5},
        {"repetition_penalty": 0.0},
        {"top_logprobs": 21},
    ],
)
def test_invalid_params_raise(bad):
    with pytest.raises(ValueError, match="invalid sampling"):
        state(**bad)


def test_prompt_ids_out_of_vocab_raise():
    with pytest.raises(ValueError, match="out of range"):
        state(prompt=[V], repetition_penalty=1.1)


def test_seeded_draw_depends_on_seed_and_position_only():
    """A seeded row's token at output position t is a function of (seed, t) and its
    distribution: the same whichever step, batch order or draws came before (speculative
    verification and preemption draw in other patterns), and seeds a choice apart
    (choice i has seed + i) do not give one stream shifted by a token."""
    x = logits(6, seed=3)  # [6, V]: the distributions of positions 0..5

    def stream(seed: int, order: list[int]) -> dict[int, int]:
        s, out = state(temperature=1.0, seed=seed), {}
        for t in order:  # draw position t's token after t earlier ones (any tokens)
            s.generated = [0] * t
            out[t] = Sampler(seed=99).sample(x[t : t + 1], [s])[0].token_id
        return out

    forward = stream(5, list(range(6)))
    assert stream(5, [5, 3, 1, 0, 2, 4]) == forward
    # in a batch, at any row, beside unseeded rows: the same tokens
    s = state("s", temperature=1.0, seed=5)
    s.generated = [0] * 4
    others = [state(str(i), temperature=1.0) for i in range(3)]
    batch = torch.cat([logits(2, seed=8), x[4:5], logits(1, seed=9)])  # [4, V]
    out = Sampler().sample(batch, [others[0], others[1], s, others[2]])
    assert out[2].token_id == forward[4]
    shifted = stream(6, list(range(6)))
    assert [shifted[t] for t in range(5)] != [forward[t] for t in range(1, 6)]


def test_seeds_that_share_their_low_32_bits_draw_differently():
    """torch's CPU generator keeps only 32 bits of its seed: seeds equal modulo 2**32
    (2**64 - 1 and 2**63 - 1; choice 1 of 2**63 - 1, whose seed wraps to 2**63, and
    choice 0 of -2**63) once drew the same samples. Every user seed is mixed over all
    its 64 bits first (draw_seed), so they draw differently."""

    def draws(seed: int) -> list[float]:
        g = torch.Generator()
        g.manual_seed(draw_seed(seed, 0))
        return torch.rand(4, generator=g).tolist()

    seeds = [2**64 - 1, 2**63 - 1, 2**63, 1, 2**32 + 1]
    assert len({tuple(draws(s)) for s in seeds}) == len(seeds)
