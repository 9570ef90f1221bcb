"""The tensor-parallel collectives' backend follows the device: gloo on the CPU, NCCL on
CUDA (refused with a clear error where torch has no NCCL)."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from houchu.runner.tensor_parallel.group import backend_for


def test_backend_follows_the_device():
    assert backend_for(torch.device("cpu")) == "gloo"
    cuda = torch.device("cuda", 1)
    if dist.is_nccl_available():
        assert backend_for(cuda) == "nccl"
    else:
        with pytest.raises(RuntimeError, match="needs torch built with NCCL"):
            backend_for(cuda)
