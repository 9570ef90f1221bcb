"""houchu's W4A8 kernels (``int4_gemv(..., int8_acts=True)``) give the same bits at every x86
ISA level this CPU runs: the integer dot products are exact and every level does the same
float32 steps per (row, feature) in the same order, whether in 256-bit registers
(``gemv_a8.h``'s ``int4_tile_a8``: avx2, avx2_vnni, avx512), in 512-bit ones
(``gemv_a8_zmm.h``: avx512_bf16) or tiled for many rows (``gemm_a8.h``). Each level's
output is compared with the reference level's (avx2_vnni, else avx2) bit for bit, over row
counts of the few-row tile (1..4, and 4 + 1), of the many-row GEMM, partial blocks of 16
features, 8- and 16-input activation scales, bfloat16 and float32 scales and
activations."""

from __future__ import annotations

import pytest
import torch

from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels
from tests.support.cpu_kernels import int4_weight, why_not_loaded

X86_LEVELS = [lv.name for lv in cpu_isa.LEVELS if lv.kernels and "x86_64" in lv.arch]
REFERENCE_LEVELS = ("avx2_vnni", "avx2")  # the first of these this CPU runs

# (N, K, G): SmolLM2's qkv and down projections, partial blocks of 16 features (200: 8
# features in the last block; 23: 7, 40: 8), 8-input activation scales (G = 8, 24)
SHAPES = [(960, 576, 32), (576, 1536, 64), (200, 576, 32), (40, 24, 8), (23, 48, 24), (7, 64, 64)]


@pytest.fixture(scope="module")
def reference_level() -> str:
    """The reference level: the first of REFERENCE_LEVELS whose kernels load here."""
    for level in REFERENCE_LEVELS:
        if why_not_loaded(level) is None:
            return level
    pytest.skip(f"none of {', '.join(REFERENCE_LEVELS)} runs here")


@pytest.mark.parametrize("level", X86_LEVELS)
@pytest.mark.parametrize("x_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize("scale_dtype", [torch.bfloat16, torch.float32])
@pytest.mark.parametrize(("n", "k", "group"), SHAPES)
def test_w4a8_bits_equal_across_levels(level, n, k, group, scale_dtype, x_dtype, reference_level):
    if level == reference_level:
        pytest.skip(f"{level} is the reference level")
    why = why_not_loaded(level)
    if why is not None:
        pytest.skip(f"{level}: {why}")
    ref_ops, ops = cpu_kernels.ops(reference_level), cpu_kernels.ops(level)
    q, scale, offset, _ = int4_weight(n, k, group, scale_dtype, seed=n + k + group)
    packed = ref_ops.int4_pack(q, scale, offset, group)
    assert torch.equal(packed, ops.int4_pack(q, scale, offset, group))  # one layout
    gen = torch.Generator().manual_seed(n * k)
    x = torch.randn(9, k, generator=gen)
    x[1, k // 3] *= 40.0  # an outlier widens one activation scale
    x[2] = 0.0  # a zero row
    x = x.to(x_dtype)
    for m in (1, 2, 3, 4, 5, 9):  # the few-row tile (4 + 1 rows: two passes), the GEMM
        want = ref_ops.int4_gemv(x[:m], packed, group, n, True)
        got = ops.int4_gemv(x[:m], packed, group, n, True)
        assert got.dtype == want.dtype == x_dtype
        diff = (got.float() - want.float()).abs()
        assert torch.equal(got, want), (
            f"m={m}: {int((diff > 0).sum())} of {diff.numel()} outputs differ "
            f"(first at {tuple(torch.nonzero(diff)[0].tolist())}; max {diff.max().item():.3g})"
        )
