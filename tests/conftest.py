"""Shared fixtures: the real default model (fetched once into the cache)."""

from __future__ import annotations

from pathlib import Path

import pytest

from houchu.fetch import fetch_default_model


@pytest.fixture(scope="session")
def real_model_path() -> Path:
    """Path of the default model's GGUF (SmolLM2-135M-Instruct Q4_1), fetched if needed."""
    return fetch_default_model(quiet=True)
