"""houchu's C++ int4 / int8 GEMV kernels (``cpu_kernels.ops().int4_gemv`` and
``int8_gemv``, ``gemv.cpp``) against the dense float32 reference ``x.float() @ w.T``,
where ``w`` is built in float32 from the stored codes, scales and offsets: SmolLM2's
shapes, group sizes 32 / 64 / 128, 1-11 activation rows, bfloat16 and float32
activations and scales, padded feature blocks, strided x, and bad input."""

from __future__ import annotations

import pytest
import torch

from houchu.cpu import kernels as cpu_kernels
from tests.support.cpu_kernels import INT4_SHAPES, a16_activations, int4_weight, int8_weight

pytestmark = pytest.mark.usefixtures("cpu_isa")  # every test once per ISA level


def check(y: torch.Tensor, x: torch.Tensor, dense: torch.Tensor, a16: bool = False) -> None:
    """y must equal x.float() @ dense.T up to float32 summation order (relative to
    |x| @ |dense|.T) and then, for bfloat16 x, the rounding of the output; ``a16``: of x
    as its int16 activations stand for it (``a16_activations``)."""
    assert y.dtype == x.dtype and y.shape == (x.shape[0], dense.shape[0])
    ref = (a16_activations(x) if a16 else x.float()) @ dense.T
    mag = x.float().abs() @ dense.abs().T
    bound = 1e-5 * mag + 1e-30
    if x.dtype == torch.bfloat16:
        bound = bound + 2.0**-8 * ref.abs()
    err = (y.float() - ref).abs()
    worst = (err / bound).max().item()
    assert worst <= 1.0, f"error {worst:.3g}x the bound"


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 2, 3, 8])
@pytest.mark.parametrize(("n", "k", "group"), INT4_SHAPES)
def test_int4_gemv_matches_dense(n, k, group, m, x_dtype):
    q, scale, offset, dense = int4_weight(n, k, group, torch.bfloat16, seed=n + k + group)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(x_dtype)
    check(cpu_kernels.ops().int4_gemv(x, packed, group, n), x, dense)


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_int4_gemv_float32_scales_many_rows_and_strided_x(x_dtype):
    n, k, group = 192, 1536, 128
    q, scale, offset, dense = int4_weight(n, k, group, torch.float32, seed=3)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    base = torch.randn(2 * k, 11, generator=torch.Generator().manual_seed(4)).to(x_dtype)
    x = base[::2].T  # [11, K], neither dimension contiguous
    check(cpu_kernels.ops().int4_gemv(x, packed, group, n), x, dense)
    assert cpu_kernels.ops().int4_gemv(x[:0], packed, group, n).shape == (0, n)


def test_int4_gemv_lm_head_sized():
    n, k, group = 49152, 576, 32
    q, scale, offset, dense = int4_weight(n, k, group, torch.bfloat16, seed=5)
    x = torch.randn(1, k, generator=torch.Generator().manual_seed(6)).bfloat16()
    check(
        cpu_kernels.ops().int4_gemv(
            x, cpu_kernels.ops().int4_pack(q, scale, offset, group), group, n
        ),
        x,
        dense,
    )


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 2, 3, 8, 11])
@pytest.mark.parametrize(("n", "k"), [(576, 576), (960, 1536), (200, 30)])
@pytest.mark.parametrize("s_dtype", [torch.bfloat16, torch.float32])
def test_int8_gemv_matches_dense(n, k, m, x_dtype, s_dtype):
    q, scale, dense = int8_weight(n, k, s_dtype, seed=n + k)
    packed = cpu_kernels.ops().int8_pack(q, scale)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(x_dtype)
    a16 = cpu_kernels.int8_int16_acts(x_dtype)
    check(cpu_kernels.ops().int8_gemv(x, packed, n), x, dense, a16)


@pytest.mark.parametrize("m", [1, 8])
def test_int8_gemv_lm_head(m):
    n, k = 49152, 576
    q, scale, dense = int8_weight(n, k, torch.bfloat16, seed=7)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(8)).bfloat16()
    y = cpu_kernels.ops().int8_gemv(x, cpu_kernels.ops().int8_pack(q, scale), n)
    check(y, x, dense, cpu_kernels.int8_int16_acts(x.dtype))


@pytest.mark.parametrize("m", [1, 3, 8])
def test_int8_gemv_float_out_is_the_unrounded_float32_product(m):
    """``float_out``: bfloat16 x, float32 y within float32 summation order of the exact
    product (no rounding to bfloat16: the LM head's logits), and y rounded to bfloat16
    is the default output."""
    n, k = 4096, 576
    q, scale, dense = int8_weight(n, k, torch.bfloat16, seed=11)
    packed = cpu_kernels.ops().int8_pack(q, scale)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(12)).bfloat16()
    y = cpu_kernels.ops().int8_gemv(x, packed, n, True)  # [m, N] float32
    assert y.dtype == torch.float32 and y.shape == (m, n)
    ref = (a16_activations(x) if cpu_kernels.int8_int16_acts(x.dtype) else x.float()) @ dense.T
    mag = x.float().abs() @ dense.abs().T
    assert ((y - ref).abs() <= 1e-5 * mag + 1e-30).all()
    assert (y != y.bfloat16().float()).float().mean() > 0.9  # not on bfloat16's grid
    assert torch.equal(cpu_kernels.ops().int8_gemv(x, packed, n), y.bfloat16())


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_int8_gemv_row_does_not_depend_on_the_other_rows(x_dtype):
    """Batch invariance: a row's output is bit for bit the same alone and among 1..10
    other rows, at any place (the LM head runs here: a seeded request must sample the
    same tokens whatever else is in its step). Activations spread over many binades, so
    a different summation order would round differently."""
    n, k = 640, 576
    q, scale, _ = int8_weight(n, k, torch.bfloat16, seed=3)
    packed = cpu_kernels.ops().int8_pack(q, scale)
    g = torch.Generator().manual_seed(4)
    x = torch.randn(11, k, generator=g) * torch.exp(2 * torch.randn(11, k, generator=g))
    x = x.to(x_dtype)  # [11, K]
    alone = cpu_kernels.ops().int8_gemv(x[:1], packed, n)[0]  # [N]
    for m, at, row in row_among_others(lambda r: cpu_kernels.ops().int8_gemv(r, packed, n), x, 11):
        assert torch.equal(row, alone), (m, at)


def row_among_others(gemv, x: torch.Tensor, most: int):  # noqa: ANN001 (an op)
    """Yields ``(m, at, row)``: ``gemv`` of x[0] placed at row ``at`` (first or last)
    among x[1:m], for m = 2..``most``; ``gemv`` maps ``[M, K]`` to ``[M, N]``."""
    for m in range(2, most + 1):
        for at in (0, m - 1):
            rows = torch.cat([x[1:m][:at], x[:1], x[1:m][at:]])  # [m, K], x[0] at row `at`
            yield m, at, gemv(rows)[at]


@pytest.mark.parametrize("s_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
def test_int4_gemv_batch_invariant_row_does_not_depend_on_the_other_rows(x_dtype, s_dtype):
    """``batch_invariant=True`` (``houchu serve --deterministic``): a row's output is bit
    for bit the same alone and among 1..16 other rows, at the first or last place, at
    every ISA level. Activations spread over many binades, so that a different order of
    a row's float32 sums (the default's accumulator chains depend on the tile's row
    count) would round differently."""
    n, k, group = 960, 576, 32
    q, scale, offset, _ = int4_weight(n, k, group, s_dtype, seed=5)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    g = torch.Generator().manual_seed(6)
    x = torch.randn(17, k, generator=g) * torch.exp(4 * torch.randn(17, k, generator=g))
    x = x.to(x_dtype)  # [17, K]

    def gemv(rows: torch.Tensor) -> torch.Tensor:
        return cpu_kernels.ops().int4_gemv(rows, packed, group, n, False, True)

    alone = gemv(x[:1])[0]  # [N]
    for m, at, row in row_among_others(gemv, x, 17):
        assert torch.equal(row, alone), (m, at)


def test_int4_gemv_batch_invariant_refuses_int8_activations():
    q, scale, offset, _ = int4_weight(64, 128, 32, torch.bfloat16, seed=9)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, 32)
    with pytest.raises(RuntimeError, match="batch_invariant takes float activations"):
        cpu_kernels.ops().int4_gemv(torch.randn(2, 128), packed, 32, 64, True, True)


def test_int4_bad_input_raises():
    q, scale, offset, _ = int4_weight(64, 128, 32, torch.bfloat16, seed=9)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, 32)
    x = torch.randn(2, 128).bfloat16()
    bad_pack = [
        ((q.int(), scale, offset, 32), "uint8"),
        ((q, scale, offset, 48), "group_size"),  # does not divide K
        ((q, scale, offset, 12), "group_size"),  # not a multiple of 8
        ((q, scale[:, :2], offset, 32), "scale must be"),
        ((q, scale, offset[:32], 32), "offset must be"),
        ((q, scale, offset.float(), 32), "bfloat16 or both float32"),
        ((q | 16, scale, offset, 32), "0..15"),
    ]
    for args, msg in bad_pack:
        with pytest.raises(RuntimeError, match=msg):
            cpu_kernels.ops().int4_pack(*args)
    bad_gemv = [
        ((torch.randn(2, 96).bfloat16(), packed, 32, 64), "K = 128"),
        ((x, packed, 32, 65), "out_features"),
        ((x, packed, 32, 48), "out_features"),
        ((x, packed, 64, 64), "wrong group_size"),
        ((x.half(), packed, 32, 64), "bfloat16 or float32"),
        ((x[0], packed, 32, 64), r"\[M, K\]"),
        ((x, packed.view(-1), 32, 64), "int4_pack's contiguous"),
    ]
    for args, msg in bad_gemv:
        with pytest.raises(RuntimeError, match=msg):
            cpu_kernels.ops().int4_gemv(*args)


def test_int8_bad_input_raises():
    q, scale, _ = int8_weight(64, 128, torch.bfloat16, seed=10)
    packed = cpu_kernels.ops().int8_pack(q, scale)
    x = torch.randn(2, 128).bfloat16()
    with pytest.raises(RuntimeError, match="int8 tensor"):
        cpu_kernels.ops().int8_pack(q.to(torch.uint8), scale)
    with pytest.raises(RuntimeError, match="scale must be"):
        cpu_kernels.ops().int8_pack(q, scale[:10])
    with pytest.raises(RuntimeError, match="bfloat16 or float32"):
        cpu_kernels.ops().int8_pack(q, scale.half())
    bad_gemv = [
        ((torch.randn(2, 120).bfloat16(), packed, 64), "K matching"),
        ((x, packed, 80), "out_features"),
        ((x.double(), packed, 64), "bfloat16 or float32"),
        ((x, packed[:, 1:], 64), "int8_pack's contiguous"),
    ]
    for args, msg in bad_gemv:
        with pytest.raises(RuntimeError, match=msg):
            cpu_kernels.ops().int8_gemv(*args)
