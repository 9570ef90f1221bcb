"""Building a model's linear layers: ``make_linear`` picks the layer class for a weight
under a ``QuantSpec`` (dense, weight-only int4 / int8, W8A8), and ``fuse_weights`` stacks
projection weights (q/k/v, gate/up) so one GEMV reads them all.
"""

from __future__ import annotations

import torch

from houchu.model.linear.dense import Linear, LinearBase
from houchu.model.linear.quantized import Int4Linear, Int8Linear
from houchu.model.linear.w8a8 import W8A8Linear
from houchu.model.quant.functions import Int4Weight, QuantSpec, quantize_int4


def make_linear(
    w: torch.Tensor | Int4Weight,
    spec: QuantSpec,
    device: torch.device | str = "cpu",
    *,
    dtype: torch.dtype = torch.float32,
    head: bool = False,
) -> LinearBase:
    """The linear layer for weight ``w`` under ``spec``.

    Args:
        w: ``[N, K]`` dense weight (in the model dtype), or an ``Int4Weight`` (a GGUF
            Q4 tensor kept quantized).
        spec: the quantization spec.
        device: where the layer runs.
        dtype: the model dtype (that of a dense layer made from an ``Int4Weight``).
        head: the LM head, which stays int8 under "int4" (the logits are the most
            error-sensitive matmul; llama.cpp's Q4 files likewise keep it at 6-8 bits),
            or, a GGUF head kept as stored (``Int4Weight.kind``) of a vocabulary that is
            a multiple of 16 (torch's int4 packing), that: an ``Int4Linear`` with
            float32 logits.
    Returns:
        ``Linear`` (mode "none"), ``Int4Linear``, ``Int8Linear`` or ``W8A8Linear``.
    Raises:
        ValueError: a group size that does not divide K.
    """
    mode = spec.mode
    if head and mode == "int4" and isinstance(w, Int4Weight) and w.kind and w.shape[0] % 16 == 0:
        # a GGUF head as stored (lossless), float32 logits, no dense copy (prefill
        # needs the last rows' logits only)
        return Int4Linear(w, device, dense_min_rows=None, activations="float", float_out=True)
    if isinstance(w, Int4Weight) and (mode != "int4" or head):
        w = w.dequantize(dtype)
    if mode == "none":
        return Linear(w)
    if mode in ("w8a8", "int8") or head:
        if mode == "w8a8":
            layer: Int8Linear = W8A8Linear(w, device)
        else:
            layer = Int8Linear(w, device)
        layer.float_out = head  # the logits stay float32
        return layer
    method = "mse" if spec.int4_method == "gptq" else spec.int4_method  # GPTQ: gptq.py
    q = w if isinstance(w, Int4Weight) else quantize_int4(w, spec.group_size, method)
    return Int4Linear(q, device, activations=spec.int4_activations)


def fuse_weights(
    parts: list[torch.Tensor | Int4Weight], dtype: torch.dtype
) -> torch.Tensor | Int4Weight:
    """Stack projection weights row-wise (q/k/v, gate/up). int4 parts whose group sizes
    divide one another stay int4 (``Int4Weight.cat``: in the smallest groups, the most
    planes); a mix with dense parts is dequantized to dense ``dtype`` first (and
    requantized, if the spec asks, by ``make_linear``).

    parts: ``[N_i, K]`` each -> ``[sum N_i, K]``.
    """
    if all(isinstance(p, Int4Weight) for p in parts):
        groups = sorted({p.group_size for p in parts})  # type: ignore[union-attr]
        if all(g % groups[0] == 0 for g in groups):  # regrouped to the smallest, losslessly
            return Int4Weight.cat(parts)  # type: ignore[arg-type]
    dense = [p.dequantize(dtype) if isinstance(p, Int4Weight) else p for p in parts]
    return torch.cat(dense)
