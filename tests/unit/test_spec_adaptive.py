"""The speculation cost model: expected tokens, measured costs, k and the break-even."""

from __future__ import annotations

import pytest

from houchu.speculative.adaptive import Acceptance, CostCurve, SpecController, expected_tokens


def test_expected_tokens():
    assert expected_tokens(4, 0.0) == 1.0
    assert expected_tokens(4, 1.0) == 5.0
    assert expected_tokens(2, 0.5) == pytest.approx(1.75)


def test_cost_curve_interpolates_and_extrapolates():
    c = CostCurve()
    assert c.estimate(4) is None
    c.observe(1, 0.010)
    assert c.estimate(0.5) == 0.010 and c.estimate(4) == pytest.approx(0.040)
    c.observe(8, 0.010)
    c.observe(64, 0.080)
    assert c.estimate(4) == pytest.approx(0.010)
    assert c.estimate(36) == pytest.approx(0.045)
    assert c.estimate(128) == pytest.approx(0.160)  # along the last segment


def test_acceptance_counts_tried_positions():
    a = Acceptance()
    assert a.rate(prior=0.3) == 0.3
    a.update(4, 4)  # all accepted: 4 tried
    a.update(4, 1)  # one accepted, the second rejected: 2 tried
    assert (a.accepted, a.tried) == (5, 6)
    assert a.rate(prior=0.0, prior_weight=4) == pytest.approx(0.5)


def bandwidth_then_compute(ctrl: SpecController, knee: int = 32) -> None:
    """A step costs 10 ms up to ``knee`` tokens, then grows linearly (compute-bound)."""
    for t in (1, 2, 4, 8, 16, 32, 64, 128, 256):
        ctrl.observe_target(t, 0.010 * max(1.0, t / knee))


def test_k_is_large_while_bandwidth_bound_and_zero_when_compute_bound():
    ctrl = SpecController(max_k=4, max_batch=None, max_running=64)
    assert ctrl.choose_k(1, 0.8, cap=4) == 4  # nothing measured yet: optimistic
    bandwidth_then_compute(ctrl)
    ctrl.acceptance.update(4, 3)  # alpha estimate 0.75
    assert ctrl.choose_k(1, 0.8, cap=4) == 4
    assert ctrl.choose_k(1, 0.8, cap=2) == 2
    assert ctrl.choose_k(16, 0.8, cap=4) == 1  # 32 tokens still free, 48 are not
    assert ctrl.choose_k(48, 0.8, cap=4) == 0
    assert ctrl.choose_k(1, 0.0, cap=4) == 0  # nothing is ever accepted
    be = ctrl.update_break_even()
    assert 16 <= be < 48 and ctrl.cutoff == be
    assert ctrl.choose_k(be + 1, 1.0, cap=4) == 0  # off above the break-even
    assert ctrl.choose_k(be + 1, 1.0, cap=4, probe=True) >= 1


def test_draft_cost_counts_and_the_override_forces_speculation():
    ctrl = SpecController(max_k=4, max_batch=None, max_running=64)
    bandwidth_then_compute(ctrl)
    ctrl.observe_draft(batch=1, max_k=4, seconds=0.080)  # 20 ms per draft pass: never pays
    assert ctrl.choose_k(1, 0.9, cap=4) == 0
    forced = SpecController(max_k=4, max_batch=2, max_running=64)
    bandwidth_then_compute(forced)
    forced.observe_draft(batch=1, max_k=4, seconds=0.080)
    assert forced.cutoff == 2 and forced.choose_k(1, 0.9, cap=4) >= 1
    assert forced.choose_k(3, 0.9, cap=4) == 0
