"""Fused decode layers for the CPU: all the Llama layers of a decode step in one C++ call.

At batch 1 a decoder layer is ten small kernels of 5-40 µs each, and the per-op path
pays about as much again around them (operator dispatch, thread-team wake-ups,
allocations). ``cpu_kernels.ops().decode_layers`` (``cpu_kernels/decode_layers.cpp``)
runs every layer's norms, projections, RoPE, KV store, attention and MLP in one
parallel region with the per-op path's own kernels and roundings, so its output equals
the per-op path bit for bit.

It applies to a step whose rows all decode (one new token each) when every projection of
the model runs on houchu's int4/int8 GEMV at that row count (weight-only int4 or int8, or
W8A8 below its GEMM threshold; see ``LinearBase.gemv_blob``) and the KV pool holds the
model dtype or int8 (an fp8 pool takes the per-op path). Turned off with
``RunnerOptions(disable_fused_layers=True)`` / ``serve --disable-fused-layers``.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch

from houchu.cpu import kernels as cpu_kernels
from houchu.model.attention.metadata import TorchMeta
from houchu.model.batch import StepBatch
from houchu.model.kv.pool import KVPool

LayersFn = Callable[..., torch.Tensor]


class FusedDecode:
    """Per-step binding of the fused layer kernel to a model (see the module docstring).

    Args:
        model: a ``houchu.model.llama.LlamaModel`` on the CPU, with the C++ kernels loaded.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._weights: dict[tuple[int, int], _Weights | None] = {}  # (rows, layers) ->
        self.steps = 0  # decode steps that ran fused
        #: float activations: the int4 GEMVs' batch-invariant sums, as the op-by-op
        #: layers' ``Int4Linear.batch_invariant`` (``autotune.invariant_where_free``)
        self.batch_invariant = False

    def _layer_weights(self, rows: int, layers: int) -> _Weights | None:
        """The kernel's weight arguments for the first ``layers`` layers when every
        projection runs on the C++ GEMV at ``rows`` rows, else None (memoized)."""
        key = (rows, layers)
        if key not in self._weights:
            self._weights[key] = _collect(self.model.layers[:layers], rows)
        return self._weights[key]

    def applies(self, rows: int) -> bool:
        """Whether a decode step of ``rows`` rows can run fused: every layer's projections
        have a C++ GEMV blob there (quantized weights; a dense float layer has none)."""
        return self._layer_weights(rows, len(self.model.layers)) is not None

    def bind(self, batch: StepBatch, pool: KVPool, meta: object) -> LayersFn | None:
        """``fn(layers, x [B, hidden], cos [B, 1, D], sin [B, 1, D], head=False)``, which
        runs the first ``layers`` layers of this step and returns ``[B, hidden]``, or with
        ``head`` (all layers, every row sampled) the final norm and LM head too and returns
        ``[B, vocab]`` float32 logits; None when the fused kernel does not apply."""
        model = self.model
        if not isinstance(meta, TorchMeta) or not meta.all_decode or meta.decode_pages is None:
            return None
        int8_pool = pool.quantized and pool.k.dtype == torch.int8
        if pool.k.dtype != model.dtype and not int8_pool:
            return None
        scales = {"k_scale": pool.k_scale, "v_scale": pool.v_scale} if int8_pool else {}
        rows = batch.num_tokens
        route = getattr(model, "route", None)  # the measured decode paths (gpu.autotune)
        path = route.path_for(rows) if route is not None else None
        if path not in (None, "fused", "fused-a8"):
            return None
        # int8 activations in the int4 linears: the route's "fused-a8", else the option
        a8 = path == "fused-a8" if path is not None else model.quant.int4_activations == "int8"
        flags = {"int8_acts": a8, "batch_invariant": self.batch_invariant and not a8}
        if self._layer_weights(rows, len(model.layers)) is None:
            return None
        eps, scale = model.cfg.rms_norm_eps, 1.0 / math.sqrt(model.cfg.head_dim)
        pages, lens = meta.decode_pages, meta.decode_lens
        kernel = cpu_kernels.ops().decode_layers
        self.steps += 1

        def run(
            layers: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, head: bool = False
        ) -> torch.Tensor:
            w = self._layer_weights(rows, layers)
            assert w is not None  # a prefix of layers that all apply
            args = (
                x,
                cos,
                sin,
                w.norms,
                eps,
                w.linears,
                w.group_sizes,
                w.out_features,
                w.act_dtype,
                pool.k,
                pool.v,
                pages,
                lens,
                scale,
            )
            blob = self._head(rows, w.act_dtype) if head else None
            if blob is None:
                x = kernel(*args, **scales, **flags)
                return model.head(x) if head else x
            return kernel(
                *args,
                model.norm.weight,
                blob[0],
                blob[1],
                model.cfg.vocab_size,
                **scales,
                **flags,
            )

        return run

    def _head(self, rows: int, act_dtype: torch.dtype) -> tuple[torch.Tensor, int] | None:
        """The LM head's GEMV blob and group size when it runs on the C++ GEMV at ``rows``
        rows with the layers' activation dtype, else None."""
        lm = self.model.lm_head
        blob = lm.gemv_blob(rows)
        return blob if blob is not None and lm.act_dtype == act_dtype else None


class _Weights(NamedTuple):
    """``decode_layers``' per-layer arguments, flattened in layer order."""

    norms: list[torch.Tensor]  # 2 per layer: input norm, post-attention norm, [hidden]
    linears: list[torch.Tensor]  # 4 per layer: qkv, o_proj, gate_up, down GEMV blobs
    group_sizes: list[int]  # 4 per layer: int4 group size, 0 for int8
    out_features: list[int]  # 4 per layer
    act_dtype: torch.dtype  # the linears' activation dtype (one for all)


def _collect(layers: Sequence[torch.nn.Module], rows: int) -> _Weights | None:
    """The arguments for ``layers`` at ``rows`` rows, or None when one of the projections
    has no GEMV blob there, a gate_up is not a multiple of 32 wide, the linears differ
    in activation dtype, or a block is not a plain Llama block (a projection bias,
    QK-norm or MoE, which the fused layers do not compute)."""
    norms, linears, groups, outs, acts = [], [], [], [], set()
    for layer in layers:
        if layer.moe is not None or layer.qkv_bias is not None or layer.o_bias is not None:
            return None
        if layer.q_norm is not None:
            return None
        lins = (layer.qkv, layer.o_proj, layer.gate_up, layer.down)
        blobs = [lin.gemv_blob(rows) for lin in lins]
        if any(b is None for b in blobs) or layer.gate_up.out_features % 32:
            return None
        acts |= {lin.act_dtype for lin in lins}
        norms += [layer.input_norm.weight, layer.post_norm.weight]
        linears += [b[0] for b in blobs]
        groups += [b[1] for b in blobs]
        outs += [lin.out_features for lin in lins]
    if len(acts) != 1:
        return None
    return _Weights(norms, linears, groups, outs, acts.pop())
