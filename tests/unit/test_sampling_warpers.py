"""The fast sampling warpers against their definitions: top-p over candidates equals the
full sort's nucleus (ties, long tails, tiny and large p), and the draw by inversion
follows the distribution, never draws a token of probability 0 and is reproducible."""

from __future__ import annotations

import pytest
import torch

from houchu.model.sampling import warpers as sw
from houchu.model.sampling.warpers import _top_p_drop_sorted, apply_top_p, draw_rows

V = 49152


def _rows() -> torch.Tensor:
    """Rows of every shape that matters: peaked, flat (the nucleus reaches past the
    candidates), ties on and around the boundary, -inf tokens."""
    g = torch.Generator().manual_seed(0)
    peaked = torch.randn(4, V, generator=g) * 4
    flat = torch.randn(2, V, generator=g) * 0.1
    ties = torch.zeros(2, V)
    ties[0, :3000] = 5.0  # 3,000 equal most likely tokens: a tie across the candidates
    ties[1, torch.randperm(V, generator=g)[:50]] = 8.0  # 50 tied leaders, scattered ids
    masked = torch.randn(2, V, generator=g) * 3
    masked[:, ::2] = float("-inf")
    return torch.cat([peaked, flat, ties, masked])


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.99, 0.999999, 1.0])
def test_top_p_equals_the_full_sort(p):
    x = _rows()
    want = x.masked_fill(_top_p_drop_sorted(x, torch.full((x.shape[0],), p)), float("-inf"))
    got = apply_top_p(x, torch.full((x.shape[0],), p))
    assert torch.equal(got, want)


def test_top_p_rows_with_their_own_p_and_the_fallback_taken(monkeypatch):
    """Mixed p per row; with 8 and 64 candidates most rows need the full sort, with the
    default only the flat ones: the same answer either way."""
    x = _rows()
    p = torch.tensor([0.3, 0.95, 1.0, 0.7, 0.9, 0.5, 0.8, 0.99, 0.6, 0.9])
    want = x.masked_fill(_top_p_drop_sorted(x, p), float("-inf"))
    assert torch.equal(apply_top_p(x, p), want)
    monkeypatch.setattr(sw, "TOP_P_CANDIDATES", (8, 64))
    assert torch.equal(apply_top_p(x, p), want)


def test_draw_follows_the_distribution_and_skips_zero_probability():
    probs = torch.zeros(1, 1000)
    probs[0, [3, 500, 999]] = torch.tensor([0.2, 0.5, 0.3])
    shared = torch.Generator().manual_seed(1)
    n = 20000
    drawn = torch.cat([draw_rows(probs, [None], shared) for _ in range(n)])
    counts = torch.bincount(drawn, minlength=1000)
    assert int(counts.sum()) == n and set(drawn.unique().tolist()) == {3, 500, 999}
    for t, q in ((3, 0.2), (500, 0.5), (999, 0.3)):  # 5 standard deviations at most
        assert abs(counts[t] / n - q) < 5 * (q * (1 - q) / n) ** 0.5


def test_draw_is_reproducible_per_row_generator_and_unnormalised_rows_work():
    probs = torch.rand(3, V) * torch.tensor([[1.0], [5.0], [0.01]])  # sums far from 1
    probs[1, :100] = 0.0

    def gens():
        return [torch.Generator().manual_seed(s) for s in (7, 8, 9)]

    shared = torch.Generator().manual_seed(0)
    a, b = draw_rows(probs, gens(), shared), draw_rows(probs, gens(), shared)
    assert torch.equal(a, b) and int(a[1]) >= 100
    # a row's draw depends on its own generator only, not on the rows beside it
    alone = draw_rows(probs[2:], gens()[2:], shared)
    assert int(alone[0]) == int(a[2])
