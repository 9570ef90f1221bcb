"""GGUF tensors computed on as stored (``houchu.model.gguf.blocks``): every stored type's
blocks decode to exactly what ``gguf.quants.dequantize`` gives (random blocks with zero
scales and extreme minimums included); an ``Int4Linear`` of each type multiplies like
the dequantized weight on every ISA level of houchu's C++ GEMV this CPU runs (float and
int8 activations) and on torch's int4 kernel; a GGUF file of each type, written with the
``gguf`` library, is served as stored under ``--quantization auto`` with the same greedy
tokens as its dequantized exact path."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
import torch
import torch.nn.functional as F

from houchu.devtools.gguf_writers import write_llama_gguf
from houchu.devtools.tiny_models import make_tiny_llama
from houchu.model.gguf.blocks import BLOCK_BYTES, STORED_TYPES, gguf_to_int4, quantize_blocks
from houchu.model.linear.quantized import BF16_HEADER_KINDS, Int4Linear
from houchu.model.quant.quality import agreement, text_logprobs
from houchu.runner.model_runner import ModelRunner
from houchu.transport.messages import SamplingParams, SeqInit, SeqWork, StepPlan
from tests.support.runner_options import exact

TYPES = list(STORED_TYPES)


def _f16(v: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(v.astype(np.float16)).view(np.uint8).reshape(-1, 2)


def random_blocks(qtype: str, n: int, k: int, seed: int = 0) -> np.ndarray:
    """``[n, K / block · bytes]`` random blocks of ``qtype``: random codes and 6-bit
    scales, float16 scales of either sign with every 7th zero, and (Q4_1/Q5_1/K-quants)
    minimums from small to -65000 (the float16 extreme)."""
    rng = np.random.default_rng(seed)
    nbytes, block = BLOCK_BYTES[qtype]
    nb = n * (k // block)
    raw = rng.integers(0, 256, size=(nb, nbytes), dtype=np.uint8)
    d = (rng.normal(size=nb) * 0.01).astype(np.float32)
    d[::7] = 0.0  # zero scales
    m = (rng.normal(size=nb) * 0.1).astype(np.float32)
    m[::5] = -65000.0  # extreme minimums
    at = {"Q6_K": 208, "Q2_K": 80, "Q3_K": 108}.get(qtype, 0)  # the float16 d
    raw[:, at : at + 2] = _f16(d)
    if qtype in ("Q4_1", "Q5_1"):
        raw[:, 2:4] = _f16(m)
    elif qtype in ("Q4_K", "Q5_K", "Q2_K"):
        at = 82 if qtype == "Q2_K" else 2
        raw[:, at : at + 2] = _f16(np.abs(m) / 1000)  # dmin
    return raw.reshape(n, -1)


@pytest.mark.parametrize("qtype", TYPES)
def test_blocks_decode_as_gguf_dequantizes(qtype):
    n, k = 6, 512
    raw = random_blocks(qtype, n, k)
    want = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(n, k)
    w = gguf_to_int4(raw, qtype, (n, k))
    assert w.kind == qtype and w.shape == (n, k)
    assert w.planes == (1 if STORED_TYPES[qtype] <= 4 else 2)
    assert int(w.q.max()) <= 15 and w.q.dtype == torch.uint8
    got = w.dequantize().numpy()
    # (d·lo + m) + 16d·hi: float32 sums of exact products in another order than d·q + m
    np.testing.assert_allclose(got, want, rtol=0, atol=np.abs(want).max() * 2**-22)
    with pytest.raises(ValueError, match="does not fit"):
        gguf_to_int4(raw[:, :-1], qtype, (n, k))


@pytest.mark.parametrize("qtype", ["Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"])
def test_k_quant_writer_round_trips(qtype):
    """``quantize_blocks`` writes ggml's layouts: gguf's own dequantizer reads them back
    close to the input, and ``block_codes`` reads them back exactly."""
    x = np.random.default_rng(1).normal(size=(4, 512)).astype(np.float32) * 0.05
    x[0] = 0.0  # an all-zero row: zero scales
    raw = quantize_blocks(x, qtype)
    ref = gguf.quants.dequantize(raw, gguf.GGMLQuantizationType[qtype]).reshape(4, 512)
    assert np.abs(ref - x).max() < 0.5 * np.abs(x).max() and not ref[0].any()
    np.testing.assert_array_equal(gguf_to_int4(raw, qtype, (4, 512)).dequantize().numpy(), ref)


def _layer(qtype: str, n: int, k: int, activations: str) -> tuple[Int4Linear, torch.Tensor]:
    raw = random_blocks(qtype, n, k, seed=n + k)
    raw_f = np.random.default_rng(2).normal(size=(n, k)).astype(np.float32) * 0.05
    raw = quantize_blocks(raw_f, qtype) if qtype != "Q4_1" else raw  # realistic scales
    w = gguf_to_int4(raw, qtype, (n, k))
    return Int4Linear(w, activations=activations, dense_min_rows=None), w.dequantize()


@pytest.mark.parametrize("qtype", TYPES)
@pytest.mark.parametrize("activations", ["float", "int8"])
def test_stored_gemv_matches_dequantized_matmul(cpu_isa, qtype, activations):
    """Every ISA level's GEMV (the ``cpu_isa`` fixture) on a stored weight: within
    rounding of the activation dtype (and the int8 activations' own error) of the
    dequantized weight's matmul, at 1, 3 and 8 rows."""
    n, k = 80, 512
    lin, dense = _layer(qtype, n, k, activations)
    assert lin._cpu_gemv is not None
    g = torch.Generator().manual_seed(3)
    for m in (1, 3, 8):
        x = torch.randn(m, k, generator=g)
        ref = F.linear(x.to(lin.act_dtype).float(), dense)
        got = lin(x).float()
        tol = 2e-2 if activations == "int8" else (1e-2 if lin.act_dtype != torch.float32 else 1e-5)
        err = (got - ref).abs().max().item() / ref.abs().max().item()
        assert err < tol, f"{cpu_isa} {qtype} m={m}: relative error {err:.3g}"


@pytest.mark.parametrize("qtype", [t for t in TYPES if t not in ("Q2_K", "Q3_K", "Q6_K")])
def test_stored_weight_on_torch_int4_kernel(qtype):
    """The route's "torch" path (torch's int4 matmul over [x, x] for two planes)."""
    n, k = 48, 512
    lin, dense = _layer(qtype, n, k, "float")
    x = torch.randn(2, k)
    ref = F.linear(x.to(lin.act_dtype).float(), dense)
    packed = lin.packed
    xs = x.to(lin.act_dtype).repeat(1, lin.planes)
    got = torch.ops.aten._weight_int4pack_mm_for_cpu(xs, packed, lin.group_size, lin.sz)
    err = (got.float() - ref).abs().max().item() / ref.abs().max().item()
    assert err < (1e-2 if lin.act_dtype != torch.float32 else 1e-5)


def test_q6_k_without_torch_kernel_dequantizes():
    """Q6_K's groups of 16 have no torch int4 kernel: rows past the GEMV dequantize."""
    n, k = 32, 256
    lin, dense = _layer("Q6_K", n, k, "float")
    x = torch.randn(200, k)  # >= dequant_min_rows: dequantize-then-matmul
    ref = F.linear(x.to(lin.act_dtype).float(), dense)
    got = lin(x).float()
    assert (got - ref).abs().max() <= 1e-2 * ref.abs().max()


SP = SamplingParams(temperature=0.0, max_tokens=64)


def _greedy(runner: ModelRunner, prompt: list[int], steps: int) -> list[int]:
    pages = list(range(16))
    init = SeqInit(rid="a", sampling=SP, prompt_ids=prompt)
    work = SeqWork(rid="a", token_ids=prompt, start_pos=0, page_table=pages, sample=True)
    out = runner.execute(StepPlan(step_id=0, init=[init], work=[work]))
    toks = [out.outputs[0].token_id]
    for i in range(steps - 1):
        w = SeqWork(
            rid="a", token_ids=[toks[-1]], start_pos=len(prompt) + i, page_table=pages, sample=True
        )
        toks.append(runner.execute(StepPlan(step_id=1 + i, work=[w])).outputs[0].token_id)
    return toks


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    # widths of a multiple of 256 (K-quant super-blocks); a vocabulary of a multiple of 16
    # (the stored LM head)
    d = tmp_path_factory.mktemp("stored")
    return make_tiny_llama(
        d,
        seed=7,
        hidden_size=256,
        intermediate_size=512,
        vocab_size=256,
        num_attention_heads=4,
        num_key_value_heads=2,
    )


@pytest.mark.parametrize("qtype", TYPES)
def test_gguf_of_each_type_serves_like_its_exact_path(tiny_dir, tmp_path, qtype):
    """auto serves the file as stored (its projections and its head). Where every product
    is exact (float32 activations, as on an AVX2 CPU, and float32 group headers: every
    type but Q4_0/Q4_1), greedy decoding for 16 tokens gives the dequantized exact path's
    tokens; with bfloat16 activations (AVX512-BF16), the stored model teacher-forced on
    the exact path's tokens is within 0.05 nats on average, and its top-1 differs only
    at the exact path's near-ties (two tokens within 0.1 nats: a random tiny model has
    many)."""
    path = str(write_llama_gguf(tiny_dir, tmp_path / f"m-{qtype}.gguf", qtype=qtype))
    prompt = [5, 17, 99, 3, 42, 8, 120, 64, 7, 11]
    opts = {"page_size": 4, "num_pages": 16, "threads": 1, "int4_activations": "float"}
    ref = ModelRunner(path, exact(**opts), quiet=True)
    want = _greedy(ref, prompt, 16)
    got_runner = ModelRunner(path, exact(quantization="auto", **opts), quiet=True)
    try:
        model = got_runner.model
        assert model.quant.mode == "int4"
        lins = [m for m in model.modules() if isinstance(m, Int4Linear)]
        assert lins and all(m.stored == qtype for m in lins)
        assert isinstance(model.lm_head, Int4Linear) and model.lm_head.float_out
        assert any(qtype in note for note in model.load_notes)
        got = _greedy(got_runner, prompt, 16)
        exact_products = lins[0].act_dtype == torch.float32 and qtype not in BF16_HEADER_KINDS
        if exact_products:
            assert got == want
        else:
            ids = prompt + want
            lp_ref, lp = text_logprobs(ref.model, ids), text_logprobs(model, ids)
            assert agreement(lp_ref, lp, ids).mean_abs_dlogp < 0.05
            top_ref, top = lp_ref.argmax(-1), lp.argmax(-1)  # [len(ids)]
            rows = torch.arange(len(ids))
            gap = lp_ref[rows, top_ref] - lp_ref[rows, top]  # 0 where both agree
            assert gap.max().item() < 0.1, "a top-1 that differs beyond a near-tie"
    finally:
        got_runner.close()
        ref.close()


def test_stored_head_gives_float32_logits_at_every_row_count(cpu_isa):
    """A stored LM head (``float_out``) returns the GEMV's float32 sums at 1..16 rows,
    each row the same as that row alone (up to float32 summation order), whatever the
    activation dtype."""
    raw = quantize_blocks(
        np.random.default_rng(4).normal(size=(64, 256)).astype(np.float32), "Q8_0"
    )
    w = gguf_to_int4(raw, "Q8_0", (64, 256))
    head = Int4Linear(w, dense_min_rows=None, activations="float", float_out=True)
    x = torch.randn(16, 256)
    alone = torch.cat([head(x[i : i + 1]) for i in range(16)])
    for m in (1, 8, 16):
        y = head(x[:m])
        assert y.dtype == torch.float32
        torch.testing.assert_close(y, alone[:m], rtol=1e-5, atol=1e-5)
    ref = F.linear(x.to(head.act_dtype).float(), w.dequantize())
    assert (alone - ref).abs().max() <= 1e-4 * ref.abs().max()


def test_fused_parts_of_other_group_sizes_and_planes_stay_as_stored():
    """q/k as Q4_K (one plane, groups of 32) beside v as Q6_K (two planes, groups of 16),
    as many Q4_K_M files store them: fused without loss (groups of 16, two planes), the
    layer kept as stored, never rounded again."""
    from houchu.model.linear.factory import fuse_weights, make_linear
    from houchu.model.quant.functions import QuantSpec

    rng = np.random.default_rng(5)
    parts = [
        gguf_to_int4(quantize_blocks(rng.normal(size=(n, 256)).astype(np.float32), t), t, (n, 256))
        for n, t in ((64, "Q4_K"), (32, "Q4_K"), (32, "Q6_K"))
    ]
    fused = fuse_weights(parts, torch.float32)
    assert fused.group_size == 16 and fused.planes == 2 and fused.kind == "Q4_K+Q6_K"
    want = torch.cat([p.dequantize() for p in parts])
    torch.testing.assert_close(
        fused.dequantize(), want, rtol=0, atol=1e-6 * float(want.abs().max())
    )
    layer = make_linear(fused, QuantSpec("int4"))
    assert isinstance(layer, Int4Linear) and layer.stored == "Q4_K+Q6_K"
    x = torch.randn(2, 256)
    ref = F.linear(x.to(layer.act_dtype).float(), want)
    assert (layer(x).float() - ref).abs().max() <= 1e-2 * ref.abs().max()
