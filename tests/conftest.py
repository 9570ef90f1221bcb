"""Shared fixtures: the real default model (fetched once into the cache)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from houchu.cpu import isa
from houchu.cpu import kernels as cpu_kernels
from houchu.model.fetch import fetch_default_model
from tests.support.kernel_levels import KERNEL_LEVELS


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    """Path of the default model's GGUF (SmolLM2-135M-Instruct Q4_1), fetched if needed."""
    return fetch_default_model(quiet=True)


@pytest.fixture(scope="session", autouse=True)
def _decision_cache(tmp_path_factory: pytest.TempPathFactory):
    """The startup measurements (decode paths, compile verdicts) of this test session
    are kept in a file of its own (servers the tests start inherit it), not the user's."""
    path = tmp_path_factory.mktemp("decisions") / "decisions.json"
    before = os.environ.get("HOUCHU_DECISION_CACHE")
    os.environ["HOUCHU_DECISION_CACHE"] = str(path)
    yield path
    if before is None:
        os.environ.pop("HOUCHU_DECISION_CACHE", None)
    else:
        os.environ["HOUCHU_DECISION_CACHE"] = before


@pytest.fixture(params=KERNEL_LEVELS)
def cpu_isa(request: pytest.FixtureRequest):
    """Each ISA level of houchu's C++ CPU kernels in turn, made the active one for the
    test (``cpu_kernels.select``); a level this CPU cannot run, or whose build fails, is
    skipped with the reason. So an AVX-512 machine tests its AVX2 kernels too."""
    level = request.param
    lv = isa.level(level)
    if not isa.runs(lv):
        pytest.skip(isa.why_not(lv))
    why = cpu_kernels.unavailable_reason(level)
    if why is not None:
        pytest.skip(f"{level}: {why}")
    before = cpu_kernels.active_level()
    cpu_kernels.select(level)
    try:
        yield level
    finally:
        cpu_kernels.select(before)
