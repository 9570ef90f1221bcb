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


def test_auto_dtype_is_bf16_and_the_line_names_the_gpu_and_graphs(tiny_dir):
    r = ModelRunner(tiny_dir, exact(device="cuda", num_pages=64, decode_batch_sizes=(1, 2)))
    if torch.cuda.is_bf16_supported(including_emulation=False):
        assert r.dtype == torch.bfloat16 and "--dtype auto: bfloat16 on CUDA" in r.choices
    facts = r.device_facts
    assert facts is not None and facts.name == torch.cuda.get_device_name(0)
    assert 0 < facts.free_bytes <= facts.total_bytes == torch.cuda.mem_get_info(0)[1]
    line = r.summary()
    assert f"on cuda ({facts.name}, " in line and "GiB free after the weights" in line
    assert f"attention {r.backend.name}, CUDA graphs for batch 1,2," in line


def test_mem_fraction_static_sizes_the_pool_from_free_memory(tiny_dir):
    r = runner(tiny_dir, num_pages=None, mem_fraction_static=0.3, disable_cuda_graph=True)
    assert r.pool_size.source.startswith("--mem-fraction-static 0.3 (")
    f = r.device_facts
    budget = 0.3 * f.total_bytes - (f.total_bytes - f.free_bytes)
    page = r.pool.page_size * r.pool.bytes_per_token
    assert 0 < r.pool.num_pages * page <= budget  # the reserve came off too
    assert r.pool.num_pages * page > budget - 4 * 2**30  # and not much else
    assert generate(r)  # it serves


@pytest.mark.skipif(importlib.util.find_spec("flash_attn") is None, reason="needs flash-attn")
def test_auto_picks_flash_attn_with_256_token_pages(tiny_dir):
    r = runner(tiny_dir, page_size=None, attention_backend="auto", decode_batch_sizes=(1, 4))
    assert r.backend.name == "flash-attn" and r.pool.page_size == 256
    assert any("--page-size 256" in c for c in r.choices) and "--page-size 256" in r.summary()
    ref = runner(tiny_dir, page_size=256, attention_backend="torch", disable_cuda_graph=True)
    assert generate(r) == generate(ref)
    fallback = runner(tiny_dir, page_size=16, attention_backend="auto")
    assert fallback.backend.name in ("triton", "torch-sdpa")
    assert any("not a multiple of 256" in c for c in fallback.choices)


def test_host_tier_copies_are_pinned_and_ordered_on_their_own_stream():
    import os

    from houchu.kvcache.host_pool import HostPool
    from houchu.model.kv_pool import KVPool
    from houchu.model.kv_transfer import HostKVMirror
    from houchu.transport.messages import PageCopy

    geometry = {"num_layers": 4, "page_size": 16, "num_kv_heads": 2, "head_dim": 64}
    pool = KVPool(num_pages=8, dtype=torch.bfloat16, device="cuda", **geometry)
    page_bytes = 2 * 4 * 16 * 2 * 64 * 2
    host = HostPool(f"houchu-cuda-test-{os.getpid()}", 4, page_bytes, create=True)
    mirror = HostKVMirror(pool, host)
    try:
        assert mirror.pinned, mirror.unpinned_reason
        assert mirror.stream != torch.cuda.current_stream()
        for _ in range(3):  # ordering: the copies wait for these writes, the reads for them
            pool.k.normal_()
            pool.v.normal_()
            k1, v1 = pool.k[:, 1].clone(), pool.v[:, 1].clone()
            mirror.save([PageCopy(1, 2)])
            pool.k[:, 1].zero_()  # after the store, on the compute stream
            mirror.load([PageCopy(5, 2)])
            assert torch.equal(pool.k[:, 5], k1) and torch.equal(pool.v[:, 5], v1)
            mirror.finish()
            slot = mirror._views(2)[0]  # the host bytes, complete once finish returns
            assert torch.equal(slot, k1.cpu())
        assert "pinned in place" in mirror.describe()
    finally:
        mirror.close()
        del mirror
        host.close()
