"""The registry of kernel sets and attention backends: which implementation a name means
on a device. It sits above every implementation (``houchu.model`` for the torch ones,
``houchu.cpu`` for the C++ ones, ``houchu.gpu`` for Triton and flash-attn), so the base
classes (``houchu.model.ops.TorchOps``, ``houchu.model.attention.base.AttentionBackend``)
never import their subclasses."""

from __future__ import annotations

import sys

import torch

from houchu.cpu import kernels as cpu_kernels
from houchu.cpu.attention import CpuBackend
from houchu.gpu.flash_attention import FlashAttentionBackend, flash_attn_usable
from houchu.gpu.triton.probe import TritonUnusable, triton_unusable
from houchu.model.attention.base import AttentionBackend
from houchu.model.attention.torch import TorchSDPABackend
from houchu.model.ops import CpuOps, TorchOps


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
        from houchu.gpu.triton.ops import TritonOps  # imports triton: only where asked for

        return TritonOps()
    raise ValueError(f"unknown kernel set {name!r} (torch, cpu or triton)")


def make_backend(
    name: str = "auto",
    device: torch.device | str = "cpu",
    *,
    page_size: int = 16,
    kv_dtype: str = "auto",
) -> AttentionBackend:
    """The attention backend called ``name``, checked against where it will run.

    "auto": on CUDA, flash-attn when installed and usable (page size a multiple of 256,
    unquantized KV), else Triton where it runs (``houchu.gpu.triton.probe.triton_unusable``:
    installed, and one tiny kernel compiled and launched there), else torch; on the CPU, houchu's C++
    kernels ("cpu") when they build here (``houchu.cpu.kernels``), else torch.
    ``ModelRunner`` decides CUDA's "auto" before (``houchu.runner.choices``, which
    also picks 256-token pages for flash-attn and says why it falls back), so only direct
    callers reach this branch on CUDA.

    Raises:
        ValueError: unknown name, or a combination the backend cannot serve.
        RuntimeError: its library is missing or cannot run on ``device`` (Triton:
            ``houchu.gpu.triton.probe.TritonUnusable``, one line saying why).
    """
    dev = torch.device(device)
    if name == "auto":
        name = "torch"
        if dev.type == "cuda":
            if flash_attn_usable(page_size, kv_dtype):
                name = "flash-attn"
            elif triton_unusable(dev) is None:  # installed, and its probe ran here
                name = "triton"
        elif dev.type == "cpu":
            why = cpu_kernels.unavailable_reason()
            if why is None:
                name = "cpu"
            else:
                print(f"houchu: {why}; attention runs on the torch backend", file=sys.stderr)
    if name in ("torch-sdpa", "torch"):
        return TorchSDPABackend()
    if name == "triton":
        why = triton_unusable(dev)
        if why is not None:
            raise TritonUnusable(f"--attention-backend triton cannot run on {dev}: {why}")
        from houchu.gpu.triton_attention import TritonBackend  # imports triton

        return TritonBackend()
    if name == "cpu":
        if dev.type != "cpu":
            raise ValueError(f"the cpu attention backend runs on the CPU, not {dev}")
        return CpuBackend()
    if name == "flash-attn":
        return FlashAttentionBackend(dev, page_size, kv_dtype)
    raise ValueError(f"unknown attention backend {name!r} (auto, torch, cpu, triton, flash-attn)")
