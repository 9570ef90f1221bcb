"""Parts of the Gemma 2/3 decoder block (Gemma Team 2024, 2025) beside the Llama ones:
the (1 + w) RMSNorm, the GeLU-tanh gated MLP (GeGLU, Shazeer 2020), and tanh
soft-capping. Numerics follow Hugging Face's ``Gemma2RMSNorm`` / ``Gemma3RMSNorm``
(normalization and weight multiply in float32, then cast) and ``gelu_pytorch_tanh``.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from houchu.model.ops import TorchOps


class OffsetRMSNorm(nn.Module):
    """Gemma's RMSNorm: ``x / sqrt(mean(x²) + eps) * (1 + w)``, all in float32, then cast
    to x's dtype.

    Args:
        weight: ``[N]`` the checkpoint's w (Hugging Face stores w, not 1 + w).
        eps: epsilon inside the square root.
    """

    def __init__(self, weight: torch.Tensor, eps: float) -> None:
        super().__init__()
        # [N] float32: 1 + w, as HF computes it on every call
        self.weight = nn.Parameter(1.0 + weight.float(), requires_grad=False)
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """x: ``[R, N]`` -> ``[R, N]`` in x's dtype."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return (xf * self.weight).to(x.dtype)


def apply_norm(norm: nn.Module, x: torch.Tensor, ops: TorchOps) -> torch.Tensor:
    """``norm`` (an ``OffsetRMSNorm``, or Llama's RMSNorm through the kernel set ``ops``)
    applied to x ``[R, N]`` -> ``[R, N]``."""
    if isinstance(norm, OffsetRMSNorm):
        return norm(x)
    return ops.rms_norm(x, norm.weight, norm.eps)


def gelu_tanh_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """GeGLU's gating with the tanh GeLU. gate_up: ``[N, 2I]`` (gate | up) -> ``[N, I]``:
    ``gelu_tanh(gate) * up``."""
    gate, up = gate_up.chunk(2, dim=-1)
    return F.gelu(gate, approximate="tanh") * up


def softcap(x: torch.Tensor, cap: float) -> torch.Tensor:
    """``cap * tanh(x / cap)`` (Gemma 2's logit soft-capping); x unchanged when cap is 0."""
    return torch.tanh(x / cap) * cap if cap else x
