"""The exact path (float32, ``--quantization none``) gives the same greedy tokens at every
ISA level this CPU runs, the torch fallback (``generic``: no C++ kernels) included, on the
real model; and a level the CPU cannot run is refused with one clear error."""

from __future__ import annotations

import pytest

from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels
from houchu.runner.model_runner import ModelRunner
from tests.support.greedy import generate
from tests.support.runner_options import exact

pytestmark = pytest.mark.slow


def test_exact_path_is_identical_at_every_level(real_model_path):
    before = cpu_kernels.active_level()
    tokens, kernels = {}, {}
    try:
        for level in cpu_isa.usable():
            r = ModelRunner(
                real_model_path, exact(quantization="none", num_pages=24, cpu_isa=level), quiet=True
            )
            kernels[level] = r.backend.name
            tokens[level] = generate(r, n=17)
    finally:
        cpu_kernels.select(before)
    assert kernels["generic"] == "torch-sdpa"  # the fallback really runs torch's kernels
    assert all(k == "cpu" for lv, k in kernels.items() if lv != "generic"), kernels
    first = next(iter(tokens.values()))
    assert all(len(t) == 17 for t in first.values())
    for level, t in tokens.items():
        assert t == first, (level, t, first)


def test_a_level_the_cpu_lacks_is_refused(real_model_path, monkeypatch):
    monkeypatch.setattr(cpu_isa, "cpu_features", lambda cpuinfo=None: frozenset({"sse2"}))
    with pytest.raises(ValueError, match="lacks .*avx2"):
        ModelRunner(
            real_model_path, exact(quantization="none", num_pages=16, cpu_isa="avx2"), quiet=True
        )
    assert cpu_isa.usable() == ["generic"]
