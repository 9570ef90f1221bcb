"""``--device``: where the model runs.

``check_device_name`` checks the spelling without torch (the launcher, before anything
starts); ``resolve_device`` turns "auto" into a device and checks that torch can use a
CUDA one (the CLI for ``cuda``, before the actors start; ``ModelRunner`` always);
``make_current`` makes a "cuda:N" the thread's current device (``ModelRunner``, on the
thread that then runs its steps).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

#: What ``--device`` accepts.
DEVICE_NAMES = re.compile(r"auto|cpu|cuda(:\d+)?")


class DeviceError(ValueError):
    """A device that is misspelt, or that torch cannot use here."""


def check_device_name(name: str) -> None:
    """Raises:
    DeviceError: ``name`` is not "auto", "cpu", "cuda" or "cuda:N"."""
    if not DEVICE_NAMES.fullmatch(name):
        raise DeviceError(f"--device must be auto, cpu, cuda or cuda:N, got {name!r}")


def resolve_device(name: str) -> str:
    """The device ``name`` means here: "auto" is "cuda" when torch sees a CUDA GPU, else
    "cpu"; "cpu", "cuda" and "cuda:N" are themselves.

    Raises:
        DeviceError: a misspelt name, or a CUDA device torch does not see (no GPU, a
            torch built without CUDA, or N past the last GPU); the message is one line.
    """
    check_device_name(name)
    if name == "cpu":
        return name
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if name == "auto":
        return "cuda" if count else "cpu"
    index = int(name.partition(":")[2] or 0)
    if count == 0:
        build = "built without CUDA" if torch.version.cuda is None else f"CUDA {torch.version.cuda}"
        raise DeviceError(
            f"--device {name}: torch sees no CUDA GPU (torch {torch.__version__}, {build})"
        )
    if index >= count:
        raise DeviceError(f"--device {name}: torch sees {count} CUDA GPU(s), cuda:0..{count - 1}")
    return name


def cuda_index(device: str | torch.device) -> int | None:
    """The GPU index to make current for ``device``: N for "cuda:N", None for the CPU and
    for "cuda" without an index (torch's current device, left as it is)."""
    import torch

    dev = torch.device(device)
    return dev.index if dev.type == "cuda" else None


def make_current(device: str | torch.device) -> torch.device:
    """``device`` as a ``torch.device``, made this thread's current CUDA device when it
    names a GPU's index (``cuda_index``): CUDA graph capture, Triton launches and the
    caching allocator's streams go to the current device, not to the tensors' one.

    Raises:
        RuntimeError: torch cannot select that GPU.
    """
    import torch

    index = cuda_index(device)
    if index is not None:
        torch.cuda.set_device(index)
    return torch.device(device)
