"""The golden check on CUDA without the default model (skipped without a CUDA GPU): a
tiny Llama (hidden size 64, 2 layers, byte tokens) *trained* at test time
(``houchu.devtools.tiny_models.train_tiny_model``, on the quality texts past the evaluated
bytes: peaked next-token distributions, as a language model's) through houchu's exact
path on the GPU (``ModelRunner`` on cuda, float32, no quantization) gives transformers'
float32 greedy tokens (on the CPU) for several prompts, one at a time and batched
through the scheduler with chunked prefill and radix-cache hits, and log-probabilities
within ``ATOL`` of transformers' at every position.

``houchu.devtools.gpu_check``'s golden step runs this file where the default model's GGUF
(94 MiB) cannot travel to the GPU machine; with the GGUF there it runs
``tests/integration/test_golden.py``. TF32 stays off on this path: houchu never turns it
on, and the triton kernels reduce with ``tl.sum`` (no ``tl.dot``, whose float32 inputs
Triton rounds to TF32 by default); a TF32 matmul would move these logits by about 1e-3.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from houchu.devtools.tiny_models import train_tiny_model
from houchu.model.quant.quality import text_logprobs
from houchu.runner.model_runner import ModelRunner
from tests.support.families import (
    ATOL,
    assert_scheduled_waves_equal_hf,
    hf_greedy,
    hf_logits,
    runner_greedy_tokens,
    serve_waves,
)
from tests.support.quality_texts import EN, EVAL, TRAIN
from tests.support.runner_options import exact

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")

#: attention backends of the exact path on CUDA: torch SDPA, and houchu's Triton kernels
#: (what ``--attention-backend auto`` picks for float32, flash-attn being 16-bit only)
BACKENDS = [
    "torch",
    pytest.param(
        "triton",
        marks=pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="needs triton"),
    ),
]
#: (start, length) of the English prompts within the evaluated text (never trained on)
PROMPTS = [(0, 9), (57, 16), (130, 21), (301, 13)]


def english(start: int, n: int) -> list[int]:
    """``n`` byte ids of the evaluated English text from ``start``."""
    assert start + n <= EVAL
    return EN[start : start + n]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """(HF folder, transformers' float32 model on the CPU) of the trained tiny Llama."""
    from transformers import AutoModelForCausalLM

    t = train_tiny_model(tmp_path_factory.mktemp("golden") / "hf", "llama", TRAIN, seed=7)
    hf = AutoModelForCausalLM.from_pretrained(t.path, dtype=torch.float32).eval()
    return t.path, hf


def cuda_exact(path, backend: str) -> ModelRunner:
    """houchu's exact path on the GPU: float32, no quantization, no compiled step (CUDA
    graphs as served), pages of 4 tokens."""
    opts = exact(
        device="cuda", dtype="float32", attention_backend=backend, page_size=4, num_pages=64
    )
    runner = ModelRunner(str(path), opts, quiet=True)
    assert runner.dtype == torch.float32 and runner.model.embed.device.type == "cuda"
    return runner


def assert_no_tf32() -> None:
    """float32 matmuls stay IEEE float32 (torch's default, which houchu keeps)."""
    assert torch.backends.cuda.matmul.allow_tf32 is False
    assert torch.get_float32_matmul_precision() == "highest"


@pytest.mark.parametrize("backend", BACKENDS)
def test_single_prompts_equal_transformers(trained, backend):
    """Each prompt alone (a prefill, then decode steps): 10 greedy tokens equal
    transformers'."""
    path, hf = trained
    runner = cuda_exact(path, backend)
    assert_no_tf32()
    for i, (start, n) in enumerate(PROMPTS):  # 8 pages of 4 tokens each: n + 10 <= 32
        ids = english(start, n)
        got = runner_greedy_tokens(runner, ids, 10, rid=f"p{i}", first_page=8 * i)
        assert got == hf_greedy(hf, ids, 10), (start, n)
    assert_no_tf32()


@pytest.mark.parametrize("backend", BACKENDS)
def test_batched_chunked_and_cached_equal_transformers(trained, backend):
    """Through the scheduler: the English prompts batched (chunked prefill of 8 tokens a
    chunk), then ``assert_scheduled_waves_equal_hf``'s waves (a batch of three, then two
    radix-cache hits on whole pages): every request's greedy tokens equal
    transformers'."""
    path, hf = trained
    prompts = {f"en{s}": english(s, n) for s, n in PROMPTS}
    out, _, _ = serve_waves(cuda_exact(path, backend), [prompts], 12)
    for rid, ids in prompts.items():
        assert out[rid] == hf_greedy(hf, ids, 12), rid
    assert_scheduled_waves_equal_hf(cuda_exact(path, backend), hf)
    assert_no_tf32()


def test_logprobs_within_atol_of_transformers(trained):
    """The first 200 evaluated bytes fed in chunks of 32 through the GPU model:
    log-probabilities at every position within ``ATOL`` of transformers' (a TF32 or
    16-bit matmul would move them by about 1e-3), and the model learnt something (its
    top-1 guess right well above chance)."""
    path, hf = trained
    runner = cuda_exact(path, "torch")
    ids = english(0, 200)
    with torch.inference_mode():
        got = text_logprobs(runner.model, ids, chunk=32, page_size=16).cpu()
    want = hf_logits(hf, ids).log_softmax(-1)  # [200, V]
    torch.testing.assert_close(got, want, atol=ATOL, rtol=0)
    right = (want[:-1].argmax(-1) == torch.tensor(ids[1:])).float().mean().item()
    assert right > 0.2, f"the trained model guesses {right:.2f} of the next bytes"
