"""logit_bias, allowed_token_ids, bad_words and min_tokens in the sampler."""

from __future__ import annotations

import pytest
import torch

from houchu.model.sampling.logits_processors import LogitsProcessors, apply_processors
from houchu.model.sampling.sampler import RequestState, Sampler
from houchu.transport.messages import SamplingParams

V = 50


def _state(rid="a", stop_ids=(), **kw) -> RequestState:
    return RequestState(rid, SamplingParams(**kw), [1, 2, 3], V, stop_ids=stop_ids)


def _logits(rows: int = 1, seed: int = 0) -> torch.Tensor:
    return torch.randn(rows, V, generator=torch.Generator().manual_seed(seed))  # [R, V]


def _greedy(logits, states) -> list[int]:
    return [s.token_id for s in Sampler(seed=0).sample(logits, states)]


def test_bias_minus_100_bans_the_greedy_token_and_plus_100_forces_one():
    x = _logits()
    top = int(x[0].argmax())
    assert _greedy(x, [_state(temperature=0.0)]) == [top]
    banned = _greedy(x, [_state(temperature=0.0, logit_bias={top: -100.0})])
    assert banned != [top] and banned == [int(x[0].topk(2).indices[1])]
    low = int(x[0].argmin())
    assert _greedy(x, [_state(temperature=0.0, logit_bias={low: 100.0})]) == [low]
    # forced among several: they compete by their logits, sampled or greedy
    two = {low: 100.0, top: 100.0}
    for seed in range(5):
        (s,) = Sampler(seed=seed).sample(x, [_state(temperature=1.0, seed=seed, logit_bias=two)])
        assert s.token_id in (low, top)


def test_moderate_bias_is_added_to_the_logit():
    x = _logits()
    sec = int(x[0].topk(2).indices[1])
    gap = float(x[0].max() - x[0, sec])
    assert _greedy(x, [_state(temperature=0.0, logit_bias={sec: gap + 0.5})]) == [sec]
    assert _greedy(x, [_state(temperature=0.0, logit_bias={sec: gap - 0.5})]) != [sec]


def test_allowed_token_ids_only_those_are_sampled():
    allowed = [3, 17, 41]
    st = _state(temperature=1.5, seed=1, allowed_token_ids=allowed)
    sampler = Sampler(seed=0)
    for step in range(30):
        (s,) = sampler.sample(_logits(seed=step), [st])
        assert s.token_id in allowed
        st.append(s.token_id)


def test_bad_words_single_and_multi_token():
    x = torch.zeros(1, V)
    x[0, 7], x[0, 9] = 5.0, 4.0  # 7 is the greedy token, then 9
    assert _greedy(x, [_state(temperature=0.0, bad_words_ids=[[7]])]) == [9]
    st = _state(temperature=0.0, bad_words_ids=[[4, 5, 7]])
    assert _greedy(x, [st]) == [7]  # the word's start has not been generated
    st.append(4)
    st.append(5)
    assert _greedy(x, [st]) == [9]  # "4 5" generated: 7 would complete the word


def test_min_tokens_bans_stop_ids_until_enough_tokens():
    x = torch.zeros(1, V)
    x[0, 2] = 9.0  # the stop id is the greedy token
    st = _state(temperature=0.0, min_tokens=3, stop_ids=[2])
    got = []
    for _ in range(4):
        (tok,) = _greedy(x, [st])
        got.append(tok)
        st.append(tok)
    assert got[:3] != [2, 2, 2] and 2 not in got[:3] and got[3] == 2


def test_rows_are_independent_in_a_batch():
    x = _logits(3, seed=4)
    states = [
        _state("a", temperature=0.0),
        _state("b", temperature=0.0, logit_bias={0: 100.0}),
        _state("c", temperature=0.0, allowed_token_ids=[5]),
    ]
    assert _greedy(x, states) == [int(x[0].argmax()), 0, 5]


def test_a_bad_word_ban_that_would_leave_nothing_gives_way_not_the_allowed_set():
    """After "3", the bad words "3 3" and "3 5" would ban both allowed tokens: the
    allowed set stays (the row samples 3 or 5), the words' bans give way there."""
    st = _state(temperature=1.0, seed=0, allowed_token_ids=[3, 5], bad_words_ids=[[3, 3], [3, 5]])
    st.append(3)
    x = _logits()
    out = apply_processors(x, [st.processors], [st.generated])
    assert torch.isfinite(out[0]).nonzero().flatten().tolist() == [3, 5]
    torch.testing.assert_close(out[0, [3, 5]], x[0, [3, 5]])
    for seed in range(5):
        (s,) = Sampler(seed=seed).sample(_logits(seed=seed), [st])
        assert s.token_id in (3, 5)


def test_min_tokens_gives_way_before_a_bad_word():
    """Allowed 2 (a stop id) and 9; "9 9" is a bad word and min_tokens 5 holds 2 off:
    after "9" only 2 is left, so the request may stop early, and never writes "9 9"."""
    st = _state(
        temperature=0.0,
        allowed_token_ids=[2, 9],
        bad_words_ids=[[9, 9]],
        min_tokens=5,
        stop_ids=[2],
    )
    x = torch.zeros(1, V)
    x[0, 9] = 3.0  # 9 is the greedy token
    assert _greedy(x, [st]) == [9]
    st.append(9)
    assert _greedy(x, [st]) == [2]


def test_a_dead_row_does_not_change_its_neighbours():
    """Rows whose dynamic bans give way and rows whose bans hold, in one batch."""
    gives = _state("a", temperature=0.0, allowed_token_ids=[4], bad_words_ids=[[4, 4]])
    holds = _state("b", temperature=0.0, bad_words_ids=[[4, 4]])
    for st in (gives, holds):
        st.append(4)
    x = torch.zeros(2, V)
    x[:, 4] = 5.0
    assert _greedy(x, [gives, holds]) == [4, 0]


def test_no_processors_is_the_input_itself():
    x = _logits()
    assert LogitsProcessors.of(SamplingParams(), [2], V) is None  # min_tokens 0: no work
    assert apply_processors(x, [None], [[]]) is x


@pytest.mark.parametrize(
    "kw",
    [
        {"logit_bias": {V: 1.0}},
        {"logit_bias": {1: 101.0}},
        {"allowed_token_ids": []},
        {"allowed_token_ids": [V]},
        {"bad_words_ids": [[]]},
        {"min_tokens": -1},
    ],
)
def test_bad_parameters_raise(kw):
    with pytest.raises(ValueError):
        _state(**kw)
