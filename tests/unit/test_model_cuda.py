"""CUDA-only checks (skipped without a CUDA device): CUDA-graph replay against eager,
flash-attn against the torch backend, and the int4 tinygemm / FP8 W8A8 kernels."""

from __future__ import annotations

import importlib.util

import pytest
import torch

from houchu.model.model_runner import ModelRunner
from houchu.model.testing import make_tiny_llama
from tests.runner_options import exact
from tests.unit.test_model_quant import generate

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # head_dim 64 and 8 KV heads' worth of rows keep the CUDA int4 kernel's shape rules
    return make_tiny_llama(
        tmp_path_factory.mktemp("cuda"),
        seed=7,
        hidden_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=512,
    )


def runner(path, **kw) -> ModelRunner:
    base = {"page_size": 16, "num_pages": 64, "device": "cuda", "dtype": "bfloat16"}
    return ModelRunner(path, exact(**{**base, **kw}), quiet=True)


@pytest.mark.parametrize("backend", ["torch", "triton"])
def test_cuda_graph_replay_matches_eager(tiny_dir, backend):
    graphs = runner(tiny_dir, attention_backend=backend, decode_batch_sizes=(1, 4))
    assert graphs.accel.kind == "cuda_graph"
    eager = runner(tiny_dir, attention_backend=backend, disable_cuda_graph=True)
    assert generate(graphs) == generate(eager)


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn")
def test_flash_attn_matches_torch_backend(tiny_dir):
    fa = runner(tiny_dir, attention_backend="flash-attn", page_size=256, disable_cuda_graph=True)
    ref = runner(tiny_dir, attention_backend="torch", page_size=256, disable_cuda_graph=True)
    assert generate(fa) == generate(ref)
    fa_g = runner(tiny_dir, attention_backend="flash-attn", page_size=256, decode_batch_sizes=(4,))
    assert generate(fa_g) == generate(ref)


@pytest.mark.parametrize("quant", ["int4", "int8", "w8a8"])
def test_quantized_kernels_run_on_cuda(tiny_dir, quant):
    r = runner(tiny_dir, quantization=quant, disable_cuda_graph=True)
    ref = runner(tiny_dir, disable_cuda_graph=True)
    got, want = generate(r), generate(ref)
    agree = sum(a == b for k in want for a, b in zip(want[k], got[k], strict=True))
    assert agree >= 0.5 * sum(map(len, want.values()))
