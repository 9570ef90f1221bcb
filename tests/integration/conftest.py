"""Integration fixtures: a real ``houchu serve`` in its own processes, on a free port; the
golden reference; a tiny model on the real tokenizer for structured output."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.runner.model_runner import ModelRunner
from houchu.text.tokenizer.core import TextTokenizer, load_tokenizer
from tests.support.golden import golden_reference
from tests.support.grammar_runner import VOCAB
from tests.support.runner_options import exact
from tests.support.server import Server, start_server, stop_server


@pytest.fixture(scope="session", autouse=True)
def _session_db(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """One SQLite database for the servers of this test session that name none."""
    url = f"sqlite:///{tmp_path_factory.mktemp('db') / 'houchu.db'}"
    os.environ["HOUCHU_TEST_DB_URL"] = url
    yield url
    os.environ.pop("HOUCHU_TEST_DB_URL", None)


@pytest.fixture(scope="session")
def hf_model(real_model_path: Path) -> tuple:
    """(tokenizer, model): transformers' fast tokenizer and float32 model of the default
    GGUF (dequantized by transformers), loaded once for the session and kept between
    sessions (``tests.support.hf_reference``: about 25 s of CPU a load from the GGUF, a second
    from the kept files): the golden tests' reference. Tests only read them."""
    from tests.support.hf_reference import hf_reference

    return hf_reference(real_model_path)


@pytest.fixture(scope="session")
def server(real_model_path: Path) -> Iterator[Server]:
    """One shared server on the default model for the integration tests."""
    srv = start_server(real_model_path, "--kv-cache-mb", "256")
    yield srv
    stop_server(srv)


@pytest.fixture(scope="module")
def reference(real_model_path: Path, hf_model: tuple) -> dict[str, list[int]]:
    """HF transformers greedy continuation (32 tokens, EOS not special) per golden prompt,
    computed once per test process: ``test_golden.py`` and the tensor-parallel golden
    test (``test_tensor_parallel.py``) compare against the same tokens."""
    return golden_reference(real_model_path, hf_model)


# ------------------------------------------------- structured output on the real tokenizer
# (test_model_grammar*.py, test_jump_forward*.py)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, real_model_path: Path) -> Path:
    """A tiny random Llama with the default model's vocabulary and tokenizer."""
    path = make_tiny_llama(tmp_path_factory.mktemp("grammar"), seed=5, vocab_size=VOCAB)
    load_tokenizer(real_model_path).hf_tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def tok(model_dir: Path) -> TextTokenizer:
    return load_tokenizer(model_dir)


@pytest.fixture
def runner(model_dir: Path) -> ModelRunner:
    return ModelRunner(str(model_dir), exact(page_size=16, num_pages=512), quiet=True)
