"""Linear layers. ``Linear`` is a dense ``y = x Wᵀ`` that, on CPU, can swap its weight
for oneDNN's prepacked layout (``prepack_onednn``): the same arithmetic, blocked for the
matmul kernel. On the benchmark machine (AMD EPYC, AVX2, MKL) this made the projection
matmuls of SmolLM2-135M about 20% faster at 1 row and 45% faster at 4-8 rows (batched
decode) than ``F.linear``, whose thin-matrix path is slow there.

Every linear layer (this one and the quantized ones in ``houchu.model.linear.quantized``) derives
from ``LinearBase`` and reports the bytes its weights cost per forward pass, for the
lever ledger.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


@functools.cache
def onednn_available(dtype: torch.dtype) -> bool:
    """Whether oneDNN's prepacked linear works for ``dtype`` on this CPU (probed once)."""
    if dtype not in (torch.float32, torch.bfloat16) or not torch.backends.mkldnn.is_available():
        return False
    try:
        with torch.inference_mode():
            w = torch.randn(24, 16).to(dtype)
            x = torch.randn(3, 16).to(dtype)
            packed = torch.ops.mkldnn._reorder_linear_weight(w)
            y = torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")
            return bool(torch.allclose(y.float(), F.linear(x, w).float(), atol=0.05, rtol=0.02))
    except (RuntimeError, AttributeError):
        return False


@torch.library.custom_op("houchu::onednn_linear", mutates_args=())
def onednn_linear(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """oneDNN linear on a prepacked weight, as an opaque op so ``torch.compile`` calls it
    instead of lowering it (Inductor cannot lower an already-packed weight).

    x: ``[N, in]`` float32/bfloat16 -> ``[N, out_features]``, same dtype.
    """
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


@onednn_linear.register_fake
def _(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    return x.new_empty(x.shape[0], out_features)


def packed_matmul(x: torch.Tensor, packed: torch.Tensor, out_features: int) -> torch.Tensor:
    """``x Wᵀ`` with W in oneDNN's prepacked layout (``torch.ops.mkldnn._reorder_linear_weight``).

    x: ``[N, in]`` float32/bfloat16 (the packed weight's dtype) -> ``[N, out_features]``.
    """
    if torch.compiler.is_compiling():
        return onednn_linear(x, packed, out_features)
    return torch.ops.mkldnn._linear_pointwise(x, packed, None, "none", [], "")


class LinearBase(nn.Module):
    """A bias-free projection ``[N, in_features] -> [N, out_features]``.

    Subclasses set ``out_features``, ``in_features`` and ``kind`` (a short label such as
    "fp32", "int4-g32") and implement ``forward`` and ``weight_bytes``.
    """

    kind = "dense"
    out_features: int
    in_features: int

    def weight_bytes(self) -> int:
        """Bytes of weight data the kernel reads per forward pass at decode batch sizes
        (codes plus scales), the number the lever ledger charges per step."""
        raise NotImplementedError

    def weight_bytes_at(self, rows: int) -> int:
        """Bytes of weight data read by a forward pass of ``rows`` rows (a layer that
        switches kernels by row count reads different copies)."""
        return self.weight_bytes()

    def bf16_bytes(self) -> int:
        """What the same weight costs in bfloat16 (bytes), the ledger's baseline."""
        return 2 * self.out_features * self.in_features

    def gemv_blob(self, rows: int) -> tuple[torch.Tensor, int] | None:
        """``(packed weight, int4 group size or 0 for int8)`` in houchu's C++ GEMV layout
        when a forward pass of ``rows`` rows runs on that kernel (CPU, kernels loaded),
        else None. The fused decode layer (``houchu.cpu.fused_layers``) reads it."""
        return None

    def forward_silu_mul(
        self, x: torch.Tensor, silu_mul: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        """``silu_mul(self(x))`` for a gate_up projection (gate and up outputs side by
        side): x ``[M, in_features]`` -> ``[M, out_features / 2]``, x's dtype. A layer
        whose epilogue can apply the activation itself overrides this (same values)."""
        return silu_mul(self(x))


class Linear(LinearBase):
    """Dense ``y = x Wᵀ`` without bias. weight: ``[out_features, in_features]``.

    After ``prepack_onednn()`` the dense parameter is dropped (``weight`` becomes None)
    and only oneDNN's opaque packed copy is kept.
    """

    def __init__(self, weight: torch.Tensor) -> None:
        super().__init__()
        self.out_features, self.in_features = weight.shape
        if not isinstance(weight, nn.Parameter):  # a shared Parameter stays one object
            weight = nn.Parameter(weight, requires_grad=False)
        self.weight: nn.Parameter | None = weight
        self._packed: torch.Tensor | None = None  # oneDNN blocked layout, opaque
        self._element_size = weight.element_size()
        self.kind = str(weight.dtype).removeprefix("torch.")
        #: batch-invariant mode (``houchu.runner.deterministic``): rows per matmul call,
        #: the last call zero-padded, so a row's sums do not depend on the row count
        self.row_tile: int | None = None

    def prepack_onednn(self, keep_dense: bool = False) -> None:
        """Switch to oneDNN's prepacked weight (CPU, float32/bfloat16; check
        ``onednn_available`` first). ``keep_dense`` keeps the dense parameter too (for a
        weight shared with the embedding)."""
        if self.weight is None:
            raise RuntimeError("Linear.prepack_onednn called twice")
        self._packed = torch.ops.mkldnn._reorder_linear_weight(self.weight.data)
        if not keep_dense:
            self.weight = None

    def weight_bytes(self) -> int:
        return self.out_features * self.in_features * self._element_size

    def _matmul(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[N, in_features]`` -> ``[N, out_features]``, one call."""
        if self._packed is not None:
            return packed_matmul(x, self._packed, self.out_features)
        return F.linear(x, self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[N, in_features]`` -> ``[N, out_features]``, same dtype (with ``row_tile``
        in calls of exactly that many rows)."""
        if self.row_tile is None:
            return self._matmul(x)
        return tiled_rows(self._matmul, x, self.row_tile, self.out_features)


def tiled_rows(
    matmul: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, tile: int, out: int
) -> torch.Tensor:
    """``matmul(x)`` in calls of exactly ``tile`` rows (the last one zero-padded), so that
    each row gets the reduction order of a ``tile``-row call whatever ``x``'s row count
    (the batch-invariant matmul of Thinking Machines' "Defeating Nondeterminism in LLM
    Inference", 2025, by fixing the call shape instead of the kernel's strategy).

    x: ``[N, K]`` -> ``[N, out]``, matmul's dtype. Costs up to ``tile - 1`` padded rows
    per call sequence.
    """
    n = x.shape[0]
    pad = (-n) % tile
    if pad:
        x = torch.cat([x, x.new_zeros(pad, x.shape[1])])
    y = x.new_empty(n + pad, out)
    for r0 in range(0, n + pad, tile):
        y[r0 : r0 + tile] = matmul(x[r0 : r0 + tile])
    return y[:n]
