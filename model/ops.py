"""The model's elementwise and normalization kernels, chosen once at startup.

``TorchOps`` is the reference: plain torch ops with Hugging Face's numerics (RMSNorm in
float32, cast back before the weight multiply; rotate-half RoPE in the model dtype), so
the exact path matches transformers. ``houchu.gpu.triton.ops.TritonOps`` implements the
same interface with fused Triton kernels (one pass over memory per op) for CUDA; on the
CPU, ``CpuOps`` calls houchu's C++ kernels (``houchu.cpu.kernels``: one dispatch per
op where the reference takes 3-8), and ``torch.compile`` can fuse the torch ops instead
(``houchu.cpu.compiled``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from houchu.cpu import kernels as cpu_kernels
from houchu.model.rope import apply_rope


class TorchOps:
    """Reference kernels on torch ops (any device)."""

    name = "torch"

    @staticmethod
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        """RMSNorm (Zhang & Sennrich 2019). x: ``[N, hidden]``, w: ``[hidden]`` ->
        ``[N, hidden]`` in x's dtype: ``w * (x / sqrt(mean(x²) + eps))`` with the
        normalization in float32."""
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return w * xf.to(x.dtype)

    @classmethod
    def add_rms_norm(
        cls, x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Residual add then RMSNorm. x, delta: ``[N, hidden]`` -> ``(normed, x + delta)``,
        both ``[N, hidden]`` in x's dtype."""
        s = x + delta
        return cls.rms_norm(s, w, eps), s

    @staticmethod
    def rope(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Rotate queries ``[T, H, D]`` and keys ``[T, Hkv, D]`` by their positions
        (``cos``, ``sin``: ``[T, 1, D]`` from ``rope_cos_sin``); returns new tensors."""
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        """SwiGLU's gating (Shazeer 2020). gate_up: ``[N, 2I]`` (gate | up) -> ``[N, I]``:
        ``silu(gate) * up``."""
        gate, up = gate_up.chunk(2, dim=-1)
        return F.silu(gate) * up


_CPU_DTYPES = (torch.float32, torch.bfloat16)


class CpuOps(TorchOps):
    """The same kernels fused in C++ for the CPU (``torch.ops.houchu_cpu``; float32 and
    bfloat16, anything else runs the torch reference). Same numerics as ``TorchOps`` up
    to float32 summation order in the RMS. Needs ``houchu.cpu.kernels.load()``
    first."""

    name = "cpu"

    @staticmethod
    def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
        if x.dtype in _CPU_DTYPES and x.stride(-1) == 1:
            return cpu_kernels.ops().rms_norm(x, w, eps)
        return TorchOps.rms_norm(x, w, eps)

    @classmethod
    def add_rms_norm(
        cls, x: torch.Tensor, delta: torch.Tensor, w: torch.Tensor, eps: float
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dtype in _CPU_DTYPES and x.stride(-1) == 1 and delta.stride(-1) == 1:
            return cpu_kernels.ops().add_rms_norm(x, delta, w, eps)
        return TorchOps.add_rms_norm(x, delta, w, eps)

    @staticmethod
    def rope(
        q: torch.Tensor, k: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        if q.dtype in _CPU_DTYPES:
            return cpu_kernels.ops().rope(q, k, cos, sin)
        return TorchOps.rope(q, k, cos, sin)

    @staticmethod
    def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
        if gate_up.dtype in _CPU_DTYPES and gate_up.stride(-1) == 1:
            return cpu_kernels.ops().silu_mul(gate_up)
        return TorchOps.silu_mul(gate_up)
