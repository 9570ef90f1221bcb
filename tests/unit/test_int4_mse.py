"""int4's error-minimising quantizer (``houchu.model.quant.int4_mse``, ``quantize_int4``'s
default "mse"): never a larger squared error than min/max RTN in any group, clearly a
smaller one overall, nearest-level codes for its grid, and exact or sane on the edge
cases (constant and all-zero groups, one outlier, bfloat16 / float16 weights)."""

from __future__ import annotations

import pytest
import torch

from houchu.model.quant.functions import Int4Weight, quantize_int4
from houchu.model.quant.int4_mse import CANDIDATES, CHUNK_VALUES, fit_int4_groups


def group_errors(q: Int4Weight, w: torch.Tensor) -> torch.Tensor:
    """``[N, K / G]`` summed squared error of each group of ``q.dequantize()`` against ``w``."""
    n, k = w.shape
    d = (q.dequantize() - w.float()).square()
    return d.reshape(n, k // q.group_size, q.group_size).sum(-1)


def weights(kind: str, n: int, k: int, seed: int) -> torch.Tensor:
    """``[N, K]`` float32 test weights of a distribution ``kind``."""
    g = torch.Generator().manual_seed(seed)
    if kind == "gauss":
        return torch.randn(n, k, generator=g) * 0.02
    if kind == "student2":  # heavy-tailed: infinite variance
        z = torch.randn(n, k, generator=g)
        chi = torch.randn(n, k, 2, generator=g).square().sum(-1)
        return z / (chi / 2).sqrt() * 0.02
    if kind == "uniform":
        return torch.rand(n, k, generator=g) - 0.3
    if kind == "outliers":  # Gaussian with one value in 50 scaled up 20x
        w = torch.randn(n, k, generator=g)
        return torch.where(torch.rand(n, k, generator=g) < 0.02, 20 * w, w)
    raise ValueError(kind)


KINDS = ["gauss", "student2", "uniform", "outliers"]
#: highest RMSE of "mse" relative to min/max held on the Gaussian and Student-t draws
#: (measured: Gaussian 0.893 / 0.918 / 0.932 at groups of 32 / 64 / 128, Student-t
#: 0.54-0.78)
MAX_RMSE_RATIO = {32: 0.93, 64: 0.95, 128: 0.96}


@pytest.mark.parametrize("group", [32, 64, 128])
@pytest.mark.parametrize("kind", KINDS)
def test_error_never_above_minmax(kind, group):
    """Per group, the searched scale and offset never leave a larger squared error than
    min/max RTN; on Gaussian and heavy-tailed weights the RMSE is clearly lower."""
    w = weights(kind, 256, 1024, seed=group)
    mse, rtn = quantize_int4(w, group), quantize_int4(w, group, "minmax")
    e_mse, e_rtn = group_errors(mse, w), group_errors(rtn, w)
    assert (e_mse <= e_rtn).all(), (e_mse - e_rtn).max()
    ratio = (e_mse.sum() / e_rtn.sum()).sqrt().item()
    if kind in ("gauss", "student2"):
        assert ratio < MAX_RMSE_RATIO[group], ratio
    assert ratio < 1.0


@pytest.mark.parametrize("group", [32, 128])
def test_codes_are_the_nearest_levels(group):
    """Each value's code is its nearest level of the group's grid (``q · scale + offset``,
    q in 0..15): within half a step inside the grid's range, the end code outside it."""
    w = weights("student2", 64, 512, seed=3)
    q = quantize_int4(w, group)
    assert q.q.dtype == torch.uint8 and int(q.q.max()) <= 15
    assert (q.scale > 0).all() and q.scale.isfinite().all() and q.offset.isfinite().all()
    step = q.scale.repeat_interleave(group, dim=1)
    lo = q.offset.repeat_interleave(group, dim=1)
    hi = lo + 15 * step
    err = (q.dequantize() - w).abs()
    inside = (w >= lo) & (w <= hi)
    assert (err[inside] <= step[inside] / 2 * (1 + 1e-5) + 1e-7).all()
    assert (q.q[w < lo] == 0).all() and (q.q[w > hi] == 15).all()
    assert (~inside).any()  # the search clips some heavy-tail values


def test_edge_groups_round_trip():
    """Constant and all-zero groups dequantize exactly; a group of zeros but one outlier
    keeps the outlier and the zeros within min/max's error."""
    w = torch.zeros(4, 128)
    w[1] = 0.37  # constant
    w[2, :32] = -5.0  # one constant group, the rest zero
    w[3, 64 + 7] = 9.0  # a single outlier among zeros
    for group in (32, 64, 128):
        q = quantize_int4(w, group)
        assert torch.equal(q.dequantize()[:2], w[:2])
        assert q.dequantize()[2:].sub(w[2:]).abs().max() < 1e-6
        assert (group_errors(q, w) <= group_errors(quantize_int4(w, group, "minmax"), w)).all()
    ramp = torch.arange(32.0)[None].repeat(2, 1) * torch.tensor([[1.0], [-0.5]])
    q = quantize_int4(ramp, 32)  # 32 evenly spaced values: min/max's grid is the optimum
    assert (group_errors(q, ramp) <= group_errors(quantize_int4(ramp, 32, "minmax"), ramp)).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_inputs(dtype):
    """bfloat16 / float16 weights are quantized as their float32 values are."""
    w = weights("gauss", 32, 256, seed=5).to(dtype)
    q, ref = quantize_int4(w, 32), quantize_int4(w.float(), 32)
    assert torch.equal(q.q, ref.q) and torch.equal(q.scale, ref.scale)
    assert torch.equal(q.offset, ref.offset)
    assert q.scale.dtype == torch.float32 and q.offset.dtype == torch.float32
    assert (group_errors(q, w) <= group_errors(quantize_int4(w, 32, "minmax"), w)).all()


def test_chunks_and_bad_method():
    """Groups fitted in several chunks get the same result as one at a time would (no
    group's fit depends on another's), and an unknown method is refused."""
    m = 2 * CHUNK_VALUES // (32 * len(CANDIDATES)) + 5  # groups: three chunks
    g = weights("outliers", m, 32, seed=9)
    q, s, o = fit_int4_groups(g)
    for i in (0, m // 2, m - 1):
        qi, si, oi = fit_int4_groups(g[i : i + 1])
        assert torch.equal(q[i], qi[0]) and torch.equal(s[i], si[0]) and torch.equal(o[i], oi[0])
    with pytest.raises(ValueError, match="method"):
        quantize_int4(torch.randn(4, 64), 32, "gptq")
