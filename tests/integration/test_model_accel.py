"""The compiled decode step (torch.compile on the CPU: inductor starts the C++ compiler
and its compile workers) against the eager path, and its cached "not faster" verdict
(tiny random model)."""

from __future__ import annotations

import pytest

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.runner.model_runner import ModelRunner
from tests.support.greedy import generate
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("accel"), seed=11)


def test_compiled_decode_gives_identical_greedy_tokens(tiny_dir):
    eager = ModelRunner(tiny_dir, exact(page_size=4, num_pages=24), quiet=True)
    comp = ModelRunner(
        tiny_dir,
        exact(page_size=4, num_pages=24, compile="on", decode_batch_sizes=(4,)),
        quiet=True,
    )
    assert comp.accel.kind == "compiled_decode" and comp.accel.setup_s > 0
    assert generate(comp) == generate(eager)
    (s,) = [s for s in comp.lever_samples() if s.lever == "compiled_decode"]
    assert s.spent == pytest.approx(comp.accel.setup_s) and s.spent_unit == "seconds"


def test_a_known_slower_compile_is_not_measured_again(tiny_dir, monkeypatch, tmp_path):
    """compile "auto": a verdict "not faster" is cached, and the next start skips the
    compilation and says so."""
    import houchu.runner.accel as accel

    monkeypatch.setenv("HOUCHU_DECISION_CACHE", str(tmp_path / "decisions.json"))
    monkeypatch.setattr(accel, "KEEP_BELOW", 0.0)  # compiled is never faster enough
    options = exact(page_size=4, num_pages=24, compile="auto", decode_batch_sizes=(1, 2))
    first = ModelRunner(tiny_dir, options, quiet=True)
    assert first.accel.dropped and not first.accel.cached and first.accel.setup_s > 0
    second = ModelRunner(tiny_dir, options, quiet=True)
    assert second.accel.dropped and second.accel.cached and second.accel.setup_s == 0
    assert "cached measurement" in second.levers.summary()
    assert second.accel.eager_step_s == first.accel.eager_step_s
