"""Any sampling parameters the gateway accepts sample a token; none fails the batch.

Found by fuzzing the HTTP API: a tiny ``top_p`` (0 in float32) dropped every token and a
tiny ``repetition_penalty`` overflowed the logits, and ``torch.multinomial`` then failed
the whole step with a 500 for every request in it.
"""

from __future__ import annotations

import sys

import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from houchu.model.sampling.sampler import RequestState, Sampler
from houchu.transport.messages import SamplingParams

V = 64


def unit_open(lo_open: bool = False) -> st.SearchStrategy[float]:
    """Floats in [0, 1] ((0, 1] when ``lo_open``), extremes and subnormals included."""
    edge = st.sampled_from([1e-300, 1e-45, 1e-38, 1e-7, 0.5, 1.0])
    if lo_open:
        return edge | st.floats(0.0, 1.0, exclude_min=True)
    return edge | st.just(0.0) | st.floats(0.0, 1.0)


params = st.builds(
    SamplingParams,
    temperature=st.sampled_from([0.0, 1e-300, 1e-5, 2e-5, 1.0, 2.0]) | st.floats(0.0, 2.0),
    top_p=unit_open(lo_open=True),
    top_k=st.integers(0, V + 5),
    min_p=unit_open(),
    repetition_penalty=unit_open(lo_open=True)
    | st.floats(1.0, 2.0)
    | st.sampled_from([3.0, 1e10, 1e20, 1e38, 1e300, sys.float_info.max])
    | st.floats(1.0, sys.float_info.max),
    frequency_penalty=st.floats(-2.0, 2.0),
    presence_penalty=st.floats(-2.0, 2.0),
    seed=st.none() | st.integers(0, 2**63 - 1),
    logprobs=st.booleans(),
    top_logprobs=st.integers(0, 20),
)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    rows=st.lists(params, min_size=1, max_size=4),
    scale=st.sampled_from([1.0, 30.0, 1e4]),
    seed=st.integers(0, 1000),
)
def test_every_accepted_parameter_set_samples(rows, scale, seed) -> None:
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(rows), V, generator=gen) * scale
    states = [RequestState(f"r{i}", p, [1, 2, 3, 1], V) for i, p in enumerate(rows)]
    for s in states:
        s.generated = [2, 2]
    out = Sampler(seed=0).sample(logits, states)
    assert len(out) == len(rows)
    assert all(0 <= o.token_id < V for o in out)
