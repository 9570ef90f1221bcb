"""houchu's W4A8 kernels (``int4_gemv(..., int8_acts=True)``, ``gemv_a8.h``): int4 weights
times activations quantized to int8 per 16 inputs, against a torch reference of the same
quantization (scale = amax / 127, round half to even; integer dot products; the offset
term over the sums of the quantized activations), once per ISA level; and the product
is the float product of the dequantized activations, the least error such activations
allow."""

from __future__ import annotations

import pytest
import torch

from houchu.cpu import kernels as cpu_kernels
from tests.support.cpu_kernels import INT4_SHAPES, a8_reference, int4_weight

pytestmark = pytest.mark.usefixtures("cpu_isa")  # every test once per ISA level


@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("m", [1, 3, 4, 5, 16])
@pytest.mark.parametrize(("n", "k", "group"), INT4_SHAPES)
def test_int4_gemv_int8_acts_matches_reference(n, k, group, m, x_dtype):
    q, scale, offset, dense = int4_weight(n, k, group, torch.bfloat16, seed=n + k + group)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m)).to(x_dtype)
    y = cpu_kernels.ops().int4_gemv(x, packed, group, n, True)
    assert y.dtype == x_dtype and y.shape == (m, n)
    ref = a8_reference(x, q, scale, offset, group)
    mag = x.float().abs() @ dense.abs().T  # float32 summation-order bound
    bound = 1e-5 * mag + 1e-30
    if x_dtype == torch.bfloat16:
        bound = bound + 2.0**-8 * ref.abs()
    worst = ((y.float() - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"error {worst:.3g}x the bound"


def test_int8_acts_error_against_the_exact_product_is_small():
    n, k, group = 960, 576, 32
    q, scale, offset, dense = int4_weight(n, k, group, torch.float32, seed=1)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    x = torch.randn(8, k, generator=torch.Generator().manual_seed(2))
    exact = cpu_kernels.ops().int4_gemv(x, packed, group, n)
    a8 = cpu_kernels.ops().int4_gemv(x, packed, group, n, True)
    rel = ((a8 - exact).norm() / exact.norm()).item()
    assert 0 < rel < 0.03, rel  # 7-bit activations: about 1% on Gaussian rows


def fake_quant(x: torch.Tensor, a: int = 16) -> torch.Tensor:
    """x [M, K] float32 quantized to int8 per ``a`` inputs and back (as the kernel does)."""
    m, k = x.shape
    xb = x.view(m, k // a, a)
    amax = xb.abs().amax(-1, keepdim=True)  # [M, K/a, 1]
    inv = torch.where(amax > 0, torch.tensor(127.0) / amax, torch.zeros(()))
    return (torch.round(xb * inv) * (amax / 127)).view(m, k)


@pytest.mark.parametrize("outlier", [1.0, 30.0])
def test_int8_acts_equal_the_float_product_of_the_dequantized_activations(outlier):
    """The W4A8 product is W (dequant(quant(x))): the weights meet the activations'
    rounding error as they are, offset included (not the unsigned codes alone, whose
    error is about twice as large), also with an outlier channel."""
    n, k, group = 960, 576, 32
    q, scale, offset, dense = int4_weight(n, k, group, torch.float32, seed=3)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    x = torch.randn(5, k, generator=torch.Generator().manual_seed(4))
    x[:, 7] *= outlier
    a8 = cpu_kernels.ops().int4_gemv(x, packed, group, n, True)
    fq = cpu_kernels.ops().int4_gemv(fake_quant(x), packed, group, n)
    exact = cpu_kernels.ops().int4_gemv(x, packed, group, n)
    mag = x.abs() @ dense.abs().T  # [5, N] float32 summation-order bound
    assert ((a8 - fq).abs() <= 2e-5 * mag + 1e-6).all()
    assert (a8 - exact).norm() > 0


def test_int8_acts_rows_are_independent_and_zero_rows_stay_zero():
    n, k, group = 200, 576, 32
    q, scale, offset, _ = int4_weight(n, k, group, torch.bfloat16, seed=5)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    x = torch.randn(6, k, generator=torch.Generator().manual_seed(6))
    x[2] = 0.0
    y = cpu_kernels.ops().int4_gemv(x, packed, group, n, True)
    for r in range(6):
        one = cpu_kernels.ops().int4_gemv(x[r : r + 1], packed, group, n, True)
        assert torch.equal(one[0], y[r])  # a row's result never depends on its batch
    assert torch.equal(y[2], torch.zeros(n))
