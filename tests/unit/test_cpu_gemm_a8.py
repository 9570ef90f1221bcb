"""houchu's W4A8 GEMM for many rows (``gemm_a8.h``: ``int4_gemv(..., int8_acts=True)``
from ``kGemmA8MinRows`` rows): bit for bit the results of the few-row tile (the same
float32 steps per row and feature), at row counts that are not multiples of its row
block, group sizes whose activation scales cover 8 or 16 inputs, partial feature
blocks, bfloat16 and float32 scales and activations, on one thread and on two; and
within the float32 summation bound of the quantized reference, once per ISA level."""

from __future__ import annotations

import pytest
import torch

from houchu.cpu import kernels as cpu_kernels
from tests.support.cpu_kernels import a8_reference, int4_weight

pytestmark = pytest.mark.usefixtures("cpu_isa")  # every test once per ISA level

FEW_ROWS = 4  # int4_tile_a8's rows per pass (kMaxTileA8): calls of <= 4 rows run there

# (N, K, G): SmolLM2's qkv and down projections, a partial block of 16 features, group
# sizes whose activation scales hold 8 inputs (G = 8, 24: one 8-input chunk per scale)
SHAPES = [(960, 576, 32), (576, 1536, 64), (200, 576, 32), (40, 24, 8), (23, 48, 24)]


@pytest.fixture(params=[1, 2], ids=["1-thread", "2-threads"])
def threads(request: pytest.FixtureRequest):
    """Run the test with torch's pool at 1 and at 2 threads (the feature blocks split
    between the threads differently)."""
    before = torch.get_num_threads()
    torch.set_num_threads(request.param)
    yield request.param
    torch.set_num_threads(before)


def few_row_calls(x: torch.Tensor, packed: torch.Tensor, group: int, n: int) -> torch.Tensor:
    """x's rows through int4_gemv FEW_ROWS at a time (the few-row tile)."""
    ops = cpu_kernels.ops()
    return torch.cat(
        [
            ops.int4_gemv(x[i : i + FEW_ROWS], packed, group, n, True)
            for i in range(0, x.shape[0], FEW_ROWS)
        ]
    )


@pytest.mark.parametrize("m", [8, 9, 31, 65, 130])
@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
def test_many_rows_equal_the_few_row_tile(n, k, group, m, scale_dtype, threads):
    q, scale, offset, _ = int4_weight(n, k, group, scale_dtype, seed=n + k + m)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m + k))
    x[m // 2] = 0.0  # a zero row stays zero
    x[0, k // 3] *= 40.0  # an outlier widens one activation scale
    y = cpu_kernels.ops().int4_gemv(x, packed, group, n, True)
    assert y.shape == (m, n) and y.dtype == torch.float32
    assert torch.equal(y, few_row_calls(x, packed, group, n))
    assert torch.equal(y[m // 2], torch.zeros(n))
    xb = x.bfloat16()
    yb = cpu_kernels.ops().int4_gemv(xb, packed, group, n, True)
    assert yb.dtype == torch.bfloat16
    assert torch.equal(yb, few_row_calls(xb, packed, group, n))


@pytest.mark.parametrize("m", [8, 77, 300])
def test_many_rows_match_the_quantized_reference(m, threads):
    n, k, group = 3072 // 4, 576, 32
    q, scale, offset, dense = int4_weight(n, k, group, torch.bfloat16, seed=m)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    x = torch.randn(m, k, generator=torch.Generator().manual_seed(m))
    y = cpu_kernels.ops().int4_gemv(x, packed, group, n, True)
    ref = a8_reference(x, q, scale, offset, group)
    bound = 1e-5 * (x.abs() @ dense.abs().T) + 1e-30  # float32 summation order
    worst = ((y - ref).abs() / bound).max().item()
    assert worst <= 1.0, f"error {worst:.3g}x the bound"


def test_strided_many_rows_equal_contiguous(threads):
    n, k, group = 576, 576, 32
    q, scale, offset, _ = int4_weight(n, k, group, torch.float32, seed=7)
    packed = cpu_kernels.ops().int4_pack(q, scale, offset, group)
    base = torch.randn(k, 70, generator=torch.Generator().manual_seed(8))
    x = base.T  # [70, K], strides (1, 70)
    y = cpu_kernels.ops().int4_gemv(x, packed, group, n, True)
    assert torch.equal(y, cpu_kernels.ops().int4_gemv(x.contiguous(), packed, group, n, True))
