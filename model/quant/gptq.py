"""GPTQ int4 weights (Frantar, Ashkboos, Hoefler & Alistarh 2022, "GPTQ: Accurate
Post-Training Quantization for Generative Pre-trained Transformers"; reference
implementation github.com/IST-DASLab/gptq, with AutoGPTQ's ``desc_act`` column order and
``static_groups``).

Rounding each weight to its nearest int4 level (``quant.quantize_int4``) treats the
errors of a row's columns as independent. GPTQ instead quantizes a row's columns one at
a time and spreads each column's rounding error over the columns not yet quantized, in
proportion to how the layer's inputs correlate (the Hessian ``H = Σ xᵀx`` of the
squared output error over calibration inputs ``x``), so the output ``x Wᵀ`` moves less
than the weights do. Per layer:

1. ``H`` from the calibration tokens (``collect_hessians``), damped by 1% of its mean
   diagonal; columns no input reached are zeroed.
2. Each group's scale and offset fixed up front from the original weights
   (``int4_mse.fit_int4_groups``, the same error-minimising search ``quantize_int4``
   uses: "static groups").
3. Columns in decreasing ``H`` diagonal ("act order": the columns with the largest
   inputs first, while the most columns remain to absorb their error), in blocks of 128
   with the lazy batch updates of the paper, using the upper Cholesky factor of
   ``H⁻¹``.

The result is an ``Int4Weight`` in houchu's ordinary format, so every int4 kernel runs
it unchanged. On the tiny trained families of tests/unit/test_family_quant_quality.py it
halves int4's mean |Δ log p| against the exact path (docs/benchmarks.md, "GPTQ").
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

import torch

from houchu.model.linear.dense import Linear, LinearBase
from houchu.model.llama import LlamaModel
from houchu.model.quant.functions import Int4Weight, QuantSpec, check_group_size
from houchu.model.quant.int4_mse import fit_int4_groups

#: damping added to H's diagonal, as a fraction of its mean (the reference's ``percdamp``)
DAMP = 0.01
#: columns per lazy-update block (the reference's ``blocksize``)
BLOCK = 128


def gptq_int4(
    w: torch.Tensor, hessian: torch.Tensor, group_size: int, damp: float = DAMP
) -> Int4Weight:
    """One weight's int4 codes by GPTQ (module docstring).

    Args:
        w: ``[N, K]`` float weight (any float dtype).
        hessian: ``[K, K]`` float32 ``Σ xᵀx`` of the layer's calibration inputs (any
            positive scale).
        group_size: 32, 64 or 128; must divide K.
        damp: diagonal damping as a fraction of the mean diagonal.
    Returns:
        ``Int4Weight`` (``[N, K]`` codes, ``[N, K / group_size]`` scales and offsets).
    Raises:
        ValueError: a bad group size, or ``hessian`` not ``[K, K]``.
        torch.linalg.LinAlgError: the damped Hessian is not positive definite (it is by
            construction unless it holds NaN or infinity).
    """
    n, k = w.shape
    check_group_size(k, group_size)
    if hessian.shape != (k, k):
        raise ValueError(f"Hessian {tuple(hessian.shape)} does not match a weight of K={k}")
    w = w.float().clone()  # [N, K]
    h = hessian.float().clone()  # [K, K]
    dead = torch.diag(h) == 0  # [K] columns no calibration input reached
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    _, scale, offset = fit_int4_groups(w.reshape(-1, group_size))
    scale = scale.reshape(n, k // group_size)  # [N, K/G]
    offset = offset.reshape(n, k // group_size)  # [N, K/G]
    perm = torch.argsort(torch.diag(h), descending=True)  # [K] act order
    w, h = w[:, perm], h[perm][:, perm]
    h += damp * torch.diag(h).mean() * torch.eye(k, device=h.device)
    hinv = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    group = perm // group_size  # [K] each permuted column's group
    q = torch.empty(n, k, dtype=torch.uint8, device=w.device)  # [N, K] in the original column order
    for b0 in range(0, k, BLOCK):
        b1 = min(b0 + BLOCK, k)
        blk = w[:, b0:b1].clone()  # [N, B]
        err = torch.empty_like(blk)  # [N, B] scaled rounding errors
        hb = hinv[b0:b1, b0:b1]  # [B, B]
        for i in range(b1 - b0):
            s, o = scale[:, group[b0 + i]], offset[:, group[b0 + i]]  # [N] each
            code = ((blk[:, i] - o) / s).round_().clamp_(0, 15)  # [N]
            q[:, perm[b0 + i]] = code.to(torch.uint8)
            err[:, i] = (blk[:, i] - (code * s + o)) / hb[i, i]
            blk[:, i:] -= err[:, i : i + 1] * hb[i, i:]
        w[:, b1:] -= err @ hinv[b0:b1, b1:]
    return Int4Weight(q, scale, offset, group_size)


def collect_hessians(
    model: LlamaModel, ids: Sequence[int], window: int = 512, chunk: int = 128
) -> dict[str, torch.Tensor]:
    """``Σ xᵀx`` of every dense projection's inputs (the LM head's excepted) while the
    model reads ``ids``, in windows of ``window`` tokens from position 0 (each a
    sequence of its own), fed ``chunk`` tokens a step.

    Args:
        model: a dense model (``QuantSpec("none")``).
        ids: calibration token ids (at least 2).
        window, chunk: tokens per sequence and per step.
    Returns:
        module name -> ``[K, K]`` float32 (K: that layer's input width).
    Raises:
        ValueError: fewer than 2 ids.
    """
    from houchu.model.quant.calibration import feed_tokens

    if len(ids) < 2:
        raise ValueError("GPTQ needs at least 2 calibration tokens")
    sums: dict[str, torch.Tensor] = {}
    hooks = []
    for name, m in model.named_modules():
        if isinstance(m, Linear) and m is not model.lm_head:

            def add(_: torch.nn.Module, args: tuple[torch.Tensor, ...], name: str = name) -> None:
                x = args[0].reshape(-1, args[0].shape[-1]).float()  # [T, K]
                h = x.T @ x  # [K, K]
                sums[name] = sums[name] + h if name in sums else h

            hooks.append(m.register_forward_pre_hook(add))
    try:
        for start in range(0, len(ids), window):
            piece = list(ids[start : start + window])
            if len(piece) >= 2:
                feed_tokens(model, piece, chunk=chunk)
    finally:
        for hook in hooks:
            hook.remove()
    return sums


class GPTQResult(NamedTuple):
    """What ``quantize_model_gptq`` did: ``quantized`` projections by GPTQ, ``rounded``
    ones rounded as ``quantize_int4`` does (no calibration token reached them: a routed
    expert the router never picked, say)."""

    quantized: int
    rounded: int


def quantize_model_gptq(
    model: LlamaModel, ids: Sequence[int], quant: QuantSpec, prepack: bool = True
) -> GPTQResult:
    """Turn a dense model (built with ``QuantSpec("none")`` and ``prepack=False``) into
    ``quant``'s int4 model, every projection but the LM head by GPTQ over ``ids``
    (``collect_hessians``); a layer no calibration token reached rounds as
    ``quantize_int4`` does.

    Returns:
        how many projections GPTQ quantized and how many were rounded.
    Raises:
        ValueError: ``quant`` is not int4, or fewer than 2 ids.
    """
    from houchu.model.linear.factory import make_linear

    if quant.mode != "int4":
        raise ValueError(f"GPTQ makes int4 weights, not {quant.mode}")
    hessians = collect_hessians(model, ids)
    dev = model.embed.device
    rounded = 0

    def make(name: str, layer: Linear) -> LinearBase:
        nonlocal rounded
        assert layer.weight is not None
        h = hessians.pop(name, None)
        if h is None:
            rounded += 1
            return make_linear(layer.weight.data, quant, dev, dtype=model.dtype)
        return make_linear(gptq_int4(layer.weight.data, h, quant.group_size), quant, dev)

    count = len(hessians)
    model.quantize_linears(quant, make, prepack)
    return GPTQResult(count, rounded)
