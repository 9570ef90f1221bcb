"""Error-minimising int4 group parameters: each group's scale and minimum chosen to
minimise its squared rounding error rather than set from its min/max.

Min/max round-to-nearest (RTN) spreads the 16 levels over the whole range ``[min, max]``,
so one large value coarsens the step of its whole group. llama.cpp's K-quants search the
step instead (``make_qkx2_quants`` in ggml-quants.c, which ``quantize_row_q4_K_ref``
calls with ``rmin = -1``, ``rdelta = 0.1``, ``nstep = 20``): for each candidate inverse
scale ``(15 + rmin + rdelta · i) / (max - min)`` it assigns the codes ``l = clamp(round((x
- min) · iscale), 0, 15)``, refits the scale and minimum to them by least squares, and
keeps the candidate with the smallest error. Above ``15 / (max - min)`` the largest
values are clipped to 15 (a finer step for the rest); below it the codes leave the top
level free and the refit stretches them.

Here the same search runs on whole tensors of groups at once (``fit_int4_groups``):

- the candidates are ``CANDIDATES``: 4 factors where ``make_qkx2_quants`` tries 21
  (14.0, 14.1, ..., 16.0), picked greedily among 121 (12.0-18.0) for the lowest error
  on Gaussian and Student-t groups of 32; the 21 would lower the RMSE 0.6% more
  (relative to min/max: 0.888 against 0.894 on trained weights) at 3x the time;
- each candidate's least-squares fit and its squared error come in closed form from
  per-group sums (``Σl``, ``Σl²``, ``Σxl`` besides ``Σx``, ``Σx²``, on the group's
  values less their mean, so that less cancels);
- unlike Q4_K, the minimum may be positive (houchu's offset is a free float32, where
  Q4_K stores ``-min`` as an unsigned 6-bit number) and the error is unweighted (Q4_K
  weights each value by ``rms + |x|``: on the trained tiny models, with 6 candidates,
  that moved log p 2% more than the plain squared error, whose guarantee below this
  keeps);
- the winner's codes are then reassigned to the nearest level of its fitted grid and
  refitted again (``REFITS`` rounds, alternating least squares as HQQ's solver
  alternates: neither step can raise the error);
- every group whose final error (computed as ``Int4Weight.dequantize`` computes the
  weight) is not below min/max RTN's keeps RTN: no group's squared error is ever above
  min/max's.

The format is unchanged (``q`` in 0..15, a float32 scale and offset per group, ``w ≈ q ·
scale + offset``), so every int4 kernel takes it as before. Only float weights go
through here: a GGUF file's Q4_0/Q4_1 tensors are converted losslessly
(``gguf_blocks.gguf_to_int4``) and kept as they are.

Cost: about 8 passes over a group's values per candidate and per refit, in chunks that
stay in the cache: 3.3-3.8 s of one core's CPU for SmolLM2-135M's 106M projection values
in bfloat16 (min/max: 0.4 s; 6 candidates 4.6 s, the 21 of Q4_K 11.5 s), measured on
one thread under another benchmark's load.
"""

from __future__ import annotations

import torch

#: inverse-scale factors tried (ascending), times ``1 / (max - min)``, as
#: ``make_qkx2_quants``' ``15 + rmin + rdelta · i`` (there i = 0..20 with rmin -1, rdelta
#: 0.1: 14.0, 14.1, ..., 16.0); 15 would be min/max's own codes
CANDIDATES = (14.05, 14.65, 15.15, 15.55)
#: assign-and-refit rounds after the search
REFITS = 2
#: candidate levels per chunk of groups (groups x group size x candidates): the float32
#: temporaries of 1 MiB each stay in the cache, so the passes are compute-bound
CHUNK_VALUES = 1 << 18


def fit_int4_groups(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group int4 codes, scales and offsets minimising the squared error.

    Args:
        g: ``[M, G]`` float32 groups (one per row).
    Returns:
        ``(q, scale, offset)``: ``[M, G]`` uint8 codes in 0..15, ``[M]`` float32 scales
        (positive) and offsets, with ``q · scale + offset`` at least as close to ``g``
        (summed squared error, per group) as min/max RTN's.
    """
    m, size = g.shape
    q = torch.empty(m, size, dtype=torch.uint8, device=g.device)
    scale, offset = torch.empty(m, device=g.device), torch.empty(m, device=g.device)
    step = max(1, CHUNK_VALUES // (size * len(CANDIDATES)))
    for i in range(0, m, step):
        q[i : i + step], scale[i : i + step], offset[i : i + step] = _fit_chunk(g[i : i + step])
    return q, scale, offset


def rtn_int4_groups(g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Min/max round-to-nearest: ``scale = (max - min) / 15``, ``offset = min``.

    Args:
        g: ``[M, G]`` float32 groups.
    Returns:
        ``(q, scale, offset)`` as ``fit_int4_groups`` (a constant group: scale 1e-10,
        codes 0, offset its value, exact).
    """
    lo, hi = g.amin(-1), g.amax(-1)
    scale = ((hi - lo) / 15.0).clamp(min=1e-10)
    q = ((g - lo[:, None]) / scale[:, None]).round_().clamp_(0, 15).to(torch.uint8)
    return q, scale, lo


def group_sq_error(
    g: torch.Tensor, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor
) -> torch.Tensor:
    """``[M]`` summed squared error of ``q · scale + offset`` against ``g`` (``[M, G]``),
    with the dequantization computed as ``Int4Weight.dequantize`` computes it."""
    w = q.float().mul_(scale[:, None]).add_(offset[:, None]).sub_(g)
    return w.mul_(w).sum(-1)


def _fit_chunk(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``fit_int4_groups`` on ``[M, G]`` float32 groups few enough to stay in the cache."""
    q0, s0, o0 = rtn_int4_groups(x)
    mean = x.mean(-1)
    xc = x - mean[:, None]  # centred: the closed-form errors cancel less
    sx, sxx = xc.sum(-1), (xc * xc).sum(-1)  # [M]
    lo = xc.amin(-1, keepdim=True)
    t = (xc - lo).div_((xc.amax(-1, keepdim=True) - lo).clamp_(min=1e-30))  # in [0, 1]
    cand = torch.tensor(CANDIDATES, device=x.device)[:, None, None]  # [C, 1, 1], ascending
    lvl = (t * cand).round_()  # [C, M, G]; >= 0, and above 15 only where c >= 15.5
    lvl[sum(c < 15.5 for c in CANDIDATES) :].clamp_(max=15)
    s, o, err = _refit(xc, lvl, sx, sxx)  # [C, M] each
    pick = err.argmin(0, keepdim=True)
    s, o = s.gather(0, pick)[0], o.gather(0, pick)[0]  # [M]
    for _ in range(REFITS):
        lvl = (xc - o[:, None]).mul_((1.0 / s)[:, None]).round_().clamp_(0, 15)
        s2, o2, err = _refit(xc, lvl, sx, sxx)
        fitted = err.isfinite()
        s, o = torch.where(fitted, s2, s), torch.where(fitted, o2, o)
    scale = s.clamp(min=1e-10)
    offset = o + mean
    q = (x - offset[:, None]).div_(scale[:, None]).round_().clamp_(0, 15).to(torch.uint8)
    keep = group_sq_error(x, q, scale, offset) < group_sq_error(x, q0, s0, o0)
    q = torch.where(keep[:, None], q, q0)
    return q, torch.where(keep, scale, s0), torch.where(keep, offset, o0)


def _refit(
    x: torch.Tensor, lvl: torch.Tensor, sx: torch.Tensor, sxx: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Least-squares scale and offset of ``x ≈ lvl · s + o`` per group, and the summed
    squared error that leaves (``Σx² - s·Σxl - o·Σx`` at the least-squares solution);
    where the levels are all equal or the fitted scale is not positive: error ``inf``,
    scale 1, offset 0.

    Args:
        x: ``[M, G]`` values; lvl: ``[..., M, G]`` float levels (several candidates'
            along a leading dimension); sx, sxx: ``[M]`` ``Σx`` and ``Σx²``.
    Returns:
        ``(s, o, err)``, each ``[..., M]``.
    """
    n = lvl.shape[-1]
    sl, sll, sxl = lvl.sum(-1), (lvl * lvl).sum(-1), (lvl * x).sum(-1)
    det = n * sll - sl * sl
    ok = det > 0
    det = torch.where(ok, det, 1.0)
    s = (n * sxl - sx * sl) / det
    o = (sll * sx - sl * sxl) / det
    err = sxx - s * sxl - o * sx
    ok &= s > 0
    return torch.where(ok, s, 1.0), torch.where(ok, o, 0.0), torch.where(ok, err, float("inf"))
