"""Whether houchu's Triton kernels run here: the package installed, a CUDA device (or
Triton's interpreter), and one tiny kernel compiled and launched there, once per device."""

from __future__ import annotations

import functools
import importlib.util
import os
from collections.abc import Callable

import torch

from houchu.model.ops import TorchOps


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
