"""Quantized weights and KV (tiny random model): formats, kernels, the runner's levers."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.gguf.blocks import gguf_to_int4
from houchu.model.kv.page_pool import kv_token_bytes
from houchu.model.kv.pool import KVPool
from houchu.model.linear.factory import make_linear
from houchu.model.linear.quantized import Int4Linear, Int8Linear
from houchu.model.linear.w8a8 import W8A8_OUTLIER_SHARE, W8A8Linear
from houchu.model.quant.functions import QuantSpec, quantize_int4
from houchu.runner.model_runner import ModelRunner
from tests.support.greedy import generate
from tests.support.runner_options import exact


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    return make_tiny_llama(tmp_path_factory.mktemp("quant"), seed=5)


@pytest.mark.parametrize("qtype", ["Q4_0", "Q4_1"])
def test_gguf_q4_converts_losslessly(qtype):
    w = np.random.default_rng(0).normal(size=(8, 64)).astype(np.float32)
    raw = gguf.quants.quantize(w, gguf.GGMLQuantizationType[qtype])
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(8, 64)
    got = gguf_to_int4(raw, qtype, (8, 64))
    assert got.group_size == 32 and int(got.q.max()) <= 15
    assert torch.equal(got.dequantize(), torch.from_numpy(want))


@pytest.mark.parametrize("group", [32, 64, 128])
def test_int4_rtn_error_bound(group):
    """min/max RTN: every value within half a step (the default "mse" method clips some
    values, tests/unit/test_int4_mse.py)."""
    w = torch.randn(16, 256)
    q = quantize_int4(w, group, "minmax")
    step = q.scale.repeat_interleave(group, dim=1)
    assert ((q.dequantize() - w).abs() <= step / 2 + 1e-6).all()
    with pytest.raises(ValueError, match="does not divide"):
        quantize_int4(torch.randn(4, 96), 64)


@pytest.mark.parametrize("rows", [1, 5, 40, 200])
def test_quantized_linears_match_dequantized_matmul(rows):
    g = torch.Generator().manual_seed(rows)
    w = torch.randn(48, 128, generator=g) * 0.05
    x = torch.randn(rows, 128, generator=g)
    i4 = Int4Linear(quantize_int4(w, 32))
    ref4 = F.linear(x, i4.dequantize().float())
    torch.testing.assert_close(i4(x), ref4, atol=0.05 * ref4.abs().max(), rtol=0.02)
    i8 = Int8Linear(w)
    ref8 = F.linear(x, i8.q.float() * i8.wscale[:, None])
    torch.testing.assert_close(i8(x), ref8, atol=0.02 * ref8.abs().max(), rtol=0.02)
    for fmt in ("int8", "fp8"):
        w8a8 = W8A8Linear(w, fmt=fmt)
        tol = 0.05 if fmt == "int8" else 0.15
        torch.testing.assert_close(w8a8(x), x @ w.t(), atol=tol * ref8.abs().max(), rtol=tol)


def test_w8a8_runs_outlier_features_in_float(monkeypatch):
    """Two features 100x larger than the rest (as LLM activations have): with per-token
    int8 alone they set every row's scale and the ordinary features lose their precision;
    with the LLM.int8() decomposition the error is that of the int8 weights alone."""
    from houchu.model.linear import w8a8
    from houchu.model.linear.w8a8 import int_mm_exact

    if not int_mm_exact():
        pytest.skip("torch._int_mm saturates on this CPU: W8A8 runs weight-only here")
    monkeypatch.setattr(w8a8, "int_mm_pays", lambda: True)  # the GEMM, whatever its speed
    g = torch.Generator().manual_seed(7)
    w = torch.randn(64, 256, generator=g) * 0.05
    x = torch.randn(64, 256, generator=g)
    x[:, 3] *= 100.0
    x[:, 200] *= -100.0
    exact = x @ w.t()
    plain, mixed = W8A8Linear(w, num_outliers=0), W8A8Linear(w)
    assert mixed.num_outliers == int(256 * W8A8_OUTLIER_SHARE) == 256 // 8
    ref8 = F.linear(x, mixed.q.float() * mixed.wscale[:, None])  # int8 weights, float x

    def err(y: torch.Tensor) -> float:
        return float((y - exact).abs().mean())

    assert err(mixed(x)) < 1.5 * err(ref8)
    assert err(plain(x)) > 3 * err(mixed(x))


@pytest.mark.parametrize("cls", ["int4", "int8"])
def test_dense_copy_for_many_rows_matches_and_is_charged(cls):
    """From ``dense_min_rows`` rows a CPU layer multiplies with its prepacked dense copy:
    the same numbers as the quantized kernel / on-the-fly dequantization, and the ledger
    charges that copy's bytes (below it, the bytes of the layout its kernel reads)."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(96, 128, generator=g) * 0.05
    x = torch.randn(16, 128, generator=g)

    def make(dense):
        if cls == "int4":
            return Int4Linear(quantize_int4(w, 32), dense_min_rows=dense)
        return Int8Linear(w, dense_min_rows=dense)

    with_copy, without = make(8), make(None)
    if with_copy.dense_min_rows is None:
        pytest.skip("oneDNN does not take this activation dtype here")
    torch.testing.assert_close(with_copy(x), without(x), atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(with_copy(x[:3]), without(x[:3]), atol=0, rtol=0)
    dense_bytes = 96 * 128 * with_copy.act_dtype.itemsize
    blob = with_copy.gemv_blob(7)  # below the copy's rows: houchu's GEMV layout, if loaded
    below = blob[0].numel() * blob[0].element_size() if blob else with_copy.weight_bytes()
    assert with_copy.weight_bytes_at(7) == below < dense_bytes
    assert with_copy.weight_bytes_at(8) == dense_bytes
    assert without.weight_bytes_at(500) == without.weight_bytes()


def test_make_linear_and_byte_counts():
    w = torch.randn(64, 128)
    assert make_linear(w, QuantSpec("none")).weight_bytes() == 64 * 128 * 4
    i4 = make_linear(w, QuantSpec("int4", 64))
    assert (
        i4.kind == "int4-g64"
        and i4.weight_bytes() == 64 * 128 // 2 + 2 * 2 * 64 * i4.sz.element_size()
    )
    assert make_linear(w, QuantSpec("int4"), head=True).kind == "int8"
    assert make_linear(w, QuantSpec("w8a8")).kind.startswith("w8a8")
    with pytest.raises(ValueError, match="quantization must be"):
        QuantSpec("int3")


@pytest.mark.parametrize("kv", ["int8", "fp8"])
def test_quantized_pool_roundtrip_and_capacity(tiny_dir, kv):
    from houchu.model.config.load import load_model_config

    cfg = load_model_config(tiny_dir)
    plain = KVPool.for_model(cfg, page_size=4, dtype=torch.bfloat16, memory_bytes=1 << 16)
    quant = KVPool.for_model(
        cfg, page_size=4, dtype=torch.bfloat16, memory_bytes=1 << 16, kv_dtype=kv
    )
    assert quant.bytes_per_token == kv_token_bytes(cfg, torch.bfloat16, kv) < plain.bytes_per_token
    assert quant.num_tokens >= 1.7 * plain.num_tokens  # (D + 2) bytes vs 2 D per head
    k = torch.randn(6, cfg.num_kv_heads, cfg.head_dim).bfloat16()
    quant.write(1, torch.arange(6), k, -k)
    got_k, got_v = quant.gather(1, torch.tensor([0, 1]), 6)
    tol = 0.02 if kv == "int8" else 0.08
    assert ((got_k.float() - k.float()).abs().max() / k.float().abs().max()) < tol
    assert torch.equal(got_v, -got_k)
    assert len(quant.page_tensors()) == 4 and len(plain.page_tensors()) == 2


@pytest.mark.parametrize(
    ("quant", "kv"),
    [("int4", "auto"), ("int8", "auto"), ("w8a8", "auto"), ("none", "int8"), ("int4", "fp8")],
)
def test_runner_quantized_generates_and_reports_levers(tiny_dir, quant, kv):
    r = ModelRunner(
        tiny_dir,
        exact(page_size=4, num_pages=24, quantization=quant, kv_cache_dtype=kv),
        quiet=True,
    )
    dense = generate(ModelRunner(tiny_dir, exact(page_size=4, num_pages=24), quiet=True))
    got = generate(r)
    agree = sum(a == b for r_ in dense for a, b in zip(dense[r_], got[r_], strict=True))
    assert agree >= 6  # a random tiny model is fragile; the real-model test measures quality
    samples = {(s.lever, s.verb): s for s in r.lever_samples()}
    if quant != "none":
        s = samples[(f"weight_quant_{quant}", "move_less")]  # the catalog's: one per mode
        assert s.saved > 0 and s.saved_unit == "bytes"
    if kv != "auto":
        s = samples[(f"kv_quant_{kv}", "occupy_less")]
        assert s.saved > 0 and 0 < s.spent < 0.1 and s.spent_unit == "relative_rms_error"
    assert r.lever_samples() == []  # nothing new since


def test_w8a8_runs_weight_only_where_int_mm_saturates(monkeypatch):
    """Where ``torch._int_mm`` is not exact (a CPU without int8 dot products) or slow
    (``int_mm_pays``), W8A8's rows run its int8 weights weight-only: the int8 layer's
    numbers, never the GEMM's."""
    import houchu.model.linear.w8a8 as w8a8

    g = torch.Generator().manual_seed(9)
    w = torch.randn(48, 128, generator=g) * 0.05
    x = torch.randn(200, 128, generator=g)
    monkeypatch.setattr(w8a8, "int_mm_pays", lambda: False)
    layer = W8A8Linear(w)
    assert torch.equal(layer(x), Int8Linear.forward(layer, x))


def test_the_int8_gemm_runs_only_where_the_probe_finds_it_pays(monkeypatch, capsys):
    """``int_mm_pays``: an inexact ``torch._int_mm`` never runs; an exact one runs unless
    it was ``INT_MM_SLOWER`` times slower than the dense matmul (printed once)."""
    import houchu.model.linear.w8a8 as w8a8

    probe = w8a8.int_mm_pays.__wrapped__  # uncached
    monkeypatch.setattr(w8a8, "int_mm_exact", lambda: False)
    assert probe() is False
    monkeypatch.setattr(w8a8, "int_mm_exact", lambda: True)
    monkeypatch.setattr(w8a8, "INT_MM_SLOWER", 0.0)  # no GEMM is that fast
    assert probe() is False
    assert "W8A8 layers run their int8 weights weight-only" in capsys.readouterr().err
    monkeypatch.setattr(w8a8, "INT_MM_SLOWER", float("inf"))  # any GEMM is fast enough
    assert probe() is True


def test_w8a8_takes_torchs_ops_where_its_epilogue_has_no_simd_tiles(monkeypatch):
    """At the NEON levels W8A8's C++ epilogue is the portable loop: the int8 GEMM's float
    work runs on torch's vectorized ops there, never a scalar hot path."""
    from houchu.cpu import kernels as cpu_kernels

    layer = W8A8Linear(torch.randn(48, 128) * 0.05)
    x = torch.randn(80, 128)
    if cpu_kernels.is_loaded():
        assert layer._fused_at(x)  # noqa: SLF001 (x86: the C++ tiles)
    monkeypatch.setattr(cpu_kernels, "active_level", lambda: "neon_dotprod")
    assert not layer._fused_at(x)  # noqa: SLF001
