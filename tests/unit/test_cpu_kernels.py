"""houchu's C++ CPU kernels (``houchu.cpu.kernels``) against the torch reference:
fused RMSNorm (+ residual), RoPE on strided views, SiLU·mul (the vector paths at widths
that are multiples of the level's lanes, the portable ones elsewhere), paged decode
attention over plain and int8 pools (the AVX-512 or AVX2 group kernel at D = 64 and 128,
the portable one at other D), causal prefill attention (the tiled path at D = 32, 64 and
128, the portable one at other D), greedy argmax, bad input, and a model end to end
through the ``cpu`` backend."""

from __future__ import annotations

import pytest
import torch

from houchu.cpu import kernels as cpu_kernels
from houchu.model.attention.metadata import PrefillSeq, TorchMeta
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.ops import CpuOps, TorchOps
from houchu.model.rope import rope_cos_sin
from houchu.model.sampling.sampler import argmax_rows
from houchu.runner.backends import make_backend
from tests.support.cpu_kernels import make_pool

pytestmark = pytest.mark.usefixtures("cpu_isa")  # every test once per ISA level

DTYPES = [torch.float32, torch.bfloat16]
TOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def close(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    torch.testing.assert_close(a.float(), b.float(), atol=TOL[dtype], rtol=TOL[dtype])


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("rows", "hidden"), [(1, 576), (5, 96), (3, 200), (40, 64), (2, 100)]
)  # 200: AVX2's 8 lanes but not AVX-512's 16; 100: the portable path
def test_rms_norm_and_residual(dtype, rows, hidden):
    g = torch.Generator().manual_seed(rows * hidden)
    x = torch.randn(rows, hidden, generator=g).to(dtype)
    d = torch.randn(rows, hidden, generator=g).to(dtype)
    w = torch.randn(hidden, generator=g).to(dtype)
    close(CpuOps.rms_norm(x, w, 1e-5), TorchOps.rms_norm(x, w, 1e-5), dtype)
    y, r = CpuOps.add_rms_norm(x, d, w, 1e-6)
    y_ref, r_ref = TorchOps.add_rms_norm(x, d, w, 1e-6)
    assert torch.equal(r, r_ref)  # the residual add rounds exactly as torch's
    close(y, y_ref, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("t", "h", "hkv", "d"), [(1, 9, 3, 64), (7, 3, 1, 128), (4, 2, 2, 12), (3, 4, 2, 16)]
)  # d = 16: half 8, AVX2's vector path only
def test_rope_on_strided_qkv_views(dtype, t, h, hkv, d):
    g = torch.Generator().manual_seed(t + h + d)
    qkv = torch.randn(t, (h + 2 * hkv) * d, generator=g).to(dtype)
    q, k, _ = qkv.split([h * d, hkv * d, hkv * d], dim=-1)
    q, k = q.reshape(t, h, d), k.reshape(t, hkv, d)  # strided views, as in the model
    pos = torch.randint(0, 5000, (t,), generator=g)
    inv = 1.0 / (10000 ** (torch.arange(0, d, 2).float() / d))
    cos, sin = rope_cos_sin(pos, inv, dtype)
    for got, want in zip(CpuOps.rope(q, k, cos, sin), TorchOps.rope(q, k, cos, sin), strict=True):
        assert got.is_contiguous()
        close(got, want, dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("n", "inter"), [(1, 1536), (6, 160), (2, 1500), (33, 32), (3, 40)]
)  # 40: AVX2's vector path only; 1500: the portable path
def test_silu_mul(dtype, n, inter):
    gu = 4 * torch.randn(n, 2 * inter, generator=torch.Generator().manual_seed(n)).to(dtype)
    gu[0, :3] = torch.tensor([-200.0, 200.0, 0.0])  # exp's clamps
    close(CpuOps.silu_mul(gu), TorchOps.silu_mul(gu), dtype)


@pytest.mark.parametrize("kv_dtype", ["auto", "int8"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("ps", "h", "hkv", "d", "lens"),
    [
        (16, 9, 3, 64, [1, 17, 138]),
        (4, 8, 2, 128, [5, 31]),
        (8, 6, 2, 16, [16, 3]),
        (4, 3, 3, 64, [7]),
        (16, 32, 2, 64, [40, 2]),
        (32, 4, 1, 64, [70, 33, 32]),  # pages of two 16-key blocks, one cut short
    ],
)
def test_paged_decode_matches_sdpa(kv_dtype, dtype, ps, h, hkv, d, lens):
    pool = make_pool(kv_dtype, dtype, ps, hkv, d)
    g = torch.Generator().manual_seed(sum(lens) + ps + d)
    kv = torch.randn(2, pool.num_tokens, hkv, d, generator=g).to(dtype)
    pool.write(0, torch.arange(pool.num_tokens), kv[0], kv[1])
    perm = torch.randperm(pool.num_pages, generator=g)
    n_pages = max(-(-n // ps) for n in lens)
    bt = torch.stack([perm[i * n_pages : (i + 1) * n_pages] for i in range(len(lens))])
    qkv = torch.randn(len(lens), 2 * h * d, generator=g).to(dtype)
    q = qkv[:, : h * d].view(len(lens), h, d)  # a strided view, as the model passes it
    lens_t = torch.tensor(lens, dtype=torch.int32)
    span = torch.arange(n_pages * ps)
    meta = TorchMeta(
        all_decode=True,
        decode_pages=bt,
        decode_mask=(span[None] < lens_t[:, None])[:, None, None],
        decode_lens=lens_t,
    )
    want = TorchSDPABackend()._decode(0, q, pool, meta)
    got = make_backend("cpu")._decode(0, q, pool, meta)
    tol = 1e-5 if dtype == torch.float32 else 1e-2
    torch.testing.assert_close(got.float(), want.float(), atol=tol, rtol=tol)


def test_paged_decode_rejects_bad_input():
    pool = make_pool("auto", torch.float32, 4, 2, 64)
    q = torch.randn(1, 4, 64)
    k, v = pool.k[0], pool.v[0]
    attn = cpu_kernels.ops().paged_decode_attention
    pages = torch.tensor([[0, 1]])
    with pytest.raises(RuntimeError, match="outside"):  # longer than its pages
        attn(q, k, v, None, None, pages, torch.tensor([9], dtype=torch.int32), 0.125)
    with pytest.raises(RuntimeError, match="outside"):  # empty
        attn(q, k, v, None, None, pages, torch.tensor([0], dtype=torch.int32), 0.125)
    with pytest.raises(RuntimeError, match="outside the pool"):
        attn(q, k, v, None, None, torch.tensor([[0, 99]]), torch.tensor([8], dtype=torch.int32), 1)
    with pytest.raises(RuntimeError, match="int64"):
        attn(q, k, v, None, None, pages.int(), torch.tensor([8], dtype=torch.int32), 1.0)
    with pytest.raises(RuntimeError, match="multiple"):
        attn(torch.randn(1, 3, 64), k, v, None, None, pages, torch.tensor([8]).int(), 1.0)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        cpu_kernels.ops().rms_norm(torch.ones(2, 4).half(), torch.ones(4).half(), 1e-5)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("n", "start", "h", "hkv", "d"),
    [
        (512, 0, 9, 3, 64),  # the default model's prefill: many key blocks, GQA 3
        (37, 0, 9, 3, 64),  # rows not a multiple of the 16-position task
        (100, 50, 9, 3, 64),  # a chunk after a cached prefix
        (1, 30, 4, 2, 128),  # one token after a prefix
        (70, 0, 8, 8, 32),  # no grouping, D = 32
        (200, 17, 4, 1, 128),  # MQA, D = 128 (two rows per P·V tile)
        (5, 3, 6, 2, 48),  # D = 48: the portable path
    ],
)
def test_prefill_attention_matches_sdpa(dtype, n, start, h, hkv, d):
    """Causal prefill over strided q (a view of a fused qkv row, as the model passes it)
    against the torch backend's SDPA path with its offset causal mask."""
    g = torch.Generator().manual_seed(n + start + d)
    qkv = torch.randn(n, (h + 2 * hkv) * d, generator=g).to(dtype)
    q = qkv[:, : h * d].view(n, h, d)
    k, v = torch.randn(2, start + n, hkv, d, generator=g).to(dtype)
    pos = torch.arange(start, start + n)[:, None]  # [n, 1]
    mask = torch.arange(start + n)[None, :] <= pos if start else None  # [n, L]
    seq = PrefillSeq(rows=(0, n), start=start, kv_len=start + n, pages=None, mask=mask)
    want = TorchSDPABackend()._prefill(q, k, v, seq)
    got = make_backend("cpu")._prefill(q, k, v, seq)
    assert got.shape == (n, h, d) and got.dtype == dtype
    close(got, want, dtype)


def test_prefill_attention_rejects_bad_input():
    attn = cpu_kernels.ops().prefill_attention
    q, k = torch.randn(4, 6, 64), torch.randn(4, 2, 64)
    with pytest.raises(RuntimeError, match="exceeds"):  # more queries than keys
        attn(q, k, k, 1, 0.125)
    with pytest.raises(RuntimeError, match="multiple"):
        attn(torch.randn(4, 5, 64), k, k, 0, 0.125)
    with pytest.raises(RuntimeError, match="share a dtype"):
        attn(q, k.bfloat16(), k, 0, 0.125)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        attn(q.half(), k.half(), k.half(), 0, 0.125)
    with pytest.raises(RuntimeError, match="contiguous"):
        attn(q.transpose(1, 2), k, k, 0, 0.125)
    assert attn(q[:0], k, k, 0, 0.125).shape == (0, 6, 64)


@pytest.mark.parametrize("kv", ["auto", "int8"])
def test_runner_with_cpu_backend_matches_torch(tmp_path, kv):
    """End to end: fused ops and paged decode vs the torch backend, greedy tokens."""
    from houchu.devtools.tiny_models import make_tiny_llama
    from houchu.runner.model_runner import ModelRunner
    from tests.support.greedy import generate
    from tests.support.runner_options import exact

    path = make_tiny_llama(tmp_path, seed=2)
    kw = {"page_size": 4, "num_pages": 24, "kv_cache_dtype": kv}
    cpu = ModelRunner(path, exact(attention_backend="cpu", **kw), quiet=True)
    assert cpu.backend.name == "cpu" and cpu.model.ops.name == "cpu"
    torch_ = ModelRunner(path, exact(attention_backend="torch", **kw), quiet=True)
    assert generate(cpu, 6) == generate(torch_, 6)


def test_auto_backend_on_cpu_is_cpu():
    assert make_backend("auto", "cpu").name == "cpu"
    assert make_backend("torch", "cpu").name == "torch-sdpa"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize(
    ("m", "k", "n", "outliers"),
    [
        (64, 576, 960, None),
        (40, 96, 72, 0),
        (7, 100, 200, 5),
        (65, 1536, 576, None),
        (66, 64, 384, 3),
    ],
)
def test_w8a8_fused_matches_torch_path(monkeypatch, dtype, m, k, n, outliers):
    """W8A8's C++ quantization and epilogue vs its torch path (one output rounding apart;
    a few large activations make outliers), and the epilogue's fused SiLU·mul against the
    separate op (bit-equal)."""
    from houchu.model.linear import w8a8
    from houchu.model.linear.w8a8 import W8A8Linear

    # the int8 GEMM wherever it is exact, whatever the speed probe said on this machine
    monkeypatch.setattr(w8a8, "int_mm_pays", w8a8.int_mm_exact)
    g = torch.Generator().manual_seed(m + k)
    lin = W8A8Linear(torch.randn(n, k, generator=g).to(dtype) / 8, num_outliers=outliers)
    x = torch.randn(m, k, generator=g)
    x[:, :3] *= 40.0
    x = x.to(dtype)
    fused = lin(x)
    fused_act = lin.forward_silu_mul(x, cpu_kernels.ops().silu_mul)  # in the epilogue
    assert torch.equal(fused_act, cpu_kernels.ops().silu_mul(fused))  # same values
    monkeypatch.setattr(cpu_kernels, "_loaded", False)
    ref = lin(x)
    assert fused.dtype == ref.dtype == fused_act.dtype == dtype
    scale = ref.float().abs().amax()
    torch.testing.assert_close(fused.float() / scale, ref.float() / scale, atol=8e-3, rtol=0)


def test_quant_kernels_reject_bad_input():
    k = cpu_kernels.ops()
    x = torch.randn(4, 8)
    with pytest.raises(RuntimeError, match="outside"):
        k.quantize_rows_int8(x, torch.tensor([8]))
    with pytest.raises(RuntimeError, match="contiguous"):
        k.quantize_rows_int8(x.t(), torch.tensor([0]))
    acc = torch.zeros(4, 6, dtype=torch.int32)
    xs, w, cols = torch.ones(4, 1), torch.ones(6, 8, dtype=torch.int8), torch.tensor([1, 7])
    with pytest.raises(RuntimeError, match="w_scale"):
        k.int8_epilogue(acc, xs, torch.ones(5), torch.ones(4, 2), w, cols)
    with pytest.raises(RuntimeError, match="outliers must be"):  # C differs from len(cols)
        k.int8_epilogue(acc, xs, torch.ones(6), torch.ones(4, 3), w, cols)
    with pytest.raises(RuntimeError, match="outside"):
        k.int8_epilogue(acc, xs, torch.ones(6), torch.ones(4, 2), w, torch.tensor([1, 8]))
    with pytest.raises(RuntimeError, match="int8 weight"):
        k.int8_epilogue(acc, xs, torch.ones(6), torch.ones(4, 2), w.float(), cols)
    with pytest.raises(RuntimeError, match="float32 or bfloat16"):
        k.int8_epilogue(acc, xs, torch.ones(6), torch.ones(4, 2).half(), w, cols)


@pytest.mark.parametrize("v", [1, 15, 16, 17, 1000, 49152])
@pytest.mark.parametrize("rows", [1, 5])
def test_argmax_rows_matches_torch(v, rows):
    """Random rows, ties (the first maximum wins), NaN (wins), ±inf, strided rows."""
    g = torch.Generator().manual_seed(v * 7 + rows)
    x = torch.randn(rows, v, generator=g)
    cases = [x, x.round(), torch.full((rows, v), -float("inf")), torch.zeros(rows, v)]
    y = x.clone()
    y[0, v // 2] = float("inf")
    y[-1, (3 * v) // 4] = float("nan")
    y[-1, v - 1] = float("nan")
    cases += [y, torch.randn(rows, 2 * v, generator=g)[:, ::2].contiguous()]
    wide = torch.randn(rows, v + 3, generator=g)[:, :v]  # rows at a stride
    cases.append(wide)
    for c in cases:
        assert torch.equal(cpu_kernels.ops().argmax_rows(c), c.argmax(dim=-1))
    assert torch.equal(argmax_rows(x.bfloat16()), x.bfloat16().argmax(dim=-1))  # torch's


def test_argmax_rows_rejects_bad_input():
    with pytest.raises(RuntimeError, match="float32"):
        cpu_kernels.ops().argmax_rows(torch.zeros(2, 3, dtype=torch.float16))
    with pytest.raises(RuntimeError, match="V >= 1"):
        cpu_kernels.ops().argmax_rows(torch.zeros(2, 0))
    with pytest.raises(RuntimeError, match=r"\[R, V\]"):
        cpu_kernels.ops().argmax_rows(torch.zeros(3))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_epilogue_gives_the_same_bits_at_every_level(dtype):
    """W8A8's epilogue (the AVX-512 and AVX2 tiles, the portable loop for the columns
    past the last tile and where no tile exists) gives the same bits at every level this
    CPU runs: one fma per outlier product, in the same order."""
    from houchu.cpu import isa
    from tests.support.kernel_levels import KERNEL_LEVELS

    g = torch.Generator().manual_seed(3)
    m, k, n, c = 7, 96, 200, 5  # 200 columns: whole tiles and a tail at 32 and 64 lanes
    acc = torch.randint(-(2**20), 2**20, (m, n), dtype=torch.int32, generator=g)
    xs, ws = torch.rand(m, 1, generator=g), torch.rand(n, generator=g)
    w = torch.randint(-127, 128, (n, k), dtype=torch.int8, generator=g)
    cols = torch.randperm(k, generator=g)[:c].contiguous()
    outl = (torch.randn(m, c, generator=g) * 30).to(dtype)
    before, got = cpu_kernels.active_level(), {}
    try:
        for level in KERNEL_LEVELS:
            if not isa.runs(isa.level(level)) or cpu_kernels.unavailable_reason(level):
                continue
            cpu_kernels.select(level)
            for silu in (False, True):
                got[level, silu] = cpu_kernels.ops().int8_epilogue(acc, xs, ws, outl, w, cols, silu)
    finally:
        cpu_kernels.select(before)
    levels = sorted({lv for lv, _ in got})
    assert len(levels) >= 1
    for (level, silu), y in got.items():
        assert torch.equal(y, got[levels[0], silu]), (level, levels[0], silu)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_row_quantization_equals_the_torch_reference(dtype):
    """W8A8's C++ row quantization (AVX-512 and AVX2 loops, the portable tail) gives
    ``houchu.model.quant.functions.quantize_rows_int8``'s bits on the rows with the outlier
    columns set to 0, and the outliers as they are, at every level."""
    from houchu.model.quant.functions import quantize_rows_int8

    g = torch.Generator().manual_seed(11)
    x = (torch.randn(9, 100, generator=g) * 3).to(dtype)  # 100: whole vectors and a tail
    x[:, 7] *= 50.0
    cols = torch.tensor([7, 42, 99])
    q, s, outl = cpu_kernels.ops().quantize_rows_int8(x, cols)
    ref = x.float().index_fill(1, cols, 0.0)
    rq, rs = quantize_rows_int8(ref)
    assert torch.equal(s, rs) and torch.equal(q, rq)
    assert torch.equal(outl, x[:, cols])
