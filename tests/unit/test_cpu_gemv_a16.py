"""houchu's int8 GEMV with int16 activations (``gemv_a16.h``: the AVX2 levels' path for
float32 and bfloat16 activations, the AVX-512 levels' for float32; the LM head's above
all): its error against the exact product stays within what the quantization allows
(half a step of 2^-14 of each 64-input block's largest |x|), a NaN or an infinity reaches
the outputs it feeds and no others, and every x86 level gives the same bits (256- and
512-bit registers, with and without VNNI: the integer sums are exact and the float32
steps are the same)."""

from __future__ import annotations

import pytest
import torch

from houchu.cpu import isa as cpu_isa
from houchu.cpu import kernels as cpu_kernels
from tests.support.cpu_kernels import a16_activations, int8_weight, why_not_loaded

X86_LEVELS = [lv.name for lv in cpu_isa.LEVELS if lv.kernels and "x86_64" in lv.arch]


def _skip_unless_loaded(level: str) -> None:
    why = why_not_loaded(level)
    if why is not None:
        pytest.skip(f"{level}: {why}")


def _x(m: int, k: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """[M, K]: values over many binades, an outlier in one block, a zero row."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(m, k, generator=g) * torch.exp(torch.randn(m, k, generator=g))
    x[min(1, m - 1), k // 3] *= 300.0
    if m > 2:
        x[2] = 0.0
    return x.to(dtype)


@pytest.mark.parametrize("level", X86_LEVELS)
@pytest.mark.parametrize(("n", "k"), [(576, 576), (200, 150), (49152, 576)])
def test_error_within_the_quantization_step(level, n, k):
    _skip_unless_loaded(level)
    if not cpu_kernels.int8_int16_acts(torch.float32, level):
        pytest.skip(f"{level} uses float32 activations as they are")
    ops = cpu_kernels.ops(level)
    q, scale, dense = int8_weight(n, k, torch.float32, seed=k)
    packed = ops.int8_pack(q, scale)
    x = _x(5, k, torch.float32, seed=n)
    y = ops.int8_gemv(x, packed, n, True)  # [5, N] float32
    step = (a16_activations(x) - x).abs()  # [5, K] each input's rounding error
    kp = -(-k // 64) * 64
    amax = torch.nn.functional.pad(x.abs(), (0, kp - k)).view(5, -1, 64).amax(-1)
    half = (amax / 16383 / 2).repeat_interleave(64, 1)[:, :k]  # [5, K] half a step
    assert (step <= half * 1.01).all()  # float32 rounding of q * scale beside the step
    exact = x.double() @ dense.double().T
    bound = half.double() @ dense.abs().double().T + 1e-5 * (
        x.abs().double() @ dense.abs().double().T
    )
    assert ((y.double() - exact).abs() <= bound + 1e-30).all()


@pytest.mark.parametrize("level", X86_LEVELS)
def test_nan_and_inf_reach_only_their_rows(level):
    _skip_unless_loaded(level)
    if not cpu_kernels.int8_int16_acts(torch.float32, level):
        pytest.skip(f"{level} uses float32 activations as they are")
    ops = cpu_kernels.ops(level)
    n, k = 64, 200
    q, scale, _ = int8_weight(n, k, torch.float32, seed=1)
    packed = ops.int8_pack(q, scale)
    x = torch.randn(4, k, generator=torch.Generator().manual_seed(2))
    clean = ops.int8_gemv(x, packed, n, True)
    x[1, 70] = float("nan")
    x[3, 199] = float("inf")
    y = ops.int8_gemv(x, packed, n, True)
    assert y[1].isnan().all() and y[3].isnan().all()
    assert torch.equal(y[0], clean[0]) and torch.equal(y[2], clean[2])


@pytest.mark.parametrize("level", X86_LEVELS)
@pytest.mark.parametrize("x_dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize(("n", "k"), [(960, 576), (200, 150), (23, 64), (40, 1536)])
def test_bits_equal_across_levels(level, n, k, x_dtype):
    """Each level that takes x_dtype to int16 gives the first such level's bits, at row
    counts of one pass, of two (4 + 1, 8 + 1) and in between."""
    levels = [lv for lv in X86_LEVELS if cpu_kernels.int8_int16_acts(x_dtype, lv)]
    if level not in levels:
        pytest.skip(f"{level} does not take {x_dtype} to int16")
    _skip_unless_loaded(level)
    reference = next(
        (lv for lv in reversed(levels) if cpu_isa.runs(cpu_isa.level(lv))), None
    )  # the AVX2 one first: the 256-bit tile
    if reference is None or reference == level or cpu_kernels.unavailable_reason(reference):
        pytest.skip(f"{level} is the reference level, or none loads")
    q, scale, _ = int8_weight(n, k, torch.bfloat16, seed=n + k)
    ref_ops, ops = cpu_kernels.ops(reference), cpu_kernels.ops(level)
    packed = ref_ops.int8_pack(q, scale)
    assert torch.equal(packed, ops.int8_pack(q, scale))
    x = _x(9, k, x_dtype, seed=n * k)
    for m in (1, 2, 3, 4, 5, 8, 9):
        for float_out in (True, False):
            want = ref_ops.int8_gemv(x[:m], packed, n, float_out)
            got = ops.int8_gemv(x[:m], packed, n, float_out)
            assert torch.equal(got, want), (level, reference, m, float_out)
