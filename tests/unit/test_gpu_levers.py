"""The GPU levers' decisions, tested on the CPU: the KV pool from free GPU memory
(``--mem-fraction-static``), what "auto" means for the dtype, page size and attention
backend on CUDA, the start-up line's GPU facts and CUDA graphs, and the 16-bit compute
lever in the ledger. The CUDA runs of the same paths are in ``test_model_cuda.py``."""

from __future__ import annotations

import pytest
import torch

from houchu.dashboard.lever_catalog import lever_words
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.gpu.memory import (
    RESERVE_FIXED_BYTES,
    DeviceFacts,
    GiB,
    MemFractionError,
    activation_reserve_bytes,
    fraction_pool_bytes,
    fraction_pool_pages,
    kv_pool_size,
)
from houchu.model.config.core import ModelConfig
from houchu.model.kv.page_pool import kv_page_bytes
from houchu.model.kv.pool import KVPool
from houchu.options.runner_options import RunnerOptions
from houchu.runner.choices import (
    choose_attention,
    choose_dtype,
    resolve_attention,
    resolve_dtype,
)
from houchu.runner.lever_counters import LeverCounters, StepCost
from houchu.runner.model_runner import ModelRunner
from houchu.runner.report import cuda_graph_clause, device_clause
from tests.support.runner_options import exact

CFG = ModelConfig(
    name="t",
    vocab_size=1000,
    hidden_size=64,
    intermediate_size=128,
    num_layers=2,
    num_heads=4,
    num_kv_heads=2,
    head_dim=16,
)
H200 = DeviceFacts("NVIDIA H200", 0, int(139.8 * GiB), int(120.25 * GiB))


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("gpu_levers"), seed=5)


# ---- --mem-fraction-static: the arithmetic


def test_fraction_pool_bytes_is_the_fraction_less_what_is_in_use_and_the_reserve():
    total, free = 80 * GiB, 70 * GiB  # 10 GiB in use: weights, context, other processes
    assert fraction_pool_bytes(0.9, total, free, GiB) == int(0.9 * 80 * GiB) - 10 * GiB - GiB
    assert fraction_pool_bytes(1.0, total, free, 0) == free  # all of it: what is free


def test_fraction_pool_pages_from_total_free_and_weights():
    """A 80 GiB GPU, 2 GiB of weights loaded by this process and 1 GiB held by another:
    at 0.5 the pool gets 40 - 3 - 1 (reserve) = 36 GiB, in 1 MiB pages, less the scratch
    page the CUDA graphs write to."""
    total, weights, other = 80 * GiB, 2 * GiB, GiB
    free = total - weights - other
    pages = fraction_pool_pages(0.5, total, free, GiB, 2**20, scratch_pages=1)
    assert pages == 36 * 1024 - 1
    assert fraction_pool_pages(0.5, total, free, GiB, 3 * 2**20) == 36 * 1024 // 3


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.01, 2.0, float("nan")])
def test_a_fraction_outside_zero_to_one_is_refused(bad):
    with pytest.raises(MemFractionError, match=r"must be in \(0, 1\]"):
        fraction_pool_pages(bad, 80 * GiB, 70 * GiB, 0, 2**20)


def test_too_little_memory_for_one_page_says_the_numbers():
    # 0.1 x 80 GiB = 8 GiB, but 10 GiB are already in use: nothing is left
    with pytest.raises(MemFractionError) as e:
        fraction_pool_pages(0.1, 80 * GiB, 70 * GiB, GiB, 2**20)
    msg = str(e.value)
    assert "less than one KV page" in msg and "10.00 GiB in use" in msg
    assert "raise --mem-fraction-static" in msg and "\n" not in msg
    # room for less than one page: refused too
    with pytest.raises(MemFractionError, match="less than one KV page"):
        fraction_pool_pages(1.0, 10_000, 9_000, 0, 10_000)


def test_the_reserve_grows_with_the_model_and_holds_the_fixed_part():
    base = activation_reserve_bytes(CFG, 2, tokens=0, logit_rows=0)
    assert base == RESERVE_FIXED_BYTES
    one = activation_reserve_bytes(CFG, 2, tokens=1, logit_rows=0) - base
    qkv = (4 + 2 * 2) * 16
    assert one == (4 * 64 + qkv + 3 * 128) * 2  # residual, normed, q/k/v, attn, MLP
    logits = activation_reserve_bytes(CFG, 2, tokens=0, logit_rows=3) - base
    assert logits == 2 * 3 * 1000 * 4  # float32 logits and the sampler's copy


@pytest.mark.parametrize(("dtype", "kv"), [(torch.float32, "auto"), (torch.bfloat16, "int8")])
def test_page_bytes_are_the_pools(dtype, kv):
    pool = KVPool.for_model(CFG, page_size=16, dtype=dtype, num_pages=3, kv_dtype=kv)
    assert kv_page_bytes(CFG, 16, dtype, kv) == 16 * pool.bytes_per_token


# ---- which option sizes the pool


def size(**kw):
    base = {"num_pages": None, "kv_cache_mb": 64.0, "mem_fraction": None, "facts": None}
    return kv_pool_size(**{**base, **kw}, page_bytes=2**20, reserve_bytes=GiB)


def test_the_fraction_sizes_the_pool_on_cuda_over_kv_cache_mb():
    s = size(mem_fraction=0.9, facts=H200)
    want = fraction_pool_pages(0.9, H200.total_bytes, H200.free_bytes, GiB, 2**20)
    assert s.num_pages == want and s.source.startswith("--mem-fraction-static 0.9 (")
    assert not s.notes


def test_kv_cache_mb_sizes_the_pool_without_the_fraction_and_on_the_cpu():
    assert size(facts=H200).source == "--kv-cache-mb 64" and size(facts=H200).num_pages is None
    cpu = size(mem_fraction=0.9, facts=None)
    assert cpu.num_pages is None and cpu.memory_bytes == 64 * 2**20
    assert cpu.source == "--kv-cache-mb 64"
    assert "applies to CUDA GPUs only" in cpu.notes[0] and "gpu-memory-utilization" in cpu.notes[0]


def test_num_pages_wins_and_a_bad_fraction_is_refused_even_then():
    s = size(num_pages=7, mem_fraction=0.9, facts=H200)
    assert s.num_pages == 7 and s.source == "--num-pages 7" and "not --mem-fraction" in s.notes[0]
    with pytest.raises(MemFractionError):
        size(num_pages=7, mem_fraction=1.5, facts=None)


# ---- "auto": dtype, page size, attention backend


def test_auto_dtype_is_bf16_on_cuda_and_float32_on_the_cpu():
    assert choose_dtype("auto", "cuda", True) == "bfloat16"
    assert choose_dtype("auto", "cuda", False) == "float16"  # no native bf16 (pre-Ampere)
    assert choose_dtype("auto", "cpu", True) == "float32"
    assert choose_dtype("float32", "cuda", True) == "float32"  # given: kept


def auto(page=None, **kw):
    base = {"dtype": "bfloat16", "flash": True, "triton": True}
    return choose_attention("auto", "cuda", page, **{**base, **kw})


def test_auto_on_cuda_picks_flash_attn_with_256_token_pages_and_says_so():
    c = auto()
    assert (c.backend, c.page_size) == ("flash-attn", 256) and "--page-size 256" in c.note
    given = auto(512)  # a multiple of 256 given: flash-attn, nothing to say
    assert (given.backend, given.page_size, given.note) == ("flash-attn", 512, "")


@pytest.mark.parametrize(
    ("kw", "backend", "reason"),
    [
        ({"page": 16}, "triton", "--page-size 16 is not a multiple of 256"),
        ({"kv_dtype": "int8"}, "triton", "--kv-cache-dtype int8"),
        ({"dtype": "float32"}, "triton", "not --dtype float32"),
        ({"flash": False}, "triton", "does not import"),
        ({"flash": False, "triton": False}, "torch", "does not import"),
    ],
)
def test_auto_falls_back_with_a_stated_reason(kw, backend, reason):
    c = auto(**kw)
    assert c.backend == backend and c.page_size == kw.get("page", 16)
    assert c.note.startswith(f"attention {backend}, not flash-attn: ") and reason in c.note


def test_mla_and_the_cpu_keep_16_token_pages():
    mla = auto(mla=True)  # MLA attends on torch ops: no flash-attn, no 256-token pages
    assert (mla.page_size, mla.note) == (16, "")
    cpu = choose_attention("auto", "cpu", None, dtype="float32", flash=True, triton=True)
    assert (cpu.backend, cpu.page_size, cpu.note) == ("auto", 16, "")
    explicit = choose_attention("flash-attn", "cuda", None, dtype="bfloat16")
    assert explicit.page_size == 256 and "flash-attn" in explicit.note
    assert choose_attention("triton", "cuda", None, dtype="bfloat16").page_size == 16
    with pytest.raises(ValueError, match="page_size must be >= 1"):
        auto(0)


def test_resolving_on_the_cpu_keeps_todays_defaults():
    o, note = resolve_dtype(RunnerOptions(), torch.device("cpu"))
    assert (o.dtype, note) == ("float32", "--dtype auto: float32 on cpu")
    assert resolve_dtype(RunnerOptions(dtype="bfloat16"), torch.device("cpu"))[1] == ""
    o, note = resolve_attention(o, torch.device("cpu"))
    assert (o.page_size, o.attention_backend, note) == (16, "auto", "")
    given = RunnerOptions(dtype="bfloat16", page_size=8)
    o, _ = resolve_dtype(given, torch.device("cpu"))
    assert resolve_attention(o, torch.device("cpu"))[0] == given


def test_a_triton_probe_that_fails_falls_back_to_sdpa_and_says_why():
    """--attention-backend auto on CUDA probes Triton (one tiny kernel compiled and
    launched); where the probe raises, attention runs on torch SDPA and the start-up note
    says why. Decided without a GPU: the probe is replaced, int8 KV rules flash-attn out."""
    pytest.importorskip("triton")
    from houchu.gpu.triton.probe import triton_unusable

    def broken(device: torch.device) -> None:
        raise RuntimeError("ptxas fatal:\n  Value 'sm_90a' is not defined")

    o = RunnerOptions(dtype="bfloat16", kv_cache_dtype="int8")
    got, note = resolve_attention(o, torch.device("cuda"), triton_launch=broken)
    assert got.attention_backend == "torch"
    assert note.startswith("attention torch SDPA, not flash-attn: ")
    assert note.endswith("; not triton: RuntimeError: ptxas fatal: Value 'sm_90a' is not defined")
    ok, note = resolve_attention(o, torch.device("cuda"), triton_launch=lambda d: None)
    assert ok.attention_backend == "triton" and "not triton" not in note
    calls: list[torch.device] = []

    def counted(device: torch.device) -> None:
        calls.append(device)
        raise OSError("no libcuda.so")

    for _ in range(3):  # probed once per device and process
        assert triton_unusable("cuda:1", counted) == "OSError: no libcuda.so"
    assert calls == [torch.device("cuda:1")]
    flash = choose_attention(
        "auto", "cuda", None, dtype="bfloat16", flash=True, triton_why="OSError: no libcuda.so"
    )
    assert flash.backend == "flash-attn" and flash.note.endswith(
        "; kernels torch, not triton: OSError: no libcuda.so"
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has a CUDA GPU")
def test_an_explicit_triton_backend_that_cannot_run_is_one_clear_error(monkeypatch):
    """--attention-backend triton where Triton cannot run: one line saying why (the real
    probe, failing here on a torch without CUDA), which the runner actor prints as a
    start-up failure, without a traceback."""
    pytest.importorskip("triton")
    from houchu.gpu.triton.probe import TritonUnusable
    from houchu.runner.backends import make_backend

    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # no interpreter: the CPU fails
    with pytest.raises(TritonUnusable) as err:
        make_backend("triton", torch.device("cuda"), page_size=16)
    msg = str(err.value)
    assert msg.startswith("--attention-backend triton cannot run on cuda: ") and "\n" not in msg
    with pytest.raises(TritonUnusable, match="need a CUDA device"):
        make_backend("triton", torch.device("cpu"), page_size=16)


@pytest.mark.parametrize("kv", ["auto", "int8", "fp8"])
def test_the_host_tier_slots_follow_the_dtype_and_page_size_the_runner_resolves(tiny_dir, kv):
    """The launcher sizes the host slots before the runner starts: from "auto" it must
    reach the runner's dtype and page size (here the CPU's: float32, 16 tokens), and its
    ``--kv-cache-dtype``: a quantized page (int8 / fp8 plus float16 scales) fills a slot,
    so ``--host-kv-mb`` buys as many slots as it holds such pages."""
    from houchu.actors.kv_tier_setup import prepare_kv_tiers
    from houchu.options.kv_tier_options import KVTierOptions
    from houchu.options.serve_config import ServeConfig

    runner = RunnerOptions(device="cpu", quantization="none", compile="off", kv_cache_dtype=kv)
    config = ServeConfig(model=str(tiny_dir), runner=runner, kv_tiers=KVTierOptions(host_kv_mb=1))
    config, host = prepare_kv_tiers(config)
    try:
        r = ModelRunner(str(tiny_dir), exact(kv_cache_mb=0.25, kv_cache_dtype=kv), quiet=True)
        r.attach_host_pool(host)
        assert r.host_kv.page_bytes == config.launch.host_slot_bytes  # a page fills a slot
        assert r.pool.page_size * r.pool.bytes_per_token == host.slot_bytes
        assert host.num_slots == 2**20 // host.slot_bytes  # all that --host-kv-mb 1 pays for
        r.close()
        r.host_kv = None
    finally:
        host.close()


# ---- the start-up line


def test_the_device_clause_names_the_gpu_and_its_memory():
    assert device_clause(torch.device("cpu"), None) == "cpu"
    line = device_clause(torch.device("cuda:0"), H200)
    assert line == "cuda:0 (NVIDIA H200, 139.8 GiB, 120.2 GiB free after the weights)"


def test_the_cuda_graph_clause():
    assert cuda_graph_clause("cpu", None, (1, 2), False, True) == ""
    got = cuda_graph_clause("cuda", "cuda_graph", (1, 2, 4), False, True)
    assert got == "CUDA graphs for batch 1,2,4"
    off = cuda_graph_clause("cuda", None, (1,), True, True)
    assert off == "no CUDA graphs (--disable-cuda-graph)"
    assert "no static decode path" in cuda_graph_clause("cuda", None, (1,), False, False)
    assert "cannot be captured" in cuda_graph_clause("cuda", None, (1,), False, True)


def test_the_runner_line_with_a_gpus_facts_and_the_pools_source(tiny_dir, capsys):
    r = ModelRunner(str(tiny_dir), exact(kv_cache_mb=0.25, mem_fraction_static=0.8))
    out = capsys.readouterr().out.splitlines()
    assert "sized by --kv-cache-mb 0.25" in out[0] and "float32 on cpu," in out[0]
    assert any("--mem-fraction-static 0.8 applies to CUDA GPUs only" in ln for ln in out[1:])
    assert (r.options.dtype, r.options.page_size) == ("float32", 16)  # CPU: as before
    r.device_facts = H200  # what torch.cuda would fill in on a GPU
    assert "float32 on cpu (NVIDIA H200, 139.8 GiB, 120.2 GiB free" in r.summary()
    r.choices = ["--dtype auto: bfloat16 on CUDA"]
    assert r.summary().endswith("; --dtype auto: bfloat16 on CUDA")


# ---- the ledger: 16-bit compute against float32


def counters(weight="none", kv="auto", half="bf16") -> LeverCounters:
    return LeverCounters(StepCost(1000, 1000, 64, 64, weight, kv, half))


def test_16_bit_compute_counts_the_dense_weights_and_kv_not_read():
    c = counters()
    c.record(kv_written=3, kv_read=10, accelerated=False)
    c.record(kv_written=1, kv_read=5, accelerated=False, weight_bytes=1500)
    got = {(s.lever, s.verb): s.saved for s in c.samples(now=1.0)}
    assert got[("half_precision_bf16", "move_less")] == 1000 + 1500 + 64 * 15
    assert got[("half_precision_bf16", "occupy_less")] == 64 * 4
    assert c.samples(now=2.0) == []  # nothing since


def test_16_bit_compute_leaves_quantized_weights_and_kv_to_their_levers():
    c = counters(weight="int4-g32", kv="int8")
    c.record(kv_written=3, kv_read=10, accelerated=False, weight_bytes=300)
    got = {(s.lever, s.verb): s.saved for s in c.samples(now=1.0)}
    assert got[("half_precision_bf16", "move_less")] == 0.0
    assert ("half_precision_bf16", "occupy_less") not in got
    f32 = counters(half="")
    f32.record(kv_written=3, kv_read=10, accelerated=False)
    assert not any(s.lever.startswith("half") for s in f32.samples(now=1.0))


def test_the_dashboard_knows_the_16_bit_lever():
    assert lever_words("half_precision_bf16")["title"] == "16-bit compute (bf16)"
    assert lever_words("half_precision_fp16")["title"].startswith("16-bit compute")
