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

import functools
import importlib.util
import os
from collections.abc import Callable

import torch
import torch.nn.functional as F

from houchu.cpu import kernels as cpu_kernels
from houchu.model.rope import apply_rope


@functools.cache
def triton_available() -> bool:
    """Whether the ``triton`` package is installed (not whether it runs: ``triton_unusable``)."""
    return importlib.util.find_spec("triton") is not None


class TritonUnusable(RuntimeError):
    """Houchu's Triton kernels were asked for where they cannot run; the message says why,
    in one line (the runner actor prints it without a traceback)."""


def triton_probe_launch(device: torch.device) -> None:
    """Compile and launch one tiny Triton kernel on the CUDA ``device`` (houchu's RMSNorm
    of a ``[2, 64]`` float32 tensor), wait for it and check it against the torch
    reference.

    Raises:
        Exception: whatever importing Triton, compiling or launching raises;
            RuntimeError when the kernel's values are wrong.
    """
    from houchu.gpu.triton.ops import TritonOps

    with torch.cuda.device(device):
        x = torch.linspace(-2.0, 2.0, 128, device=device).reshape(2, 64)  # [2, 64] float32
        w = torch.full((64,), 0.5, device=device)  # [64] float32
        got = TritonOps.rms_norm(x, w, 1e-6)
        torch.cuda.synchronize(device)
    if not torch.allclose(got, TorchOps.rms_norm(x, w, 1e-6), rtol=1e-4, atol=1e-5):
        raise RuntimeError("the probe kernel (RMSNorm) computed wrong values")


@functools.cache
def _triton_probe(device: str, launch: Callable[[torch.device], None]) -> str | None:
    """``launch(device)``'s failure in one line (type and message, at most 300
    characters), or None when it ran; once per device, launch and process."""
    try:
        launch(torch.device(device))
    except Exception as exc:  # noqa: BLE001 (any failure means: do not use Triton here)
        return " ".join(f"{type(exc).__name__}: {exc}".split())[:300]
    return None


def triton_unusable(
    device: torch.device | str, launch: Callable[[torch.device], None] = triton_probe_launch
) -> str | None:
    """Why houchu's Triton kernels cannot run on ``device``, in one line (None: they can):
    the package is not installed; the device is not a CUDA one (and Triton's interpreter,
    ``TRITON_INTERPRET=1``, is off); or, on a CUDA device, the probe ``launch`` (compile
    and launch one tiny kernel there: ``triton_probe_launch``) failed. The probe runs once
    per device and process."""
    if not triton_available():
        return "the triton package is not installed (pip install triton)"
    dev = torch.device(device)
    if dev.type != "cuda":
        if os.environ.get("TRITON_INTERPRET") == "1":
            return None
        return "Triton kernels need a CUDA device (or TRITON_INTERPRET=1 for the interpreter)"
    return _triton_probe(str(dev), launch)


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


def make_ops(name: str, device: torch.device) -> TorchOps:
    """The kernel set ``name`` ("torch", "cpu" or "triton") for ``device``.

    Raises:
        ValueError: unknown name.
        TritonUnusable: "triton" where Triton cannot run (``triton_unusable``: not
            installed, no CUDA device and no interpreter, or its probe failed).
        RuntimeError: "cpu" off the CPU or where the C++ kernels cannot be built
            (``houchu.cpu.kernels.CpuKernelsUnavailable``).
    """
    if name == "torch":
        return TorchOps()
    if name == "cpu":
        if torch.device(device).type != "cpu":
            raise RuntimeError(f"the cpu kernel set runs on the CPU, not {device}")
        cpu_kernels.load()
        return CpuOps()
    if name == "triton":
        why = triton_unusable(device)
        if why is not None:
            raise TritonUnusable(f"Triton kernels cannot run on {device}: {why}")
        from houchu.gpu.triton.ops import TritonOps

        return TritonOps()
    raise ValueError(f"unknown kernel set {name!r} (torch, cpu or triton)")
