"""Fused decode layers for the CPU: a whole Llama layer in one C++ call.

At batch 1 a decoder layer is ten small kernels of 5-40 µs each, and the per-op path
pays about as much again around them (operator dispatch, thread-team wake-ups,
allocations). ``torch.ops.houchu_cpu.decode_layer`` (``cpu_kernels/decode_layer.cpp``)
runs the layer's norms, projections, RoPE, KV store, attention and MLP in one parallel
region with the per-op path's own kernels and roundings, so its output equals the
per-op path bit for bit.

It applies to a step whose rows all decode (one new token each) when every projection of
the model runs on houchu's int4/int8 GEMV at that row count (weight-only int4 or int8, or
W8A8 below its GEMM threshold; see ``LinearBase.gemv_blob``) and the KV pool holds the
model dtype (an int8 or fp8 pool takes the per-op path). Turned off with
``ModelRunner(fused_layers=False)`` / ``serve --disable-fused-layers``.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from houchu.gpu.attention import _TorchMeta
from houchu.gpu.batch import StepBatch
from houchu.gpu.kv_pool import KVPool

LayerFn = Callable[[int, torch.Tensor, torch.Tensor, torch.Tensor], torch.Tensor]


class FusedDecode:
    """Per-step binding of the fused layer kernel to a model (see the module docstring).

    Args:
        model: a ``houchu.gpu.llama.LlamaModel`` on the CPU, with the C++ kernels loaded.
    """

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self._weights: dict[int, list[tuple] | None] = {}  # rows -> per-layer arguments
        self.steps = 0  # decode steps that ran fused

    def _layer_weights(self, rows: int) -> list[tuple] | None:
        """Per layer ``(in_norm, post_norm, blobs, group_sizes, out_features)`` when every
        projection runs on the C++ GEMV at ``rows`` rows, else None (memoized)."""
        if rows not in self._weights:
            self._weights[rows] = self._collect(rows)
        return self._weights[rows]

    def _collect(self, rows: int) -> list[tuple] | None:
        out, acts = [], set()
        for layer in self.model.layers:
            lins = (layer.qkv, layer.o_proj, layer.gate_up, layer.down)
            blobs = [lin.gemv_blob(rows) for lin in lins]
            if any(b is None for b in blobs) or layer.gate_up.out_features % 32:
                return None
            acts |= {lin.act_dtype for lin in lins}
            out.append(
                (
                    layer.input_norm.weight,
                    layer.post_norm.weight,
                    [b[0] for b in blobs],
                    [b[1] for b in blobs],
                    [lin.out_features for lin in lins],
                )
            )
        if len(acts) != 1:
            return None
        self.act_dtype = acts.pop()
        return out

    def bind(self, batch: StepBatch, pool: KVPool, meta: object) -> LayerFn | None:
        """``fn(layer, x [B, hidden], cos [B, 1, D], sin [B, 1, D]) -> [B, hidden]`` for
        this step, or None when the fused kernel does not apply to it."""
        model = self.model
        if not isinstance(meta, _TorchMeta) or not meta.all_decode or meta.decode_pages is None:
            return None
        if pool.quantized or pool.k.dtype != model.dtype:
            return None
        weights = self._layer_weights(batch.num_tokens)
        if weights is None:
            return None
        eps, scale = model.cfg.rms_norm_eps, 1.0 / math.sqrt(model.cfg.head_dim)
        pages, lens, act = meta.decode_pages, meta.decode_lens, self.act_dtype
        kernel = torch.ops.houchu_cpu.decode_layer
        self.steps += 1

        def run(i: int, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
            in_norm, post_norm, blobs, groups, outs = weights[i]
            return kernel(
                x, cos, sin, in_norm, post_norm, eps, *blobs, groups, outs, act,
                pool.k[i], pool.v[i], pages, lens, scale,
            )  # fmt: skip

        return run
